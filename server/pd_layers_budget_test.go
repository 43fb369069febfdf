package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// Pushes per layer larger than the consumer's receive budget stream
// through, as RECEIVE does, when readers read each chunk as it lands:
// every range of a RECEIVE_LAYERS batch starts its chunk before any chunk
// completes, so a batch that took the budget chunk by chunk waited for
// itself.

// readEachAsItLands reads keys[j] for j = first, first+step, … as each
// arrives on the consumer, checks its bytes and sends the first error.
func readEachAsItLands(c *client.Client, s *storeLease, first, step int, errs chan<- error) {
	ctx := context.Background()
	dst := [][]byte{make([]byte, feedSize)}
	for j := first; j < len(s.keys); j += step {
		w, err := c.Wait(ctx, client.Raw(s.keys[j:j+1]), 1, 15000)
		if err != nil || w.Chunks != 1 {
			errs <- fmt.Errorf("chunk %d never arrived: %+v, %v", j, w, err)
			return
		}
		n, _, err := c.Retrieve(ctx, client.Raw(s.keys[j:j+1]), dst)
		if err != nil || n != 1 || !bytes.Equal(dst[0], chunkData(j, s.salt, feedSize)) {
			errs <- fmt.Errorf("chunk %d: %d, %v (or wrong bytes)", j, n, err)
			return
		}
	}
	errs <- nil
}

// TestPushLayersOverBudget: 4 chunks pushed per layer to a consumer whose
// budget holds 2, two readers each reading its chunks as they land.
func TestPushLayersOverBudget(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{PDReceiveBytes: 2 * feedSize})
	cons, pc, ctx := pd.cons, pd.pc, context.Background()
	s := pushStore(t, pc, cons.tcp, 4, 81, 81)
	errs := make(chan error, 2)
	for r := range 2 {
		go readEachAsItLands(cons.remote(t), s, r, 2, errs)
	}
	for i := range feedLayers {
		s.layer(t, i, true)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n, err := pc.CommitStore(ctx, s.lease, 4); err != nil || n != 4 {
		t.Fatalf("commit: %d, %v", n, err)
	}
	if st := waitPushed(t, pc, 81); st.State != wire.TransferDone || st.Pushed != 4 {
		t.Fatalf("status %+v", st)
	}
	waitFreed(t, cons, cons.local(t), 0)
}

// TestPushLayersConcurrentOverBudget: two transfers per layer, each
// larger than the consumer's budget, at once; neither holds part of the
// budget while it waits for more, so both complete as they are read.
func TestPushLayersConcurrentOverBudget(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{PDReceiveBytes: 3 * feedSize})
	prod, cons, ctx := pd.prod, pd.cons, context.Background()
	errs := make(chan error, 2)
	var leases []*storeLease
	for k := range 2 {
		// A store lease is its connection's.
		s := pushStore(t, prod.local(t), cons.tcp, 4, byte(82+k), uint64(82+k))
		leases = append(leases, s)
		go readEachAsItLands(cons.remote(t), s, 0, 1, errs)
	}
	for i := range feedLayers {
		for _, s := range leases {
			s.layer(t, i, true)
		}
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for k, s := range leases {
		if n, err := s.c.CommitStore(ctx, s.lease, 4); err != nil || n != 4 {
			t.Fatalf("commit %d: %d, %v", k, n, err)
		}
		if st := waitPushed(t, prod.local(t), uint64(82+k)); st.State != wire.TransferDone || st.Pushed != 4 {
			t.Fatalf("transfer %d: status %+v", k, st)
		}
	}
	waitFreed(t, cons, cons.local(t), 0)
}

// TestReceiveLayersBatchOverBudget: the consumer names its budget to a
// request of no chunks, and refuses a batch larger than it at once,
// reserving nothing; a batch that fits is taken whole.
func TestReceiveLayersBatchOverBudget(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{PDReceiveBytes: 2 * 4096})
	c, cc := cons.remote(t), cons.local(t)
	ctx := context.Background()
	if b, err := c.ReceiveLayersBudget(ctx, 9); err != nil || b != 2*4096 {
		t.Fatalf("budget named: %d, %v", b, err)
	}
	m, chunks := layered(t, 3, 90, 4096)
	if _, err := c.ReceiveLayers(ctx, m, chunks, nil, nil); !client.IsStatus(err, wire.StatusNoSpace) {
		t.Fatalf("a batch of 3 chunks into a budget of 2: %v", err)
	}
	waitFreed(t, cons, cc, 0)
	if err := c.Ping(ctx); err != nil { // the stream stayed in step
		t.Fatal(err)
	}
	m, chunks = layered(t, 2, 91, 4096)
	if n, err := c.ReceiveLayers(ctx, m, chunks, nil, nil); err != nil || n != 2 {
		t.Fatalf("a batch of the whole budget: %d, %v", n, err)
	}
	checkRaw(t, cc, m.Keys.Raw, 91, 4096)
	waitFreed(t, cons, cc, 0)
}
