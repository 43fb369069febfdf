package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// pdKeys returns n raw keys of one made-up scope; salt keeps sets apart.
func pdKeys(n int, salt byte) []chunk.Key {
	keys := make([]chunk.Key, n)
	for i := range keys {
		keys[i] = chunk.Key{Scope: 77, Hash: chunk.Hash{salt, byte(i), byte(i >> 8), 1}}
	}
	return keys
}

// storeRaw stores chunkData(j, salt, size) under keys[j] over c.
func storeRaw(t testing.TB, c *client.Client, keys []chunk.Key, salt uint32, size int) {
	t.Helper()
	chunks := make([][]byte, len(keys))
	for j := range chunks {
		chunks[j] = chunkData(j, salt, size)
	}
	n, err := c.Store(context.Background(), client.Raw(keys), chunks)
	if err != nil || n != len(keys) {
		t.Fatalf("store: %d of %d, %v", n, len(keys), err)
	}
}

// checkRaw reads keys over c and compares them with chunkData.
func checkRaw(t testing.TB, c *client.Client, keys []chunk.Key, salt uint32, size int) {
	t.Helper()
	dst := make([][]byte, len(keys))
	for j := range dst {
		dst[j] = make([]byte, size)
	}
	n, _, err := c.Retrieve(context.Background(), client.Raw(keys), dst)
	if err != nil || n != len(keys) {
		t.Fatalf("retrieve: %d of %d, %v", n, len(keys), err)
	}
	for j := range dst {
		if !bytes.Equal(dst[j], chunkData(j, salt, size)) {
			t.Fatalf("chunk %d differs from what the producer stored", j)
		}
	}
}

