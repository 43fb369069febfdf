package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// Shared setup of the prefill/decode tests: a producer and a consumer,
// a store lease filled layer by layer and pushed, a layerwise reader of
// it on the consumer, and a proxy that counts the frames between them.

// pdPair is a producer and a consumer daemon in this process, with a
// local client of each.
type pdPair struct {
	prod, cons *daemon
	pc, cc     *client.Client
}

// startPDPair starts the two daemons (64 MiB of RAM each), the consumer
// with opts.
func startPDPair(t *testing.T, opts server.ServiceOptions) *pdPair {
	t.Helper()
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, opts)
	return &pdPair{prod: prod, cons: cons, pc: prod.local(t), cc: cons.local(t)}
}

// startPDProcs starts a producer and a consumer `kvtier serve` process
// and returns them with a local client of each.
func startPDProcs(t *testing.T) (prod, cons *proc, pc, cc *client.Client) {
	t.Helper()
	prod = startProc(t, t.TempDir(), pdProcConf)
	cons = startProc(t, t.TempDir(), pdProcConf)
	return prod, cons, prod.dialLocal(t), cons.dialLocal(t)
}

func (p *proc) dialLocal(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.DialUnix(context.Background(), p.Sock, client.Options{Name: t.Name(), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pushStore prepares a store of n chunks over pc (see prepareFeed) and
// pushes it, as it is filled, to dest as transfer id.
func pushStore(t *testing.T, pc *client.Client, dest string, n int, salt byte, id uint64) *storeLease {
	t.Helper()
	s := prepareFeed(t, pc, n, salt)
	if got, err := pc.PushStore(context.Background(), id, dest, client.Raw(s.keys), 20000, true, s.lease); err != nil || got != n {
		t.Fatalf("push of a store in progress: %d, %v", got, err)
	}
	return s
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
	return &storeLease{c: c, keys: keys, salt: uint32(salt), lease: slots.Lease, slots: mapSlots(t, c, slots.Slots)}
}

// mapSlots returns the arena bytes of each slot, mapped through c.
func mapSlots(t *testing.T, c *client.Client, slots []wire.Slot) [][]byte {
	t.Helper()
	out := make([][]byte, len(slots))
	for j, sl := range slots {
		b, err := c.Slot(sl)
		if err != nil {
			t.Fatal(err)
		}
		out[j] = b
	}
	return out
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

// layerReader is a decode's layerwise load of chunks still being pushed.
type layerReader struct {
	t     *testing.T
	c     *client.Client
	lease uint64
	slots [][]byte
}

// takeInProgress waits until n chunks are on the consumer, complete or
// arriving, and takes them with PREPARE_RETRIEVE_LAYERS.
func takeInProgress(t *testing.T, c *client.Client, s *storeLease, n int) *layerReader {
	t.Helper()
	ctx := context.Background()
	w, err := c.WaitInProgress(ctx, client.Raw(s.keys), uint32(n), 10000)
	if err != nil || int(w.Chunks) != n {
		t.Fatalf("wait for chunks in progress: %+v, %v", w, err)
	}
	slots, err := c.PrepareRetrieveLayers(ctx, client.Raw(s.keys), feedLayers, 2, 20000)
	if err != nil || len(slots.Slots) != n || slots.Lease == 0 {
		t.Fatalf("prepare retrieve layers: %+v, %v", slots, err)
	}
	return &layerReader{t: t, c: c, lease: slots.Lease, slots: mapSlots(t, c, slots.Slots)}
}

// layerAsync starts LAYER_WAIT for layer on a goroutine.
func (r *layerReader) layerAsync(layer int) <-chan wire.LayerReady {
	ch := make(chan wire.LayerReady, 1)
	go func() {
		got, err := r.c.LayerWait(context.Background(), r.lease, layer)
		if err != nil {
			r.t.Errorf("layer wait %d: %v", layer, err)
		}
		ch <- got
	}()
	return ch
}

// checkLayer compares K_i and V_i of every slot with what the producer
// saved.
func (r *layerReader) checkLayer(s *storeLease, i int) {
	r.t.Helper()
	for j, slot := range r.slots {
		want := chunkData(j, s.salt, feedSize)
		for part := range 2 {
			from := (part*feedLayers + i) * feedSpan
			if !bytes.Equal(slot[from:from+feedSpan], want[from:from+feedSpan]) {
				r.t.Fatalf("chunk %d layer %d part %d: the bytes read differ from those saved", j, i, part)
			}
		}
	}
}

// readInOrder follows the reader's n chunks layer by layer while the
// producer saves each layer after layer 0 (already saved): LAYER_WAIT(i)
// must not answer within quiet before layer i is saved, and then answers
// with every chunk usable and the bytes saved.
func (r *layerReader) readInOrder(s *storeLease, n int, quiet time.Duration) {
	r.t.Helper()
	for i := range feedLayers {
		ch := r.layerAsync(i)
		if i > 0 {
			select {
			case got := <-ch:
				r.t.Fatalf("layer %d ready (%+v) before the producer saved it", i, got)
			case <-time.After(quiet):
			}
			s.layer(r.t, i, true)
		}
		if got := <-ch; got.Usable != uint32(n) || got.Ready < uint32(i+1) {
			r.t.Fatalf("layer %d: %+v", i, got)
		}
		r.checkLayer(s, i)
	}
}

// frameProxy forwards a producer's connections to a consumer daemon on
// loopback and counts the frames it forwards by op, and the empty
// RECEIVE_LAYERS requests (probes) among them; with old set it
// answers op 27 as a daemon built before RECEIVE_LAYERS does (its header
// parser refuses the op: BAD_REQUEST on op PING, connection closed).
type frameProxy struct {
	addr   string
	old    bool
	mu     sync.Mutex
	ops    map[wire.Op]int
	reqs   map[wire.Op]int // requests: frames that continue none before
	probes int
	conns  []net.Conn // both sides of every connection, closed at the end
}

func (p *frameProxy) count(op wire.Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ops[op]
}

// requests returns how many requests of op were forwarded (a request's
// data frames not counted).
func (p *frameProxy) requests(op wire.Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reqs[op]
}

func startFrameProxy(t *testing.T, daemon string, old bool) *frameProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &frameProxy{addr: ln.Addr().String(), old: old, ops: map[wire.Op]int{}, reqs: map[wire.Op]int{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.cut() // the producer pools its connections
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.keep(c)
			wg.Go(func() { p.serve(c, daemon) })
		}
	})
	return p
}

func (p *frameProxy) keep(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

// cut closes every connection forwarded so far, as a consumer that
// restarts does.
func (p *frameProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *frameProxy) probeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probes
}

func (p *frameProxy) serve(c net.Conn, daemon string) {
	defer c.Close()
	d, err := net.Dial("tcp", daemon)
	if err != nil {
		return
	}
	defer d.Close()
	p.keep(d)
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
	more := false // the frame before had the more-frames flag: this one continues its request
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		op, id, n := wire.Op(h[4]), binary.LittleEndian.Uint32(h[8:]), binary.LittleEndian.Uint32(h[0:])
		first := !more
		probe := op == wire.OpReceiveLayers && first && wire.Flags(h[5])&wire.FlagMore == 0
		more = wire.Flags(h[5])&wire.FlagMore != 0
		if op == wire.OpReceiveLayers && p.old {
			msg := []byte("wire: malformed frame: unknown op 27")
			var r [wire.HeaderSize]byte
			wire.Header{Len: uint32(len(msg)), Op: wire.OpPing, Flags: wire.FlagReply, ID: id, Status: wire.StatusBadRequest}.Put(r[:])
			wmu.Lock()
			c.Write(append(r[:], msg...))
			wmu.Unlock()
			p.note(op, true, false)
			return
		}
		if _, err := d.Write(h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(d, br, int64(n)); err != nil {
			return
		}
		p.note(op, first, probe) // counted once forwarded whole
	}
}

func (p *frameProxy) note(op wire.Op, first, probe bool) {
	p.mu.Lock()
	p.ops[op]++
	if first {
		p.reqs[op]++
	}
	if probe {
		p.probes++
	}
	p.mu.Unlock()
}
