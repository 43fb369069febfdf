package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// TestPushFollowsStoreLayers: a PUSH of a store lease in progress sends
// each layer of every chunk once STORE_LAYER says it is final, and not
// before; the consumer has the chunks, byte-exact, once the last layer
// arrived, before the producer even commits.
func TestPushFollowsStoreLayers(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	px := startFrameProxy(t, pd.cons.tcp, false)
	pc, cc, ctx := pd.pc, pd.cc, context.Background()
	s := pushStore(t, pc, px.addr, 3, 41, 21)
	perLayer := 3 * 2 // ranges: chunks × (K, V)
	for i := range feedLayers {
		time.Sleep(20 * time.Millisecond) // time for a wrong early send to show
		// 1 probe + the request's metadata frame, then the ranges of the layers noticed.
		if got, want := px.count(wire.OpReceiveLayers), 2+i*perLayer; i > 0 && got != want {
			t.Fatalf("before layer %d was noticed: %d op-27 frames forwarded, want %d", i, got, want)
		}
		s.layer(t, i, true)
		waitFor(t, "layer's ranges at the consumer", func() bool { return px.count(wire.OpReceiveLayers) == 2+(i+1)*perLayer })
		if i < feedLayers-1 {
			if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 0 {
				t.Fatalf("after layer %d: %d chunks visible on the consumer, %v", i, l.Chunks, err)
			}
		}
	}
	waitFor(t, "the chunks on the consumer", func() bool {
		l, err := cc.Lookup(ctx, client.Raw(s.keys), 0)
		return err == nil && l.Chunks == 3
	})
	if n, err := pc.CommitStore(ctx, s.lease, 3); err != nil || n != 3 {
		t.Fatalf("commit: %d, %v", n, err)
	}
	if st := waitPushed(t, pc, 21); st.State != wire.TransferDone || st.Pushed != 3 {
		t.Fatalf("status %+v", st)
	}
	checkRaw(t, cc, s.keys, s.salt, feedSize)
	checkRaw(t, pc, s.keys, s.salt, feedSize)
	if px.count(wire.OpReceive) != 0 {
		t.Fatalf("%d RECEIVE frames: the chunks went whole", px.count(wire.OpReceive))
	}
	waitFreed(t, pd.prod, pc, 0)
}

// TestPushOfAbortedStore: a store given up mid-save fails its push; the
// consumer never shows the chunks and gives back what it reserved, and
// the producer lets its references go.
func TestPushOfAbortedStore(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	prod, cons, pc, cc, ctx := pd.prod, pd.cons, pd.pc, pd.cc, context.Background()
	s := pushStore(t, pc, cons.tcp, 3, 42, 22)
	s.layer(t, 0, true)
	s.layer(t, 1, true)
	waitFor(t, "the consumer reserving the chunks", func() bool { return cons.svc.HeldBytes() == 3*feedSize })
	if err := pc.Release(ctx, s.lease); err != nil {
		t.Fatal(err)
	}
	st := waitPushed(t, pc, 22)
	if st.State != wire.TransferFailed || !strings.Contains(st.Message, "given up") {
		t.Fatalf("status after the store was released: %+v", st)
	}
	waitFreed(t, cons, cc, 0)
	if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 0 {
		t.Fatalf("%d chunks of an aborted store visible on the consumer, %v", l.Chunks, err)
	}
	waitFreed(t, prod, pc, 0)
	// A store lease of another connection cannot be pushed.
	s2 := prepareFeed(t, pc, 1, 43)
	if _, err := prod.local(t).PushStore(ctx, 23, cons.tcp, client.Raw(s2.keys), 1000, true, s2.lease); !client.IsStatus(err, wire.StatusNotFound) {
		t.Fatalf("push of another connection's store lease: %v", err)
	}
}

