package kvtier_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/codec"
	"kvtier/tier/remote"
	"kvtier/wire"
)

// The tests in this file put a kvtier:// tier in front of a daemon that
// predates RETRIEVE_RANGES, made by a proxy on loopback that forwards
// every frame to a real daemon but answers op 25 as such a daemon does.

// Ways an older daemon answers op 25.
const (
	passOp25    = iota // forwarded: the daemon of today
	unknownOp25        // UNKNOWN_OP on the same op, connection kept
	oldHeader25        // the header parser of a daemon built before op 25: BAD_REQUEST on op PING, connection closed
)

// oldProxy forwards a client's frames to a daemon and its replies back,
// counting the requests by op.
type oldProxy struct {
	addr string
	mode atomic.Int32
	mu   sync.Mutex
	ops  map[wire.Op]int // requests seen, op 25 included
}

func (p *oldProxy) count(op wire.Op) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ops[op]
}

func startOldProxy(t *testing.T, daemon string, mode int32) *oldProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &oldProxy{addr: ln.Addr().String(), ops: map[wire.Op]int{}}
	p.mode.Store(mode)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c, daemon) })
		}
	})
	return p
}

func (p *oldProxy) serve(c net.Conn, daemon string) {
	defer c.Close()
	d, err := net.Dial("tcp", daemon)
	if err != nil {
		return
	}
	defer d.Close()
	var wmu sync.Mutex // replies from the daemon and the proxy's own
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
	// As the daemon's session does, read through a buffer: a small
	// request arrives whole, and closing leaves nothing unread behind.
	br := bufio.NewReaderSize(c, 64<<10)
	var h [wire.HeaderSize]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		op, id := wire.Op(h[4]), binary.LittleEndian.Uint32(h[8:])
		n := binary.LittleEndian.Uint32(h[0:])
		p.mu.Lock()
		p.ops[op]++
		p.mu.Unlock()
		if op == wire.OpRetrieveRanges && p.mode.Load() != passOp25 {
			msg := []byte("wire: malformed frame: unknown op 25")
			var r [wire.HeaderSize]byte
			if p.mode.Load() == unknownOp25 {
				if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
					return
				}
				wire.Header{Len: uint32(len(msg)), Op: op, Flags: wire.FlagReply, ID: id, Status: wire.StatusUnknownOp}.Put(r[:])
				wmu.Lock()
				c.Write(append(r[:], msg...))
				wmu.Unlock()
				continue
			}
			// The body is not read: the old parser failed on the header.
			wire.Header{Len: uint32(len(msg)), Op: wire.OpPing, Flags: wire.FlagReply, ID: id, Status: wire.StatusBadRequest}.Put(r[:])
			wmu.Lock()
			c.Write(append(r[:], msg...))
			wmu.Unlock()
			return
		}
		if _, err := d.Write(h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(d, br, int64(n)); err != nil {
			return
		}
	}
}

// oldStack opens the kvtier:// tier through p as the engine does.
func oldStack(t *testing.T, p *oldProxy) *remote.Encoded {
	t.Helper()
	kt := open(t, "kvtier://"+token+"@"+p.addr)
	return remote.Encode(remote.Guard(kt, remote.GuardOptions{Timeout: 2 * time.Second}), "kvtier", nil, nil)
}

// promote reads k as the manager promotes a chunk: Size, then Get into a
// buffer of that size, which must come back full.
func promote(t *testing.T, e *remote.Encoded, k chunk.Key, want []byte) {
	t.Helper()
	n, ok := e.Size(k)
	if !ok || n != len(want) {
		t.Fatalf("Size = %d, %v; want %d", n, ok, len(want))
	}
	dst := make([]byte, n)
	got, err := e.Get(context.Background(), k, dst)
	if err != nil || got != n || !bytes.Equal(dst, want) {
		t.Fatalf("Get = %d, %v; equal %v", got, err, bytes.Equal(dst, want))
	}
}

