package server_test

import (
	"context"
	"testing"
	"time"

	"kvtier/client"
)

// A push layer by layer between two real daemons, the producer killed
// mid-save: the consumer's reader of the chunks in progress gets a failure
// for the layers that never came, never bytes, and the consumer keeps
// nothing of them.

func TestProcessesLayerPushProducerKilled(t *testing.T) {
	prod, cons, pc, cc := startPDProcs(t)
	ctx := context.Background()
	s := pushStore(t, pc, cons.TCP, 4, 70, 400)
	s.layer(t, 0, true)
	s.layer(t, 1, true)
	r := takeInProgress(t, cc, s, 4)
	for i := range 2 {
		if got := <-r.layerAsync(i); got.Usable != 4 {
			t.Fatalf("layer %d: %+v", i, got)
		}
		r.checkLayer(s, i)
	}
	if held := cons.metric(t, "kvtier_pd_held_bytes"); held != 4*feedSize {
		t.Fatalf("the consumer charges %.0f bytes to its budget for 4 chunks arriving, want %d", held, 4*feedSize)
	}
	wait := r.layerAsync(2)
	prod.kill()
	if got := <-wait; got.Usable != 0 {
		t.Fatalf("layer 2 after the producer died: %+v, want no usable chunk", got)
	}
	if err := cc.Release(ctx, r.lease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer's budget back", func() bool { return cons.metric(t, "kvtier_pd_held_bytes") == 0 })
	waitFor(t, "nothing pinned on the consumer", func() bool { return arenaPinned(t, cc) == 0 })
	if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 0 {
		t.Fatalf("%d chunks of the cut push on the consumer, %v", l.Chunks, err)
	}
	if err := cc.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestProcessesLayerPushReadInOrder: between two real daemons, the
// consumer's layerwise reader gets layer i of the chunks only once the
// producer has saved it, byte-exact, and every chunk before the producer
// commits.
func TestProcessesLayerPushReadInOrder(t *testing.T) {
	_, cons, pc, cc := startPDProcs(t)
	ctx := context.Background()
	s := pushStore(t, pc, cons.TCP, 4, 71, 401)
	s.layer(t, 0, true)
	r := takeInProgress(t, cc, s, 4)
	r.readInOrder(s, 4, 50*time.Millisecond)
	if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 4 {
		t.Fatalf("before the producer's commit: %d chunks on the consumer, %v", l.Chunks, err)
	}
	if _, err := pc.CommitStore(ctx, s.lease, 4); err != nil {
		t.Fatal(err)
	}
	if st := waitPushed(t, pc, 401); st.Pushed != 4 {
		t.Fatalf("status %+v", st)
	}
	if err := cc.Release(ctx, r.lease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the holds ended by the read", func() bool { return cons.metric(t, "kvtier_pd_held_bytes") == 0 })
}