// TestPushStoreToOlderConsumer: a consumer without RECEIVE_LAYERS gets
// the chunks whole with RECEIVE, once committed; so does a save that
// sends no STORE_LAYER notices, to a consumer of today.
func TestPushStoreToOlderConsumer(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	pc, cc, ctx := pd.pc, pd.cc, context.Background()
	for _, tc := range []struct {
		old, notice bool
	}{{old: true, notice: true}, {old: false, notice: false}} {
		px := startFrameProxy(t, pd.cons.tcp, tc.old)
		salt := byte(50)
		if tc.old {
			salt = 51
		}
		id := uint64(salt)
		s := pushStore(t, pc, px.addr, 2, salt, id)
		for i := range feedLayers {
			s.layer(t, i, tc.notice)
		}
		time.Sleep(20 * time.Millisecond)
		if l, err := cc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 0 {
			t.Fatalf("old %v: %d chunks on the consumer before the commit, %v", tc.old, l.Chunks, err)
		}
		if n, err := pc.CommitStore(ctx, s.lease, 2); err != nil || n != 2 {
			t.Fatalf("commit: %d, %v", n, err)
		}
		if st := waitPushed(t, pc, id); st.State != wire.TransferDone || st.Pushed != 2 {
			t.Fatalf("old %v: status %+v", tc.old, st)
		}
		checkRaw(t, cc, s.keys, s.salt, feedSize)
		if px.count(wire.OpReceive) != 3 { // the metadata frame and one per chunk
			t.Fatalf("old %v: %d RECEIVE frames, want 3", tc.old, px.count(wire.OpReceive))
		}
		if tc.old && px.count(wire.OpReceiveLayers) != 1 {
			t.Fatalf("%d op-27 frames to an older consumer, want the one probe", px.count(wire.OpReceiveLayers))
		}
	}
}

// TestPushOfStoreCommittedShortAfterItsLayers: a store committed short
// after every layer of its chunks went out leaves the chunk it left out on
// the consumer, with the bytes the notices declared final, and the
// transfer done; the producer never shows that chunk.
func TestPushOfStoreCommittedShortAfterItsLayers(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	pc, cc, ctx := pd.pc, pd.cc, context.Background()
	s := pushStore(t, pc, pd.cons.tcp, 2, 44, 24)
	for i := range feedLayers {
		s.layer(t, i, true)
	}
	waitFor(t, "the chunks on the consumer", func() bool {
		l, err := cc.Lookup(ctx, client.Raw(s.keys), 0)
		return err == nil && l.Chunks == 2
	})
	if st := waitPushed(t, pc, 24); st.State != wire.TransferDone || st.Pushed != 2 {
		t.Fatalf("status %+v", st)
	}
	if n, err := pc.CommitStore(ctx, s.lease, 1); err != nil || n != 1 {
		t.Fatalf("commit of 1: %d, %v", n, err)
	}
	if l, err := pc.Lookup(ctx, client.Raw(s.keys), 0); err != nil || l.Chunks != 1 {
		t.Fatalf("the producer shows %d chunks, %v", l.Chunks, err)
	}
	checkRaw(t, cc, s.keys, s.salt, feedSize)
	waitFreed(t, pd.prod, pc, 0)
}

// TestPushAsksTheConsumerOncePerConnection: the producer asks a consumer
// whether it takes RECEIVE_LAYERS, and its budget, once per connection,
// not before every batch: a transfer cut into three batches by a budget of
// two chunks, then a second transfer on the pooled connection, ask once in
// all. Once the connections are cut (as when the consumer restarts), the
// next transfer finds its pooled connection closed, dials anew and asks
// again. Every chunk arrives byte-exact, by layers.
func TestPushAsksTheConsumerOncePerConnection(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{PDReceiveBytes: 2 * feedSize})
	px := startFrameProxy(t, pd.cons.tcp, false)
	ctx := context.Background()
	for k, tc := range []struct {
		n      int
		cut    bool
		probes int
	}{{n: 6, probes: 1}, {n: 2, probes: 1}, {n: 2, cut: true, probes: 2}} {
		if tc.cut {
			px.cut()
		}
		id := uint64(90 + k)
		s := pushStore(t, pd.pc, px.addr, tc.n, byte(90+k), id)
		errs := make(chan error, 1)
		go readEachAsItLands(pd.cons.remote(t), s, 0, 1, errs)
		for i := range feedLayers {
			s.layer(t, i, true)
		}
		if err := <-errs; err != nil {
			st, serr := pd.pc.PushStatus(ctx, id)
			t.Logf("consumer: %d bytes held, %d requests waiting for budget", pd.cons.svc.HeldBytes(), pd.cons.svc.ReceiveWaiting())
			t.Fatalf("transfer %d: %v (status %+v, %v)", k, err, st, serr)
		}
		if n, err := pd.pc.CommitStore(ctx, s.lease, tc.n); err != nil || n != tc.n {
			t.Fatalf("commit %d: %d, %v", k, n, err)
		}
		if st := waitPushed(t, pd.pc, id); st.State != wire.TransferDone || st.Pushed != uint32(tc.n) {
			t.Fatalf("transfer %d: status %+v", k, st)
		}
		if got := px.probeCount(); got != tc.probes {
			t.Fatalf("after transfer %d: %d empty RECEIVE_LAYERS sent, want %d", k, got, tc.probes)
		}
	}
	if px.count(wire.OpReceive) != 0 {
		t.Fatalf("%d RECEIVE frames: chunks went whole", px.count(wire.OpReceive))
	}
}

