package engine_test

import (
	"testing"

	"kvtier/chunk"
	"kvtier/engine"
)

// TestWritesSkipKeepsTheRun: a chained batch that skips a cached chunk
// (Skip) commits the rest as a run, holds the skipped chunk too in
// CommitHeld, and gives back only real reservations on Abort.
func TestWritesSkipKeepsTheRun(t *testing.T) {
	const size = 64 << 10
	e := open(t, 1<<20, "", true)
	k := func(i byte) chunk.Key { return chunk.Key{Scope: 9, Hash: chunk.Hash{7, i}} }
	var w engine.Writes
	w.Begin(e)
	w.After(chunk.Key{}, false)
	if _, err := w.Reserve(k(0), size); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}

	w.Begin(e)
	w.After(chunk.Key{}, false)
	w.Skip(k(0))
	if _, err := w.Reserve(k(1), size); err != nil {
		t.Fatal(err)
	}
	held, n, err := w.CommitHeld(nil)
	if err != nil || n != 2 || len(held) != 2 {
		t.Fatalf("CommitHeld after a skipped chunk: %d held, %v", n, err)
	}
	for _, h := range held {
		e.Unhold(h)
	}
	if !e.InRAM(k(0)) || !e.InRAM(k(1)) {
		t.Fatal("the run is not in RAM")
	}

	w.Begin(e)
	w.After(k(1), true)
	w.Skip(k(0))
	if _, err := w.Reserve(k(2), size); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if e.InRAM(k(2)) || !e.InRAM(k(0)) {
		t.Fatalf("after Abort: the aborted chunk in RAM %v, the skipped one %v", e.InRAM(k(2)), e.InRAM(k(0)))
	}
}