// stream reads k as a layerwise load does: OpenRange, then ranges in
// order, each checked as it comes.
func stream(t *testing.T, e *remote.Encoded, k chunk.Key, want []byte) {
	t.Helper()
	ctx := context.Background()
	dst := make([]byte, len(want))
	rr, err := e.OpenRange(ctx, k, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	step := len(want) / 8
	for from := 0; from < len(want); from += step {
		to := min(from+step, len(want))
		if err := rr.ReadRange(ctx, from, to); err != nil {
			t.Fatalf("range [%d, %d): %v", from, to, err)
		}
		if !bytes.Equal(dst[from:to], want[from:to]) {
			t.Fatalf("range [%d, %d): wrong bytes", from, to)
		}
	}
}

// TestOlderDaemonWithoutRanges: against a daemon that does not know
// RETRIEVE_RANGES, whichever way it says so, the tier finds that out when
// it opens, stores unpieced objects, and sizes, promotes and streams
// every chunk with its bytes, without a range request after the first
// and without reading a whole object to size it.
func TestOlderDaemonWithoutRanges(t *testing.T) {
	for _, mode := range []int32{unknownOp25, oldHeader25} {
		name := map[int32]string{unknownOp25: "unknown-op", oldHeader25: "old-header"}[mode]
		t.Run(name, func(t *testing.T) {
			daemon, _, _ := remoteDaemon(t, "127.0.0.1:0")
			p := startOldProxy(t, daemon, mode)
			e := oldStack(t, p)
			if e.ReadsRanges() {
				t.Fatal("the tier reads ranges from a daemon without RETRIEVE_RANGES")
			}
			ctx := context.Background()
			data := noisy(11, 300_000)
			k := key(11)
			if err := e.Put(ctx, k, data); err != nil {
				t.Fatal(err)
			}
			direct := dialDirect(t, daemon)
			sizes, err := direct.Sizes(ctx, client.Raw([]chunk.Key{k}))
			if err != nil || len(sizes) != 1 || int(sizes[0]) != codec.HeaderSize+len(data) {
				t.Fatalf("stored object: %v, %v; want an unpieced object of %d bytes", sizes, err, codec.HeaderSize+len(data))
			}
			retrieves := p.count(wire.OpRetrieve)
			if n, ok := e.Size(k); !ok || n != len(data) {
				t.Fatalf("Size = %d, %v", n, ok)
			}
			if got := p.count(wire.OpRetrieve); got != retrieves {
				t.Fatalf("Size sent %d RETRIEVEs: it read the whole object", got-retrieves)
			}
			promote(t, e, k, data)
			stream(t, e, k, data)
			if got := p.count(wire.OpRetrieveRanges); got != 1 {
				t.Fatalf("%d RETRIEVE_RANGES requests, want the one when the tier opened", got)
			}
			if st := e.Stats(); st.Corrupt != 0 {
				t.Fatalf("%d objects counted corrupt", st.Corrupt)
			}
			if h := remote.GuardOf(e).Health(); h.State != remote.StateClosed || h.Failures != 0 {
				t.Fatalf("breaker %+v after reads that all worked", h)
			}
		})
	}
}

// TestDaemonDowngradedUnderTheTier: the daemon loses RETRIEVE_RANGES
// while the tier is open (replaced by an older build behind the same
// address). The next range read finds out, is served whole with the
// right bytes, and from then on the tier reads, sizes and stores as
// against an older daemon from the start.
func TestDaemonDowngradedUnderTheTier(t *testing.T) {
	for _, mode := range []int32{unknownOp25, oldHeader25} {
		name := map[int32]string{unknownOp25: "unknown-op", oldHeader25: "old-header"}[mode]
		t.Run(name, func(t *testing.T) {
			daemon, _, _ := remoteDaemon(t, "127.0.0.1:0")
			p := startOldProxy(t, daemon, passOp25)
			e := oldStack(t, p)
			if !e.ReadsRanges() {
				t.Fatal("the tier does not read ranges from a daemon of today")
			}
			ctx := context.Background()
			data := noisy(12, 300_000)
			k := key(12)
			if err := e.Put(ctx, k, data); err != nil { // pieced
				t.Fatal(err)
			}
			p.mode.Store(mode)
			// The first range read after the change is the header's, for
			// Size: refused, then read whole, so the size is right.
			promote(t, e, k, data)
			if e.ReadsRanges() {
				t.Fatal("the tier still reads ranges after the daemon refused them")
			}
			ranges := p.count(wire.OpRetrieveRanges)
			data2 := noisy(13, 300_000)
			k2 := key(13)
			if err := e.Put(ctx, k2, data2); err != nil {
				t.Fatal(err)
			}
			direct := dialDirect(t, daemon)
			sizes, err := direct.Sizes(ctx, client.Raw([]chunk.Key{k2}))
			if err != nil || len(sizes) != 1 || int(sizes[0]) != codec.HeaderSize+len(data2) {
				t.Fatalf("stored after the change: %v, %v; want an unpieced object", sizes, err)
			}
			promote(t, e, k2, data2)
			stream(t, e, k2, data2)
			if got := p.count(wire.OpRetrieveRanges); got != ranges {
				t.Fatalf("%d more RETRIEVE_RANGES after the daemon refused them", got-ranges)
			}
			// The pieced object written before cannot be sized without a
			// range read any more: it is a miss, never wrong bytes.
			if n, ok := e.Size(k); ok {
				dst := make([]byte, n)
				if got, err := e.Get(ctx, k, dst); err == nil && (got != len(data) || !bytes.Equal(dst[:got], data)) {
					t.Fatal("the pieced object read back with wrong bytes")
				}
			}
		})
	}
}

func dialDirect(t *testing.T, addr string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.DialTCP(ctx, addr, client.Options{Token: token, Name: "kvtier-test", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
