package disk

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// heldSched returns a one-worker scheduler whose worker is busy with a gate
// op until release is called, and the log of op offsets it ran since.
func heldSched(t *testing.T) (s *sched, release func(), ran func() []int64) {
	t.Helper()
	var mu sync.Mutex
	var order []int64
	started, gate := make(chan struct{}), make(chan struct{})
	s = newSched(1, blockSize, func(_ *worker, o *op) {
		if o.off < 0 { // the gate
			close(started)
			<-gate
		} else {
			mu.Lock()
			order = append(order, o.off)
			mu.Unlock()
		}
		o.done <- struct{}{}
	})
	g := &op{kind: opRead, off: -1, done: make(chan struct{}, 1)}
	s.submit(g)
	<-started
	release = func() { close(gate); <-g.done }
	ran = func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(order)
	}
	return s, release, ran
}

func TestSchedulerRunsReadsThenDeletesThenWrites(t *testing.T) {
	s, release, ran := heldSched(t)
	kinds := []opKind{opWrite, opPunch, opRead, opWrite, opRetire, opRead, opPunch, opRead}
	var ops []*op
	for i, k := range kinds {
		o := &op{kind: k, off: int64(i), done: make(chan struct{}, 1)}
		ops = append(ops, o)
		s.submit(o)
	}
	release()
	for _, o := range ops {
		<-o.done
	}
	s.close()
	// Reads 2, 5, 7; deletes 1, 4, 6; writes 0, 3 — each class in FIFO order.
	if got, want := ran(), []int64{2, 5, 7, 1, 4, 6, 0, 3}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

func TestSchedulerWithdrawsCanceledOps(t *testing.T) {
	s, release, ran := heldSched(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := &op{kind: opWrite, off: 1, done: make(chan struct{}, 1)}
	if err := s.do(ctx, o); !errors.Is(err, context.Canceled) {
		t.Fatalf("do with a canceled context while queued: %v", err)
	}
	keep := &op{kind: opWrite, off: 2, done: make(chan struct{}, 1)}
	s.submit(keep)
	release()
	<-keep.done
	s.close()
	if got := ran(); !slices.Equal(got, []int64{2}) {
		t.Fatalf("ran %v; the withdrawn op must not run", got)
	}
}

func TestSchedulerDrainsOnClose(t *testing.T) {
	s, release, ran := heldSched(t)
	for i := range 5 {
		s.submit(&op{kind: opPunch, off: int64(i), done: make(chan struct{}, 1)})
	}
	go release()
	s.close()
	if got := ran(); len(got) != 5 {
		t.Fatalf("close ran %d of 5 queued ops", len(got))
	}
}

func TestRingRemoveKeepsOrder(t *testing.T) {
	var r ring
	ops := make([]*op, 20)
	for i := range ops {
		ops[i] = &op{off: int64(i)}
	}
	for _, o := range ops[:12] { // wrap the ring around before removing
		r.push(o)
	}
	for range 6 {
		r.pop()
	}
	for _, o := range ops[12:] {
		r.push(o)
	}
	if !r.remove(ops[9]) || r.remove(ops[9]) || r.remove(ops[0]) {
		t.Fatal("remove reported the wrong presence")
	}
	var got []int64
	for o := r.pop(); o != nil; o = r.pop() {
		got = append(got, o.off)
	}
	want := []int64{6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
	if !slices.Equal(got, want) {
		t.Fatalf("popped %v, want %v", got, want)
	}
}
