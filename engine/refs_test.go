package engine_test

import (
	"bytes"
	"testing"

	"kvtier/chunk"
	"kvtier/engine"
)

// fillRAM commits n chunks of size bytes under fresh keys, evicting
// whatever RAM chunk nothing references.
func fillRAM(t *testing.T, e *engine.Engine, n, size int, salt byte) {
	t.Helper()
	var w engine.Writes
	for i := 0; i < n; i++ {
		w.Begin(e)
		if _, err := w.Reserve(chunk.Key{Scope: 9, Hash: chunk.Hash{salt, byte(i)}}, size); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCommitHeldSurvivesEviction: the hold CommitHeld returns is taken
// before the commit lets the writer's reference go, so RAM filled right
// after cannot evict the chunk; once released it is an ordinary chunk.
func TestCommitHeldSurvivesEviction(t *testing.T) {
	const size = 128 << 10
	e := open(t, 1<<20, "", true)
	key := chunk.Key{Scope: 9, Hash: chunk.Hash{1}}
	var w engine.Writes
	w.Begin(e)
	buf, err := w.Reserve(key, size)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xa5}, size)
	copy(buf, want)
	held, n, err := w.CommitHeld(nil)
	if err != nil || n != 1 || len(held) != 1 {
		t.Fatalf("CommitHeld: %d held, %v", n, err)
	}
	fillRAM(t, e, 32, size, 2) // four times the arena
	if !e.InRAM(key) {
		t.Fatal("a held chunk was evicted")
	}
	var r engine.Refs
	if !r.AcquireRAMKey(e, key) || !bytes.Equal(r.Bytes(0), want) {
		t.Fatal("the held chunk's bytes changed")
	}
	r.Release()

	// A second write of the key holds the object stored already.
	w.Begin(e)
	if _, err := w.Reserve(key, size); err != nil {
		t.Fatal(err)
	}
	held, n, err = w.CommitHeld(held)
	if err != nil || n != 1 || len(held) != 2 {
		t.Fatalf("CommitHeld of a stored key: %d held, %v", n, err)
	}
	e.Unhold(held[0])
	fillRAM(t, e, 32, size, 3)
	if !e.InRAM(key) {
		t.Fatal("the second hold did not keep the stored chunk")
	}
	e.Unhold(held[1])
	fillRAM(t, e, 32, size, 4)
	if e.InRAM(key) {
		t.Fatal("a chunk no longer held was never evicted")
	}
}
