package server_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// layered returns a RECEIVE_LAYERS request for n chunks of size bytes
// from pdKeys(n, salt), sent layer by layer under 4 layers × 2 parts, and
// the chunks' bytes.
func layered(t testing.TB, n int, salt byte, size int) (*wire.ReceiveLayers, [][]byte) {
	t.Helper()
	keys := pdKeys(n, salt)
	m := &wire.ReceiveLayers{Receive: wire.Receive{Transfer: 5, HoldMS: 5000, Keys: wire.Keys{Kind: wire.KindRaw, Raw: keys}}}
	chunks := make([][]byte, n)
	for j := range chunks {
		chunks[j] = chunkData(j, uint32(salt), size)
		m.Sizes = append(m.Sizes, uint32(size))
	}
	if !m.RangesFor(4, 2, 1) {
		t.Fatalf("%d bytes do not split into 8 spans", size)
	}
	return m, chunks
}

// waitFreed waits until the consumer holds no pushed bytes and pins no
// arena bytes: what a failed request reserved is given back.
func waitFreed(t testing.TB, d *daemon, c *client.Client, held int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.svc.HeldBytes() != held || arenaPinned(t, c) != held {
		if time.Now().After(deadline) {
			t.Fatalf("holds %d bytes (want %d), pins %d", d.svc.HeldBytes(), held, arenaPinned(t, c))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReceiveLayersByteExact(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c, cc := cons.remote(t), cons.local(t)
	ctx := context.Background()
	m, chunks := layered(t, 3, 4, 4096)
	var order []int
	n, err := c.ReceiveLayers(ctx, m, chunks, func(i int) error { order = append(order, i); return nil }, nil)
	if err != nil || n != 3 {
		t.Fatalf("receive layers: %d, %v", n, err)
	}
	if len(order) != 24 || order[23] != 23 {
		t.Fatalf("ready called for %v", order)
	}
	if held := cons.svc.HeldBytes(); held != 3*4096 {
		t.Fatalf("holds %d bytes, want 3 chunks", held)
	}
	checkRaw(t, cc, m.Keys.Raw, 4, 4096)
	waitFreed(t, cons, cc, 0) // read once: the holds end
	// A chunk in RAM already is held, its ranges dropped; the others land.
	storeRaw(t, c, pdKeys(1, 6), 6, 4096)
	m, chunks = layered(t, 2, 6, 4096)
	if n, err := c.ReceiveLayers(ctx, m, chunks, nil, nil); err != nil || n != 2 {
		t.Fatalf("receive layers over a stored chunk: %d, %v", n, err)
	}
	checkRaw(t, cc, m.Keys.Raw, 6, 4096)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReceiveLayersDamagedRange(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c, cc := cons.remote(t), cons.local(t)
	ctx := context.Background()
	for _, tc := range []struct {
		damaged int // range index
		stored  int // leading chunks visible after
	}{
		{damaged: 8, stored: 0},  // layer 1 of chunk 1: no chunk complete
		{damaged: 23, stored: 2}, // V_3 of chunk 2, the last range: chunks 0 and 1 complete
	} {
		m, chunks := layered(t, 3, byte(10+tc.damaged), 4096)
		sums := make([]uint64, len(m.Ranges))
		for i, r := range m.Ranges {
			sums[i] = wire.Checksum(chunks[r.Key][r.From:r.To])
		}
		sums[tc.damaged] ^= 1
		_, err := c.ReceiveLayers(ctx, m, chunks, nil, sums)
		if !client.IsStatus(err, wire.StatusBadRequest) || !strings.Contains(err.Error(), "checksum") {
			t.Fatalf("damaged range %d: %v", tc.damaged, err)
		}
		if l, err := cc.Lookup(ctx, client.Raw(m.Keys.Raw), 0); err != nil || int(l.Chunks) != tc.stored {
			t.Fatalf("damaged range %d: %d chunks visible, %v; want %d", tc.damaged, l.Chunks, err, tc.stored)
		}
		waitFreed(t, cons, cc, int64(tc.stored)*4096)
		if tc.stored > 0 {
			checkRaw(t, cc, m.Keys.Raw[:tc.stored], uint32(10+tc.damaged), 4096)
		}
		if err := c.Ping(ctx); err != nil { // the stream stayed in step
			t.Fatal(err)
		}
	}
}

// TestReceiveLayersProducerDies: a producer that stops halfway through
// the layers (its connection closed) leaves nothing visible and nothing
// reserved or charged on the consumer.
func TestReceiveLayersProducerDies(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c, cc := cons.remote(t), cons.local(t)
	m, chunks := layered(t, 3, 20, 4096)
	gone := errors.New("the producer died")
	_, err := c.ReceiveLayers(context.Background(), m, chunks, func(i int) error {
		if i == 13 {
			return gone
		}
		return nil
	}, nil)
	if !errors.Is(err, gone) {
		t.Fatalf("receive layers cut at range 13: %v", err)
	}
	waitFreed(t, cons, cc, 0)
	if l, err := cc.Lookup(context.Background(), client.Raw(m.Keys.Raw), 0); err != nil || l.Chunks != 0 {
		t.Fatalf("after a cut push: %d chunks visible, %v", l.Chunks, err)
	}
}

// TestReceiveLayersRefusesBadTables: a table that does not cover its
// chunks is refused before any byte is reserved, and the connection
// closes (its data frames cannot be skipped safely).
func TestReceiveLayersRefusesBadTables(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	cc := cons.local(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		bad  func(m *wire.ReceiveLayers)
	}{
		{"gap", func(m *wire.ReceiveLayers) { m.Ranges[3].To-- }},                        // a byte of chunk 1 never sent
		{"overlap", func(m *wire.ReceiveLayers) { m.Ranges[3].From = m.Ranges[2].From }}, // bytes of chunk 1 sent twice
	} {
		m, _ := layered(t, 2, 30, 4096)
		tc.bad(m)
		// The metadata frame alone, raw: the daemon answers before any
		// data frame, which a client would still be writing.
		conn, rd := rawSession(t, cons.tcp)
		if _, err := conn.Write(frame(wire.OpReceiveLayers, wire.FlagMore, 9, m.Append(nil))); err != nil {
			t.Fatal(err)
		}
		h, body, err := rd.Next()
		if err != nil || h.Status != wire.StatusBadRequest {
			t.Fatalf("%s: a bad table answered %+v %q %v, want BAD_REQUEST", tc.name, h, body, err)
		}
		if _, err := rd.Header(); err == nil {
			t.Fatalf("%s: the connection stayed open after a table whose frames cannot be skipped", tc.name)
		}
		conn.Close()
		if cons.svc.HeldBytes() != 0 || arenaPinned(t, cc) != 0 {
			t.Fatalf("%s: %d bytes charged, %d pinned after a refused table", tc.name, cons.svc.HeldBytes(), arenaPinned(t, cc))
		}
		if l, err := cc.Lookup(ctx, client.Raw(m.Keys.Raw), 0); err != nil || l.Chunks != 0 {
			t.Fatalf("%s: %d chunks visible, %v", tc.name, l.Chunks, err)
		}
	}
}

// rawSession opens a TCP connection to addr and completes HELLO with the
// test token by hand, so the test can send frames no client would.
func rawSession(t *testing.T, addr string) (net.Conn, *wire.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	hello := wire.Hello{Version: wire.Version, Token: testToken, Name: "raw"}
	rd := wire.NewReader(conn)
	if _, err := conn.Write(frame(wire.OpHello, 0, 0, hello.Append(nil))); err != nil {
		t.Fatal(err)
	}
	if h, _, err := rd.Next(); err != nil || h.Status != wire.StatusOK {
		t.Fatalf("HELLO: %+v %v", h, err)
	}
	return conn, rd
}

// TestInProgressFlagIsWaits: the IN_PROGRESS header flag on any op but
// WAIT is refused with BAD_REQUEST and the connection closed (the
// request's body is not read), rather than ignored.
func TestInProgressFlagIsWaits(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	for _, op := range []wire.Op{wire.OpPing, wire.OpLookup} {
		conn, rd := rawSession(t, cons.tcp)
		if _, err := conn.Write(frame(op, wire.FlagInProgress, 9, nil)); err != nil {
			t.Fatal(err)
		}
		h, body, err := rd.Next()
		if err != nil || h.Status != wire.StatusBadRequest || !strings.Contains(string(body), "in-progress") {
			t.Fatalf("%s with IN_PROGRESS: %+v %q %v", op, h, body, err)
		}
		if _, err := rd.Header(); err == nil {
			t.Fatalf("%s with IN_PROGRESS: the connection stayed open", op)
		}
		conn.Close()
	}
	// WAIT takes it.
	c := cons.remote(t)
	if w, err := c.WaitInProgress(context.Background(), client.Raw(pdKeys(1, 31)), 0, 0); err != nil || w.Chunks != 0 {
		t.Fatalf("WAIT with IN_PROGRESS: %+v, %v", w, err)
	}
}
