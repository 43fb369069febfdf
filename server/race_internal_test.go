//go:build race

package server

// underRace says the race detector is on (it allocates): internal tests
// of allocations skip then.
const underRace = true