// TestPushMidTransferCloseIsNotResent: a connection the consumer closes
// mid-transfer (after a batch of the transfer went over it) fails the
// transfer; only a pooled connection's first request is sent again on a
// new one. Resent mid-transfer, the consumer would take the batch as a
// new transfer's: queued behind new transfers, and chunks it has already
// held for a second reader who never comes.
func TestPushMidTransferCloseIsNotResent(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{})
	px := startFrameProxy(t, pd.cons.tcp, false)
	ctx := context.Background()
	keys := pdKeys(4, 96)
	storeRaw(t, pd.prod.remote(t), keys, 97, 4096)
	const id = 96
	if _, err := pd.pc.Push(ctx, id, px.addr, client.Raw(keys[:2]), 0, false); err != nil {
		t.Fatal(err)
	}
	for {
		st, err := pd.pc.PushStatus(ctx, id)
		if err != nil || st.State != wire.TransferPending {
			t.Fatalf("the first batch: %+v, %v", st, err)
		}
		if st.Pushed == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	sent := px.count(wire.OpReceive)
	px.cut()
	if _, err := pd.pc.Push(ctx, id, px.addr, client.Raw(keys[2:]), 0, true); err != nil {
		t.Fatal(err)
	}
	if st := waitPushed(t, pd.pc, id); st.State != wire.TransferFailed || st.Pushed != 2 {
		t.Fatalf("after a mid-transfer close: %+v, want failed with 2 pushed", st)
	}
	if n := px.count(wire.OpReceive); n != sent {
		t.Fatalf("%d RECEIVE frames reached the consumer, %d before the close; want no more (no resend)", n, sent)
	}
}

// TestPushBatchesTakeHalfTheBudget: the producer cuts a batch by layers
// to half the budget the consumer names, not all of it. The consumer
// serves a batch only once all its bytes are free, so one sized to the
// whole budget waits until nothing at all is held there, with every new
// transfer queued behind it. Four chunks to a budget of four: two batches
// at least.
func TestPushBatchesTakeHalfTheBudget(t *testing.T) {
	pd := startPDPair(t, server.ServiceOptions{PDReceiveBytes: 4 * feedSize})
	px := startFrameProxy(t, pd.cons.tcp, false)
	ctx := context.Background()
	const id, n = 98, 4
	s := pushStore(t, pd.pc, px.addr, n, 98, id)
	errs := make(chan error, 1)
	go readEachAsItLands(pd.cons.remote(t), s, 0, 1, errs)
	for i := range feedLayers {
		s.layer(t, i, true)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if got, err := pd.pc.CommitStore(ctx, s.lease, n); err != nil || got != n {
		t.Fatalf("commit: %d, %v", got, err)
	}
	if st := waitPushed(t, pd.pc, id); st.State != wire.TransferDone || st.Pushed != n {
		t.Fatalf("status %+v", st)
	}
	if batches := px.requests(wire.OpReceiveLayers) - px.probeCount(); batches < 2 {
		t.Fatalf("%d RECEIVE_LAYERS batches of %d chunks to a budget of %d chunks; want each at most half of it", batches, n, n)
	}
}
