//go:build race

package tokenize

// raceEnabled: the race detector slows tiktoken-go's regex engine several
// times over, so the randomized tests run fewer cases under it.
const raceEnabled = true
