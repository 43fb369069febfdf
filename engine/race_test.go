//go:build race

package engine_test

// The race detector makes sync.Pool drop items on purpose, so allocation
// counts are meaningless under it.
const raceEnabled = true
