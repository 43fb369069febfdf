package tier_test

import (
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

// Two stalled lower tiers with full queues: Store must return after about
// WriteWait per tier, not block until a tier drains.
func TestReviewSharedTimerBlocksForever(t *testing.T) {
	ram := newRAM(t, 16<<20)
	s1 := &stallTier{Tier: newRAM(t, 16<<20), release: make(chan struct{})}
	s2 := &stallTier{Tier: newRAM(t, 16<<20), release: make(chan struct{})}
	m, _ := tier.NewManager(ram, []tier.Tier{s1, s2}, tier.Options{QueueDepth: 1, Writers: 1, WriteWait: 10 * time.Millisecond})
	ctx := context.Background()
	// key 0 occupies each writer, key 1 fills each queue.
	for i := range 2 {
		m.Store(ctx, []chunk.Key{key(i)}, [][]byte{payload(i, 4096)})
		for _, qs := m.Stats(); i == 0 && (qs[0].Depth != 0 || qs[1].Depth != 0); _, qs = m.Stats() {
			time.Sleep(time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Store(ctx, []chunk.Key{key(2)}, [][]byte{payload(2, 4096)})
	}()
	select {
	case <-done:
		t.Log("Store returned")
	case <-time.After(3 * time.Second):
		_, qs := m.Stats()
		t.Errorf("Store still blocked after 3s with WriteWait=10ms; queues %+v", qs)
		// Close now would also hang: it needs m.mu.Lock.
		cl := make(chan struct{})
		go func() { m.Close(); close(cl) }()
		select {
		case <-cl:
			t.Log("Close returned")
		case <-time.After(time.Second):
			t.Errorf("Close blocked too (waiting for Store's read lock)")
		}
	}
	close(s1.release)
	close(s2.release)
	<-done
	m.Close()
}