// waitPushed polls PUSH_STATUS until transfer id has ended.
func waitPushed(t testing.TB, c *client.Client, id uint64) wire.PushStatusReply {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.PushStatus(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != wire.TransferPending {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfer %d still pending: %+v", id, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// arenaPinned is the bytes of the daemon's arena held by more than their
// owner's reference, from STATS.
func arenaPinned(t testing.TB, c *client.Client) int64 {
	t.Helper()
	raw, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Arena struct {
			Pinned int64 `json:"pinned_bytes"`
		} `json:"arena"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	return st.Arena.Pinned
}

func TestPushCarriesChunksByteExact(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, server.ServiceOptions{})
	pc, cc := prod.local(t), cons.local(t)
	ctx := context.Background()
	keys := pdKeys(40, 1)
	storeRaw(t, prod.remote(t), keys, 5, pChunkBytes)
	// Two PUSHes, as a connector saving layer by layer would send them.
	if n, err := pc.Push(ctx, 9, cons.tcp, client.Raw(keys[:25]), 0, false); err != nil || n != 25 {
		t.Fatalf("push: %d, %v", n, err)
	}
	if n, err := pc.Push(ctx, 9, cons.tcp, client.Raw(keys[25:]), 0, true); err != nil || n != 40 {
		t.Fatalf("push: %d, %v", n, err)
	}
	st := waitPushed(t, pc, 9)
	if st.State != wire.TransferDone || st.Pushed != 40 || st.Queued != 40 {
		t.Fatalf("status %+v", st)
	}
	w, err := cc.Wait(ctx, client.Raw(keys), 0, 1000)
	if err != nil || w.Chunks != 40 {
		t.Fatalf("wait: %+v %v", w, err)
	}
	if cons.svc.HeldBytes() != 40*pChunkBytes {
		t.Fatalf("consumer holds %d bytes, want %d", cons.svc.HeldBytes(), 40*pChunkBytes)
	}
	checkRaw(t, cons.remote(t), keys, 5, pChunkBytes)
	if cons.svc.HeldBytes() != 0 {
		t.Fatalf("consumer still holds %d bytes after the chunks were read", cons.svc.HeldBytes())
	}
	waitFor(t, "producer references dropped", func() bool { return arenaPinned(t, pc) == 0 })
	// A transfer that ended takes no more chunks.
	if _, err := pc.Push(ctx, 9, cons.tcp, client.Raw(keys[:1]), 0, true); !client.IsStatus(err, wire.StatusBadRequest) {
		t.Fatalf("push to an ended transfer: %v", err)
	}
	if _, err := pc.PushStatus(ctx, 12345); !client.IsStatus(err, wire.StatusNotFound) {
		t.Fatalf("status of an unknown transfer: %v", err)
	}
}

// TestWaitReturnsAsChunksArrive: a WAIT sent before the push returns once
// the chunks are in, and a WAIT for chunks that never come returns the
// part that is there when its time is up.
func TestWaitReturnsAsChunksArrive(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 64<<20, server.ServiceOptions{})
	ctx := context.Background()
	keys := pdKeys(8, 2)
	storeRaw(t, prod.remote(t), keys, 6, pChunkBytes)
	got := make(chan wire.WaitReply, 1)
	go func() {
		c, err := client.DialTCP(ctx, cons.tcp, client.Options{Token: testToken, Timeout: time.Minute})
		if err != nil {
			t.Error(err)
			got <- wire.WaitReply{}
			return
		}
		defer c.Close()
		w, err := c.Wait(ctx, client.Raw(keys), 0, 30000)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	time.Sleep(50 * time.Millisecond) // let the WAIT start first; the result does not depend on it
	pc := prod.local(t)
	if _, err := pc.Push(ctx, 3, cons.tcp, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	if w := <-got; w.Chunks != 8 {
		t.Fatalf("wait: %+v", w)
	}
	w, err := cons.remote(t).Wait(ctx, client.Raw(append(keys[:4:4], pdKeys(2, 3)...)), 0, 20)
	if err != nil || w.Chunks != 4 {
		t.Fatalf("wait for missing chunks: %+v %v", w, err)
	}
	// A wait of 0 answers at once with the run that is there, not with nothing.
	w, err = cons.remote(t).Wait(ctx, client.Raw(append(keys[:4:4], pdKeys(2, 3)...)), 0, 0)
	if err != nil || w.Chunks != 4 {
		t.Fatalf("wait of 0 ms: %+v %v", w, err)
	}
}

// TestPushBackpressure: a consumer whose budget holds 4 chunks takes a
// push of 32 in steps as its reader takes them; it never holds more than
// the budget, and chunks it held before are not evicted.
func TestPushBackpressure(t *testing.T) {
	const budget = 4 * pChunkBytes
	prod := startService(t, 64<<20, server.ServiceOptions{})
	cons := startService(t, 16<<20, server.ServiceOptions{PDReceiveBytes: budget})
	ctx := context.Background()
	others := pdKeys(64, 4) // 4 MiB the consumer's other requests use
	storeRaw(t, cons.remote(t), others, 7, pChunkBytes)
	keys := pdKeys(32, 5)
	storeRaw(t, prod.remote(t), keys, 8, pChunkBytes)
	pc, cc := prod.local(t), cons.remote(t)
	if _, err := pc.Push(ctx, 4, cons.tcp, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	read := 0
	for read < len(keys) {
		w, err := cc.Wait(ctx, client.Raw(keys[read:]), 1, 5000)
		if err != nil || w.Chunks == 0 {
			t.Fatalf("wait after %d chunks: %+v %v", read, w, err)
		}
		if held := cons.svc.HeldBytes(); held > budget {
			t.Fatalf("consumer holds %d bytes, budget %d", held, budget)
		}
		if int(w.Chunks) > budget/pChunkBytes {
			t.Fatalf("%d chunks arrived at once with room for %d", w.Chunks, budget/pChunkBytes)
		}
		// Read one at a time: each frees room for the next.
		checkRawAt(t, cc, keys[read:read+1], read, 8)
		read++
	}
	if st := waitPushed(t, pc, 4); st.State != wire.TransferDone || st.Pushed != 32 {
		t.Fatalf("status %+v", st)
	}
	if n, err := cc.Lookup(ctx, client.Raw(others), 0); err != nil || n.Chunks != uint32(len(others)) {
		t.Fatalf("the consumer's own chunks: %d of %d left, %v", n.Chunks, len(others), err)
	}
}

// checkRawAt reads keys (chunks first.. of the producer's set) and checks them.
func checkRawAt(t testing.TB, c *client.Client, keys []chunk.Key, first int, salt uint32) {
	t.Helper()
	dst := [][]byte{make([]byte, pChunkBytes)}
	for j, k := range keys {
		n, _, err := c.Retrieve(context.Background(), client.Raw([]chunk.Key{k}), dst)
		if err != nil || n != 1 || !bytes.Equal(dst[0], chunkData(first+j, salt, pChunkBytes)) {
			t.Fatalf("chunk %d: %d, %v (or wrong bytes)", first+j, n, err)
		}
	}
}

// TestPushFailuresLeakNothing: a destination nobody listens on, a wrong
// token, a stalled consumer that times the transfer out and a chunk the
// producer lacks each fail the transfer with a reason, and leave no
// references and no goroutines behind.
func TestPushFailuresLeakNothing(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	other := startService(t, 64<<20, server.ServiceOptions{Token: "another-token"})
	full := startService(t, 16<<20, server.ServiceOptions{PDReceiveBytes: 2 * pChunkBytes})
	pc := prod.local(t)
	ctx := context.Background()
	keys := pdKeys(16, 6)
	storeRaw(t, prod.remote(t), keys, 9, pChunkBytes)
	before := runtime.NumGoroutine()
	cases := []struct {
		id      uint64
		dest    string
		keys    []chunk.Key
		timeout uint32
		want    string
	}{
		{1, "127.0.0.1:1", keys, 0, "refused"},
		{2, other.tcp, keys, 0, "unauthorized"},
		{3, full.tcp, keys, 300, "timed out"},
	}
	for _, c := range cases {
		if _, err := pc.Push(ctx, c.id, c.dest, client.Raw(c.keys), c.timeout, true); err != nil {
			t.Fatal(err)
		}
		st := waitPushed(t, pc, c.id)
		if st.State != wire.TransferFailed || !strings.Contains(st.Message, c.want) {
			t.Errorf("transfer %d: %+v, want failed with %q", c.id, st, c.want)
		}
	}
	missing := append(keys[:2:2], pdKeys(1, 7)...)
	if _, err := pc.Push(ctx, 4, full.tcp, client.Raw(missing), 0, true); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("push of an uncached chunk: %v", err)
	}
	if st := waitPushed(t, pc, 4); st.State != wire.TransferFailed {
		t.Errorf("transfer 4: %+v", st)
	}
	waitFor(t, "producer references dropped", func() bool { return arenaPinned(t, pc) == 0 })
	waitFor(t, "push goroutines gone", func() bool { return runtime.NumGoroutine() <= before })
	// The consumer that timed out frees its budget once its holds lapse.
	waitFor(t, "consumer holds lapse", func() bool { return full.svc.HeldBytes() == 0 })
}

// TestReceiveChecksChecksums: a RECEIVE whose bytes do not match their
// checksum is refused and stores nothing from the damaged chunk on; the
// connection stays usable.
func TestReceiveChecksChecksums(t *testing.T) {
	cons := startService(t, 64<<20, server.ServiceOptions{})
	c := cons.remote(t)
	ctx := context.Background()
	keys := pdKeys(3, 8)
	chunks := [][]byte{chunkData(0, 1, 4096), chunkData(1, 1, 4096), chunkData(2, 1, 4096)}
	sums := []uint64{wire.Checksum(chunks[0]), wire.Checksum(chunks[1]) ^ 1, wire.Checksum(chunks[2])}
	_, err := c.Receive(ctx, 1, 1000, keys, chunks, sums)
	if !client.IsStatus(err, wire.StatusBadRequest) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("damaged chunk: %v", err)
	}
	if n, err := c.Lookup(ctx, client.Raw(keys), 0); err != nil || n.Chunks != 1 {
		t.Fatalf("after a damaged chunk 1: %d chunks visible, %v; want the good first one", n.Chunks, err)
	}
	if held := cons.svc.HeldBytes(); held != 4096 {
		t.Fatalf("holds %d bytes, want the one good chunk's 4096", held)
	}
	// A chunk over the whole budget is refused outright.
	small := startService(t, 16<<20, server.ServiceOptions{PDReceiveBytes: 1024})
	big := [][]byte{chunkData(0, 1, 4096)}
	if _, err := small.remote(t).Receive(ctx, 1, 1000, keys[:1], big, []uint64{wire.Checksum(big[0])}); !client.IsStatus(err, wire.StatusTooLarge) {
		t.Fatalf("chunk over the budget: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPushRedialsAStaleConnection: the producer keeps its connection to a
// consumer for the next transfer; when that consumer restarts on the same
// address, the next transfer dials again instead of failing.
func TestPushRedialsAStaleConnection(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	pc := prod.local(t)
	ctx := context.Background()
	keys := pdKeys(4, 40)
	storeRaw(t, prod.remote(t), keys, 41, 4096)
	first, stop, err := newDaemon(16<<20, server.ServiceOptions{}, "")
	if err != nil {
		t.Fatal(err)
	}
	addr := first.tcp
	if _, err := pc.Push(ctx, 1, addr, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	if st := waitPushed(t, pc, 1); st.State != wire.TransferDone {
		t.Fatalf("first transfer: %+v", st)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.Open(engine.Options{ChunkSize: pChunkTokens, RAMBytes: 16 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: testToken})
	ln, err := svc.ListenTCP(addr, nil)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	go svc.Serve(ln)
	t.Cleanup(func() {
		svc.Shutdown(context.Background())
		eng.Close()
	})
	if _, err := pc.Push(ctx, 2, addr, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	if st := waitPushed(t, pc, 2); st.State != wire.TransferDone || st.Pushed != 4 {
		t.Fatalf("transfer to the restarted consumer: %+v", st)
	}
}

// TestShutdownEndsWaitingReceives: a consumer whose budget is full, with
// a push waiting for room, shuts down cleanly instead of waiting for the
// transfer's deadline; the producer reports the transfer failed.
func TestShutdownEndsWaitingReceives(t *testing.T) {
	prod := startService(t, 64<<20, server.ServiceOptions{})
	pc := prod.local(t)
	ctx := context.Background()
	keys := pdKeys(8, 50)
	storeRaw(t, prod.remote(t), keys, 51, pChunkBytes)
	cons, _, err := newDaemon(16<<20, server.ServiceOptions{PDReceiveBytes: 2 * pChunkBytes}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cons.eng.Close()
	if _, err := pc.Push(ctx, 1, cons.tcp, client.Raw(keys), 600000, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer's budget to fill", func() bool { return cons.svc.HeldBytes() == 2*pChunkBytes })
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := cons.svc.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown with a RECEIVE waiting for budget: %v", err)
	}
	if held := cons.svc.HeldBytes(); held != 0 {
		t.Fatalf("the consumer still holds %d bytes after shutdown", held)
	}
	if st := waitPushed(t, pc, 1); st.State != wire.TransferFailed {
		t.Fatalf("transfer: %+v", st)
	}
}

// TestReceiveFrameWithoutChecksum: a RECEIVE data frame whose length is
// not the chunk's plus its checksum trailer cannot be trusted to end
// where the next frame starts: the daemon refuses it, closes the
// connection and stores and holds nothing.
func TestReceiveFrameWithoutChecksum(t *testing.T) {
	cons := startService(t, 16<<20, server.ServiceOptions{})
	conn, err := net.Dial("tcp", cons.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	keys := pdKeys(1, 60)
	data := chunkData(0, 1, 4096)
	meta := wire.Receive{Transfer: 1, Keys: client.Raw(keys), Sizes: []uint32{4096}}
	send := frame(wire.OpHello, 0, 1, (&wire.Hello{Version: wire.Version, Token: testToken}).Append(nil))
	send = append(send, frame(wire.OpReceive, wire.FlagMore, 2, meta.Append(nil))...)
	send = append(send, frame(wire.OpReceive, 0, 2, data)...) // no trailer
	if _, err := conn.Write(send); err != nil {
		t.Fatal(err)
	}
	rd := wire.NewReader(conn)
	if h, _, err := rd.Next(); err != nil || h.Op != wire.OpHello || h.Status != wire.StatusOK {
		t.Fatalf("hello: %+v %v", h, err)
	}
	h, body, err := rd.Next()
	if err != nil || h.Status != wire.StatusBadRequest {
		t.Fatalf("RECEIVE without a checksum: %+v %q %v", h, body, err)
	}
	if _, err := rd.Header(); err == nil {
		t.Error("the connection stayed open")
	}
	if n, err := cons.remote(t).Lookup(context.Background(), client.Raw(keys), 0); err != nil || n.Chunks != 0 {
		t.Fatalf("%d chunks stored, %v", n.Chunks, err)
	}
	if held := cons.svc.HeldBytes(); held != 0 {
		t.Fatalf("holds %d bytes", held)
	}
}
