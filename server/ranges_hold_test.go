package server_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// holdChunk is large enough that a reply of all of it cannot sit in the
// socket buffers of a loopback connection whose reader does not read, so
// that the daemon's write blocks while it holds the chunk's scratch
// buffer.
const holdChunk = 16 << 20

// diskOnlyDaemon serves an engine with a disk tier over loopback TCP and
// puts one chunk of holdChunk bytes on its disk only.
func diskOnlyDaemon(t *testing.T, opts server.ServiceOptions) (*engine.Engine, *server.Service, string, chunk.Key, []byte) {
	t.Helper()
	return diskOnlyDaemonOn(t, opts, nil)
}

// diskOnlyDaemonOn is diskOnlyDaemon serving wrap(the listener) when wrap
// is not nil.
func diskOnlyDaemonOn(t *testing.T, opts server.ServiceOptions, wrap func(net.Listener) net.Listener) (*engine.Engine, *server.Service, string, chunk.Key, []byte) {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 96 << 20, Policy: "LRU",
		DiskDir: t.TempDir(), DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	opts.Token = testToken
	svc := server.NewService(eng, opts)
	ln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
		<-served
		eng.Close()
	})
	data := make([]byte, holdChunk)
	r := rand.New(rand.NewPCG(5, 5))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	k := chunk.Key{Scope: 0xfeed, Hash: chunk.Hash{42}}
	c := dialTCP(t, ln.Addr().String())
	ctx := context.Background()
	if n, err := c.Store(ctx, client.Raw([]chunk.Key{k}), [][]byte{data}); n != 1 || err != nil {
		t.Fatalf("store: %d, %v", n, err)
	}
	c.Close()
	if err := eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	eng.Manager().RAM().Remove(k)
	if eng.InRAM(k) {
		t.Fatal("the chunk is still in RAM")
	}
	return eng, svc, ln.Addr().String(), k, data
}

func dialTCP(t *testing.T, addr string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.DialTCP(ctx, addr, client.Options{Token: testToken, Name: "ranges-hold-test", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// stall opens a connection, says HELLO and waits for the reply, so that
// the daemon counts it, then asks for every byte of k by ranges and
// reads nothing more.
func stall(t *testing.T, addr string, k chunk.Key) (net.Conn, *wire.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	hello := (&wire.Hello{Version: wire.Version, Token: testToken}).Append(nil)
	conn.Write(frame(wire.OpHello, 0, 1, hello))
	rd := wire.NewReader(conn)
	if h, _, err := rd.Next(); err != nil || h.Status != wire.StatusOK || h.Op != wire.OpHello {
		t.Fatalf("hello reply %+v, %v", h, err)
	}
	req := (&wire.RetrieveRanges{Keys: client.Raw([]chunk.Key{k}),
		Ranges: []wire.ByteRange{{Key: 0, From: 0, To: holdChunk}}}).Append(nil)
	conn.Write(frame(wire.OpRetrieveRanges, 0, 2, req))
	return conn, rd
}

// waitInUse waits until the requests holding scratch memory are want, a
// state the test's own requests lead to; the bound is only against a
// hang.
func waitInUse(t *testing.T, eng *engine.Engine, want int) {
	t.Helper()
	for start := time.Now(); eng.RangeBuffersInUse() != want; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("%d requests hold scratch memory, want %d", eng.RangeBuffersInUse(), want)
		}
	}
}

// TestRangesStalledReadersDoNotBlockOthers: connections that ask for all
// of a disk chunk by ranges and stop reading hold all the scratch memory
// (eight of them, 16 MiB each). Another reader does not wait for some:
// its RETRIEVE_RANGES is served, with the stored bytes, from the chunk
// promoted whole into RAM, while the stalled ones keep theirs. Closing
// the stalled connections frees it.
func TestRangesStalledReadersDoNotBlockOthers(t *testing.T) {
	eng, _, addr, k, data := diskOnlyDaemon(t, server.ServiceOptions{RangeWriteTimeout: time.Hour})
	stalled := engine.RangeScratchBytes / holdChunk
	conns := make([]net.Conn, stalled)
	for i := range conns {
		conns[i], _ = stall(t, addr, k)
	}
	waitInUse(t, eng, stalled)
	if eng.InRAM(k) {
		t.Fatal("a stalled reader's chunk was promoted")
	}
	c := dialTCP(t, addr)
	ranges := []wire.ByteRange{{Key: 0, From: 0, To: 4096}, {Key: 0, From: holdChunk / 2, To: holdChunk/2 + 100_000}, {Key: 0, From: holdChunk - 10, To: holdChunk}}
	bufs := make([][]byte, len(ranges))
	for i, br := range ranges {
		bufs[i] = make([]byte, br.To-br.From)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, n, err := c.RetrieveRangesTo(ctx, client.Raw([]chunk.Key{k}), ranges, bufs); n != len(ranges) || err != nil {
		t.Fatalf("the reader after the stalled ones: %d ranges, %v", n, err)
	}
	for i, br := range ranges {
		if !bytes.Equal(bufs[i], data[br.From:br.To]) {
			t.Fatalf("range %d: wrong bytes", i)
		}
	}
	if !eng.InRAM(k) {
		t.Fatal("the reader after the stalled ones was not served from a promotion")
	}
	if got := eng.RangeBuffersInUse(); got != stalled || eng.RangeScratchInUse() != engine.RangeScratchBytes {
		t.Fatalf("%d requests hold %d bytes of scratch, want the %d stalled ones all of it", got, eng.RangeScratchInUse(), stalled)
	}
	for _, conn := range conns {
		conn.Close()
	}
	waitInUse(t, eng, 0)
}

// TestRangesStalledReaderCutOff: a reader that stops reading a reply of
// ranges served from a scratch buffer is cut off once the reply's write
// deadline (RangeWriteTimeout plus its bytes at 64 MiB/s) has passed,
// though the connection stays open on its side, and the buffer is free
// again; no WriteTimeout (an hour here) per frame keeps it. What the
// reader did receive is the start of the reply, then the end of the
// stream.
func TestRangesStalledReaderCutOff(t *testing.T) {
	eng, svc, addr, k, _ := diskOnlyDaemon(t, server.ServiceOptions{RangeWriteTimeout: 50 * time.Millisecond, WriteTimeout: time.Hour})
	waitConns := func(want int64) {
		t.Helper()
		for start := time.Now(); svc.Connections() != want; time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > 60*time.Second {
				t.Fatalf("%d connections open, want %d", svc.Connections(), want)
			}
		}
	}
	waitConns(0) // the store's client is closed by now or soon
	rds := make([]*wire.Reader, 4)
	for i := range rds {
		_, rds[i] = stall(t, addr, k)
	}
	// The daemon closes the four connections it could not write to.
	waitConns(0)
	waitInUse(t, eng, 0)
	for i, rd := range rds {
		h, _, err := rd.Next()
		if err != nil || h.Op != wire.OpRetrieveRanges || h.Flags&wire.FlagMore == 0 {
			t.Fatalf("conn %d: ranges reply %+v, %v", i, h, err)
		}
		dh, err := rd.Header()
		if err != nil {
			continue // cut before the data frame's header
		}
		if dh.Len != holdChunk {
			t.Fatalf("conn %d: data frame of %d bytes", i, dh.Len)
		}
		if err := rd.ReadData(dh, make([]byte, holdChunk)); err == nil {
			t.Fatalf("conn %d: the whole reply arrived; the stall did not hold the write", i)
		}
	}
}
