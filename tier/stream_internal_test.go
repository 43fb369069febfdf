package tier

import (
	"context"
	"testing"
)

// closed reports whether ch has been closed (a wakeup of its waiters).
func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A stream wakes its readers and LAYER_WAITs only when what they wait on
// changes: the layers ready in every usable chunk, the usable prefix, the
// end of the stream. A chunk getting ahead of the slowest one wakes nobody.
func TestStreamWakesOnlyOnChange(t *testing.T) {
	s := &Stream{geo: LayerGeometry{Layers: 8, Parts: 2}, done: make([]int, 3), usable: 3, changed: make(chan struct{})}
	ctx := context.Background()
	ch := s.changed
	s.progress(ctx, 1, 3, nil)
	s.progress(ctx, 2, 1, nil)
	if closed(ch) || s.ready != 0 {
		t.Fatalf("chunks 1 and 2 ahead of chunk 0: ready %d, waiters woken %v", s.ready, closed(ch))
	}
	s.progress(ctx, 0, 2, nil)
	if !closed(ch) || s.ready != 1 {
		t.Fatalf("chunk 0 at layer 2: ready %d (want 1), waiters woken %v", s.ready, closed(ch))
	}
	ch = s.changed
	s.progress(ctx, 0, 5, nil) // chunk 2 still holds ready at 1
	if closed(ch) || s.ready != 1 {
		t.Fatalf("chunk 0 ahead again: ready %d, waiters woken %v", s.ready, closed(ch))
	}
	s.fail(2) // the usable prefix shrinks, and with it the slowest chunk goes: ready 3
	if !closed(ch) || s.ready != 3 || s.usable != 2 {
		t.Fatalf("chunk 2 failed: ready %d usable %d, waiters woken %v", s.ready, s.usable, closed(ch))
	}
	ch = s.changed
	s.fail(2) // nothing changes
	if closed(ch) {
		t.Fatal("a second failure of the same chunk woke the waiters")
	}
	s.fail(1) // usable shrinks, ready (chunk 0's 5) changes too
	if !closed(ch) || s.usable != 1 || s.ready != 5 {
		t.Fatalf("chunk 1 failed: ready %d usable %d, waiters woken %v", s.ready, s.usable, closed(ch))
	}
}
