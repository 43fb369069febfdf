package server_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// frameProxy forwards a producer's connections to a consumer daemon on
// loopback and counts the frames it forwards by op; with old set it
// answers op 27 as a daemon built before RECEIVE_LAYERS does (its header
// parser refuses the op: BAD_REQUEST on op PING, connection closed).
type frameProxy struct {
	addr string
	old  bool
	mu   sync.Mutex
	ops  map[wire.Op]int
}

func (p *frameProxy) count(op wire.Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ops[op]
}

func startFrameProxy(t *testing.T, daemon string, old bool) *frameProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &frameProxy{addr: ln.Addr().String(), old: old, ops: map[wire.Op]int{}}
	var wg sync.WaitGroup
	var conns []net.Conn // closed at the end: the producer pools its connections
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			conns = append(conns, c)
			p.mu.Unlock()
			wg.Go(func() { p.serve(c, daemon) })
		}
	})
	return p
}

func (p *frameProxy) serve(c net.Conn, daemon string) {
	defer c.Close()
	d, err := net.Dial("tcp", daemon)
	if err != nil {
		return
	}
	defer d.Close()
	var wmu sync.Mutex
	go func() {
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := d.Read(buf)
			if n > 0 {
				wmu.Lock()
				_, werr := c.Write(buf[:n])
				wmu.Unlock()
				if werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	var h [wire.HeaderSize]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		op, id, n := wire.Op(h[4]), binary.LittleEndian.Uint32(h[8:]), binary.LittleEndian.Uint32(h[0:])
		if op == wire.OpReceiveLayers && p.old {
			msg := []byte("wire: malformed frame: unknown op 27")
			var r [wire.HeaderSize]byte
			wire.Header{Len: uint32(len(msg)), Op: wire.OpPing, Flags: wire.FlagReply, ID: id, Status: wire.StatusBadRequest}.Put(r[:])
			wmu.Lock()
			c.Write(append(r[:], msg...))
			wmu.Unlock()
			p.note(op)
			return
		}
		if _, err := d.Write(h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(d, br, int64(n)); err != nil {
			return
		}
		p.note(op) // counted once forwarded whole
	}
}

func (p *frameProxy) note(op wire.Op) {
	p.mu.Lock()
	p.ops[op]++
	p.mu.Unlock()
}

// Chunks of these tests: 4 layers × 2 parts (K, V) of 512 bytes.
const (
	feedLayers = 4
	feedSize   = 4096
	feedSpan   = feedSize / (2 * feedLayers)
)

// storeLease is a store lease of the producer's being filled layer by
// layer with chunkData(j, salt, feedSize).
type storeLease struct {
	c     *client.Client
	keys  []chunk.Key
	salt  uint32
	lease uint64
	slots [][]byte
}

func prepareFeed(t *testing.T, c *client.Client, n int, salt byte) *storeLease {
	t.Helper()
	keys := pdKeys(n, salt)
	sizes := make([]uint32, n)
	for j := range sizes {
		sizes[j] = feedSize
	}
	slots, err := c.PrepareStore(context.Background(), client.Raw(keys), sizes, 20000)
	if err != nil || len(slots.Slots) != n || slots.Lease == 0 {
		t.Fatalf("prepare store: %+v, %v", slots, err)
	}
	s := &storeLease{c: c, keys: keys, salt: uint32(salt), lease: slots.Lease}
	for _, sl := range slots.Slots {
		b, err := c.Slot(sl)
		if err != nil {
			t.Fatal(err)
		}
		s.slots = append(s.slots, b)
	}
	return s
}

// layer writes K_i and V_i of every chunk, then says so with STORE_LAYER
// when notice is set.
func (s *storeLease) layer(t *testing.T, i int, notice bool) {
	t.Helper()
	for j, slot := range s.slots {
		want := chunkData(j, s.salt, feedSize)
		for part := range 2 {
			from := (part*feedLayers + i) * feedSpan
			copy(slot[from:from+feedSpan], want[from:from+feedSpan])
		}
	}
	if notice {
		if err := s.c.StoreLayer(context.Background(), s.lease, i, feedLayers, 2); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPushFollowsStoreLayers: a PUSH of a store lease in progress sends
// each layer of every chunk once STORE_LAYER says it is final, and not
// before; the consumer has the chunks, byte-exact, once the last layer
// arrived, before the producer even commits.
func TestPushFollowsStoreLayers(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, server.ServiceOptions{})
	px := startFrameProxy(t, cons.tcp, false)
	pc, cc := prod.local(t), cons.local(t)
	ctx := context.Background()
	s := prepareFeed(t, pc, 3, 41)
	if n, err := pc.PushStore(ctx, 21, px.addr, client.Raw(s.keys), 20000, true, s.lease); err != nil || n != 3 {
		t.Fatalf("push of a store in progress: %d, %v", n, err)
	}
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
	waitFreed(t, prod, pc, 0)
}

// TestPushOfAbortedStore: a store given up mid-save fails its push; the
// consumer never shows the chunks and gives back what it reserved, and
// the producer lets its references go.
func TestPushOfAbortedStore(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, server.ServiceOptions{})
	pc, cc := prod.local(t), cons.local(t)
	ctx := context.Background()
	s := prepareFeed(t, pc, 3, 42)
	if _, err := pc.PushStore(ctx, 22, cons.tcp, client.Raw(s.keys), 20000, true, s.lease); err != nil {
		t.Fatal(err)
	}
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
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, server.ServiceOptions{})
	pc, cc := prod.local(t), cons.local(t)
	ctx := context.Background()
	for _, tc := range []struct {
		old, notice bool
	}{{old: true, notice: true}, {old: false, notice: false}} {
		px := startFrameProxy(t, cons.tcp, tc.old)
		salt := byte(50)
		if tc.old {
			salt = 51
		}
		s := prepareFeed(t, pc, 2, salt)
		id := uint64(salt)
		if _, err := pc.PushStore(ctx, id, px.addr, client.Raw(s.keys), 20000, true, s.lease); err != nil {
			t.Fatal(err)
		}
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
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, server.ServiceOptions{})
	pc, cc := prod.local(t), cons.local(t)
	ctx := context.Background()
	s := prepareFeed(t, pc, 2, 44)
	if _, err := pc.PushStore(ctx, 24, cons.tcp, client.Raw(s.keys), 20000, true, s.lease); err != nil {
		t.Fatal(err)
	}
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
	waitFreed(t, prod, pc, 0)
}
