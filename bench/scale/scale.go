// Package scale measures how kvtier's per-item costs grow with the number
// of items: metadata bytes per chunk in the RAM tier and the disk index,
// the disk tier's restart time per record (after a crash, after a clean
// stop, and with a full scan), lookup latency against the number of stored
// chunks, the router index's memory and score latency, and eviction cost
// per chunk under churn. `kvtier bench scale` runs it; docs/scale.md holds
// the figures.
package scale
