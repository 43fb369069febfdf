package server_test

import (
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// TestLayerwiseReadOfAPushInProgress: on the consumer, a layerwise load
// takes chunks whose push is still arriving; LAYER_WAIT returns layer i
// once the producer has saved it and its ranges arrived, not before, and
// its bytes are those saved. The chunks end as ordinary RAM chunks, and
// the reader's read ends their hold.
func TestLayerwiseReadOfAPushInProgress(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	pc, cc, ctx := pd.pc, pd.cc, context.Background()
	s := pushStore(t, pc, pd.cons.tcp, 3, 60, 31)
	s.layer(t, 0, true)
	r := takeInProgress(t, cc, s, 3)
	r.readInOrder(s, 3, 30*time.Millisecond)
	if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 3 {
		t.Fatalf("after every layer: %d chunks in RAM, %v", l.Chunks, err)
	}
	if _, err := pc.CommitStore(ctx, s.lease, 3); err != nil {
		t.Fatal(err)
	}
	if st := waitPushed(t, pc, 31); st.State != wire.TransferDone {
		t.Fatalf("status %+v", st)
	}
	if err := cc.Release(ctx, r.lease); err != nil {
		t.Fatal(err)
	}
	waitFreed(t, pd.cons, cc, 0) // the read ended the holds
}

// TestLayerwiseReadOfAFailedPush: a push that stops mid-chunk (the store
// given up on the producer) makes the reader's chunks unusable from the
// layer that never came; nothing stays reserved or charged.
func TestLayerwiseReadOfAFailedPush(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	pc, cc, ctx := pd.pc, pd.cc, context.Background()
	s := pushStore(t, pc, pd.cons.tcp, 3, 61, 32)
	s.layer(t, 0, true)
	r := takeInProgress(t, cc, s, 3)
	if got := <-r.layerAsync(0); got.Usable != 3 {
		t.Fatalf("layer 0: %+v", got)
	}
	r.checkLayer(s, 0)
	ch := r.layerAsync(1)
	if err := pc.Release(ctx, s.lease); err != nil {
		t.Fatal(err)
	}
	if got := <-ch; got.Usable != 0 {
		t.Fatalf("layer 1 of a push given up: %+v, want no usable chunk", got)
	}
	if err := cc.Release(ctx, r.lease); err != nil {
		t.Fatal(err)
	}
	waitFreed(t, pd.cons, cc, 0)
	if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 0 {
		t.Fatalf("%d chunks of a failed push in RAM, %v", l.Chunks, err)
	}
}

// TestLayerwiseReadOfADamagedRange: a range that fails its checksum fails
// the chunks still arriving for their reader, which gets no bytes of the
// damaged layer counted as ready.
func TestLayerwiseReadOfADamagedRange(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c, cc := cons.remote(t), cons.local(t)
	m, chunks := layered(t, 3, 62, feedSize)
	sums := make([]uint64, len(m.Ranges))
	for i, r := range m.Ranges {
		sums[i] = wire.Checksum(chunks[r.Key][r.From:r.To])
	}
	sums[8] ^= 1 // layer 1 of chunk 1
	var r *layerReader
	var wait <-chan wire.LayerReady
	s := &storeLease{keys: m.Keys.Raw, salt: 62}
	_, err := c.ReceiveLayers(context.Background(), m, chunks, func(i int) error {
		if i == 6 { // layer 0 sent in full
			r = takeInProgress(t, cc, s, 3)
			if got := <-r.layerAsync(0); got.Usable != 3 {
				t.Errorf("layer 0: %+v", got)
			}
			r.checkLayer(s, 0)
			wait = r.layerAsync(1)
		}
		return nil
	}, sums)
	if !client.IsStatus(err, wire.StatusBadRequest) {
		t.Fatalf("damaged range: %v", err)
	}
	// Chunk 0's layer 1 arrived intact before the damaged range: a wait
	// answered before the failure may count it; the damaged chunk 1
	// never, and no layer after the failure is usable.
	if got := <-wait; got.Usable > 1 {
		t.Fatalf("layer 1 after a damaged range: %+v, want at most chunk 0 usable", got)
	}
	if got := <-r.layerAsync(2); got.Usable != 0 {
		t.Fatalf("layer 2 after a damaged range: %+v, want no usable chunk", got)
	}
	if err := cc.Release(context.Background(), r.lease); err != nil {
		t.Fatal(err)
	}
	waitFreed(t, cons, cc, 0)
}

// TestLayerwisePendingStoredMeanwhile: a chunk still arriving by ranges
// whose key another client stores meanwhile completes onto the stored
// copy: the push counts it, a reader that took it in progress gets every
// layer byte-exact, a reader after gets the stored copy, and nothing
// stays reserved or charged once both have read.
func TestLayerwisePendingStoredMeanwhile(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c, cc := cons.remote(t), cons.local(t)
	m, chunks := layered(t, 1, 63, feedSize)
	s := &storeLease{keys: m.Keys.Raw, salt: 63}
	var r *layerReader
	n, err := c.ReceiveLayers(context.Background(), m, chunks, func(i int) error {
		if i == 2 { // layer 0 in
			r = takeInProgress(t, cc, s, 1)
			storeRaw(t, cons.remote(t), m.Keys.Raw, 63, feedSize)
		}
		return nil
	}, nil)
	if err != nil || n != 1 {
		t.Fatalf("receive layers over a key stored meanwhile: %d, %v", n, err)
	}
	for i := range feedLayers {
		if got := <-r.layerAsync(i); got.Usable != 1 {
			t.Fatalf("layer %d: %+v", i, got)
		}
		r.checkLayer(s, i)
	}
	if err := cc.Release(context.Background(), r.lease); err != nil {
		t.Fatal(err)
	}
	checkRaw(t, cc, m.Keys.Raw, 63, feedSize)
	waitFreed(t, cons, cc, 0)
}

// TestWaitInProgressCountsWhatIsTaken: WAIT with IN_PROGRESS counts what
// PREPARE_RETRIEVE_LAYERS takes — the chunks in RAM, then the chunks
// arriving — and not a chunk in RAM after an arriving one: with RAM,
// arriving, RAM, arriving it says 2, and the reader gets 2.
func TestWaitInProgressCountsWhatIsTaken(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c, cc := cons.remote(t), cons.local(t)
	ctx := context.Background()
	keys := pdKeys(4, 64)
	storeRaw(t, c, []chunk.Key{keys[0]}, 64, feedSize)
	storeRaw(t, c, []chunk.Key{keys[2]}, 64, feedSize)
	m := &wire.ReceiveLayers{Receive: wire.Receive{Transfer: 6, HoldMS: 5000, Keys: wire.Keys{Kind: wire.KindRaw, Raw: []chunk.Key{keys[1], keys[3]}}}}
	chunks := [][]byte{chunkData(1, 64, feedSize), chunkData(3, 64, feedSize)}
	m.Sizes = []uint32{feedSize, feedSize}
	if !m.RangesFor(feedLayers, 2, 1) {
		t.Fatal("no ranges")
	}
	var w wire.WaitReply
	var slots int
	n, err := c.ReceiveLayers(ctx, m, chunks, func(i int) error {
		if i == 4 { // layer 0 of both sent: they are arriving, or about to
			var err error
			if w, err = cc.WaitInProgress(ctx, client.Raw(keys), 2, 10000); err != nil {
				t.Error(err)
			}
			sl, err := cc.PrepareRetrieveLayers(ctx, client.Raw(keys), feedLayers, 2, 20000)
			if err != nil {
				t.Error(err)
			}
			slots = len(sl.Slots)
			if sl.Lease != 0 {
				if err := cc.Release(ctx, sl.Lease); err != nil {
					t.Error(err)
				}
			}
		}
		return nil
	}, nil)
	if err != nil || n != 2 {
		t.Fatalf("receive layers: %d, %v", n, err)
	}
	if w.Chunks != 2 || slots != 2 {
		t.Fatalf("WAIT IN_PROGRESS counted %d chunks, PREPARE_RETRIEVE_LAYERS took %d; want 2 and 2", w.Chunks, slots)
	}
	// A wait of no time counts what is there, too.
	if w, err := cc.Wait(ctx, client.Raw(keys), 0, 0); err != nil || w.Chunks != 4 {
		t.Fatalf("WAIT of no time once all 4 are in: %+v, %v", w, err)
	}
}
