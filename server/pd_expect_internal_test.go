package server

import (
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
)

// TestReadBeforeTheHoldEndsIt: a received chunk is visible from its
// commit on, and its hold is registered just after; a read in between
// ends that hold as soon as it is registered, giving its bytes back to the
// budget, instead of leaving them charged until the hold's deadline. A
// chunk read after its hold is registered ends it as before.
func TestReadBeforeTheHoldEndsIt(t *testing.T) {
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 16 << 20, Policy: "LRU", SaveUnfull: true})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	p := newPD(eng, 1<<20, "", nil, nil)
	defer p.close()
	const size = 4096
	receive := func(key chunk.Key, readBetween bool) {
		t.Helper()
		w := &waiter{wake: make(chan struct{}, 1)}
		if err := p.budget.acquire(context.Background(), size, time.Now().Add(time.Minute), w, false); err != nil {
			t.Fatal(err)
		}
		var wr engine.Writes
		wr.Begin(eng)
		if _, err := wr.Reserve(key, size); err != nil {
			t.Fatal(err)
		}
		p.expect(key)
		held, n, err := wr.CommitHeld(nil)
		if err != nil || n != 1 {
			t.Fatalf("commit: %d, %v", n, err)
		}
		if readBetween {
			p.consumed([]chunk.Key{key})
		}
		p.keepExpected(key, held[0], size, time.Minute)
	}
	early, late := chunk.Key{Scope: 1, Hash: chunk.Hash{1}}, chunk.Key{Scope: 1, Hash: chunk.Hash{2}}
	receive(early, true)
	if p.budget.used() != 0 || p.nheld.Load() != 0 || p.nexpect.Load() != 0 || len(p.expecting)+len(p.readEarly) != 0 {
		t.Fatalf("read before its hold: %d bytes charged, %d held, %d announced", p.budget.used(), p.nheld.Load(), p.nexpect.Load())
	}
	receive(late, false)
	if p.budget.used() != size || p.nheld.Load() != 1 {
		t.Fatalf("not read yet: %d bytes charged, %d held; want the chunk held", p.budget.used(), p.nheld.Load())
	}
	p.consumed([]chunk.Key{late})
	if p.budget.used() != 0 || p.nheld.Load() != 0 {
		t.Fatalf("read after its hold: %d bytes charged, %d held", p.budget.used(), p.nheld.Load())
	}
	// A read of a chunk nobody announced is nobody's early read.
	p.consumed([]chunk.Key{{Scope: 1, Hash: chunk.Hash{3}}})
	if len(p.readEarly) != 0 {
		t.Fatalf("%d early reads remembered for chunks no hold was announced for", len(p.readEarly))
	}
}

// TestInProgressReadersNoteNoEarlyRead: the readers that took a chunk
// while it arrived end its hold when it completes, but, its hold gone,
// note no early read for another push of the key in its commit window:
// that push's hold stays for its own reader.
func TestInProgressReadersNoteNoEarlyRead(t *testing.T) {
	p := newPD(nil, 1<<20, "", nil, nil)
	defer p.close()
	key := chunk.Key{Scope: 1, Hash: chunk.Hash{4}}
	p.expect(key) // another push of key, between its commit and its hold
	p.consumedInProgress(key, 1)
	if len(p.readEarly) != 0 {
		t.Fatalf("a reader of the chunk in progress noted %d early reads for another push", len(p.readEarly))
	}
	p.unexpect(key)
}
