//go:build race

package index

// raceEnabled: the race detector makes sync.Pool drop items, so allocation
// counts are only asserted without it.
const raceEnabled = true
