package disk

import (
	"errors"
	"runtime"
	"sync"
	"testing"
)

// TestSyncerGroupCommit holds one flush open while five more callers
// arrive: all five must be covered by a single further flush.
func TestSyncerGroupCommit(t *testing.T) {
	var s syncer
	var mu sync.Mutex
	flushes := 0
	entered, release := make(chan struct{}, 10), make(chan struct{})
	s.flush = func(int) error {
		mu.Lock()
		flushes++
		first := flushes == 1
		mu.Unlock()
		if first {
			entered <- struct{}{}
			<-release
		}
		return nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.sync(0) })
	<-entered
	for range 5 {
		wg.Go(func() {
			if err := s.sync(0); err != nil {
				t.Error(err)
			}
		})
	}
	for { // until all five hold tickets
		s.mu.Lock()
		n := s.issued
		s.mu.Unlock()
		if n == 6 {
			break
		}
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	if flushes != 2 {
		t.Fatalf("%d flushes for one held flush and five waiting callers, want 2", flushes)
	}
}

func TestSyncerErrorSticks(t *testing.T) {
	var s syncer
	boom := errors.New("boom")
	calls := 0
	s.flush = func(int) error { calls++; return boom }
	if err := s.sync(0); !errors.Is(err, boom) {
		t.Fatalf("first sync: %v", err)
	}
	s.flush = func(int) error { calls++; return nil }
	if err := s.sync(0); !errors.Is(err, boom) || calls != 1 || !s.failed() {
		t.Fatalf("after a failed flush: %v, %d flushes", err, calls)
	}
}

func TestSegmentNames(t *testing.T) {
	for _, id := range []uint64{0, 1, 0xdeadbeef, 1<<64 - 1} {
		if got, ok := parseSegmentName(segmentName(id)); !ok || got != id {
			t.Fatalf("segment %d round-trips to %d, %v", id, got, ok)
		}
	}
	for _, name := range []string{"LOCK", "0.seg", "000000000000000g.seg", "0000000000000001.seg.tmp", "0000000000000001"} {
		if _, ok := parseSegmentName(name); ok {
			t.Fatalf("%q taken for a segment", name)
		}
	}
}
