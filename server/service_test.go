package server_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

const (
	pChunkTokens = 16
	pChunkBytes  = 64 << 10
	testToken    = "s3cret-token"
)

var pScope = chunk.Scope{Model: "llama", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

// daemon is an engine served over a local socket and a loopback TCP port.
type daemon struct {
	eng  *engine.Engine
	svc  *server.Service
	sock string
	tcp  string
}

func startService(t testing.TB, ramBytes int64, opts server.ServiceOptions) *daemon {
	t.Helper()
	return startServing(t, lruEngine(ramBytes), opts, filepath.Join(t.TempDir(), "kvtier.sock"))
}

// startServing is startService with the engine's options given, serving
// on sock too unless it is "".
func startServing(t testing.TB, eopts engine.Options, opts server.ServiceOptions, sock string) *daemon {
	t.Helper()
	d, stop, err := newDaemonWith(eopts, opts, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// newDaemon starts an engine and serves it on sock and a loopback TCP
// port; stop shuts it all down.
func newDaemon(ramBytes int64, opts server.ServiceOptions, sock string) (*daemon, func() error, error) {
	return newDaemonWith(lruEngine(ramBytes), opts, sock)
}

// lruEngine is the tests' usual engine: chunks of pChunkTokens, a RAM
// tier of ramBytes evicted by LRU.
func lruEngine(ramBytes int64) engine.Options {
	return engine.Options{ChunkSize: pChunkTokens, RAMBytes: ramBytes, Policy: "LRU", SaveUnfull: true}
}

// newDaemonWith is newDaemon with the engine's options given.
func newDaemonWith(eopts engine.Options, opts server.ServiceOptions, sock string) (*daemon, func() error, error) {
	eng, err := engine.Open(eopts)
	if err != nil {
		return nil, nil, err
	}
	if opts.Token == "" {
		opts.Token = testToken
	}
	svc := server.NewService(eng, opts)
	d := &daemon{eng: eng, svc: svc, sock: sock}
	var lns []net.Listener
	if sock != "" {
		uln, err := server.ListenUnix(d.sock, 0)
		if err != nil {
			return nil, nil, errors.Join(err, eng.Close())
		}
		lns = append(lns, uln)
	}
	tln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		return nil, nil, errors.Join(err, eng.Close())
	}
	d.tcp = tln.Addr().String()
	lns = append(lns, tln)
	served := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { served <- svc.Serve(ln) }()
	}
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		errs := []error{svc.Shutdown(ctx)}
		for range lns {
			errs = append(errs, <-served)
		}
		return errors.Join(append(errs, eng.Close())...)
	}
	return d, stop, nil
}

func (d *daemon) local(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.DialUnix(context.Background(), d.sock, client.Options{Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (d *daemon) remote(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.DialTCP(context.Background(), d.tcp, client.Options{Token: testToken, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func prompt(n int, salt uint32) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(i)*7 + salt
	}
	return p
}

// chunkData is deterministic content for chunk j of a prompt.
func chunkData(j int, salt uint32, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(uint32(i*31+j*17) + salt)
	}
	return b
}

func sizesOf(n, size int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(size)
	}
	return s
}

// storeLocal stores the chunks of tokens through the zero-copy path.
func storeLocal(t testing.TB, c *client.Client, handle uint32, tokens []uint32, salt uint32) int {
	t.Helper()
	ctx := context.Background()
	n := (len(tokens) + pChunkTokens - 1) / pChunkTokens
	slots, err := c.PrepareStore(ctx, client.Tokens(handle, tokens, 0), sizesOf(n, pChunkBytes), 0)
	if err != nil {
		t.Fatal(err)
	}
	for j, s := range slots.Slots {
		if s.State != wire.SlotWrite {
			continue
		}
		dst, err := c.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		copy(dst, chunkData(j, salt, pChunkBytes))
	}
	got, err := c.CommitStore(ctx, slots.Lease, len(slots.Slots))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestLocalStoreLookupRetrieve(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	c := d.local(t)
	ctx := context.Background()
	if !c.Local() || c.ChunkTokens() != pChunkTokens {
		t.Fatalf("local=%v chunk tokens=%d", c.Local(), c.ChunkTokens())
	}
	h, err := c.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(5*pChunkTokens+3, 1) // 5 whole chunks and a partial one
	hit, err := c.Lookup(ctx, client.Tokens(h, tokens, 0), 0)
	if err != nil || hit.Tokens != 0 || hit.Chunks != 0 {
		t.Fatalf("lookup before store: %+v %v", hit, err)
	}
	if n := storeLocal(t, c, h, tokens, 1); n != 6 {
		t.Fatalf("stored %d chunks, want 6", n)
	}
	hit, err = c.Lookup(ctx, client.Tokens(h, tokens, 0), 0)
	if err != nil || hit.Tokens != uint32(len(tokens)) || hit.Chunks != 6 || hit.ByTier[0] != 6 || hit.Lease != 0 {
		t.Fatalf("lookup after store: %+v %v", hit, err)
	}

	// Retrieve from chunk 2 on (the engine holds the first two already).
	slots, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 2*pChunkTokens), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(slots.Slots) != 4 || slots.Tokens != uint32(len(tokens)-2*pChunkTokens) {
		t.Fatalf("retrieve: %d slots covering %d tokens", len(slots.Slots), slots.Tokens)
	}
	for j, s := range slots.Slots {
		got, err := c.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, chunkData(j+2, 1, pChunkBytes)) {
			t.Fatalf("chunk %d: wrong bytes", j+2)
		}
	}
	if p := d.eng.Arena().Pinned(); p == 0 {
		t.Error("a retrieve lease pins nothing")
	}
	if err := c.Release(ctx, slots.Lease); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, slots.Lease); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("second release: %v, want not found", err)
	}
	if p := d.eng.Arena().Pinned(); p != 0 {
		t.Errorf("%d bytes pinned after release", p)
	}

	// Another prompt that shares the first three chunks.
	other := append(append([]uint32(nil), tokens[:3*pChunkTokens]...), prompt(40, 9)...)
	hit, err = c.Lookup(ctx, client.Tokens(h, other, 0), 0)
	if err != nil || hit.Chunks != 3 || hit.Tokens != 3*pChunkTokens {
		t.Fatalf("shared prefix: %+v %v", hit, err)
	}
}

func TestTCPStoreRetrieveMatchesLocal(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	r := d.remote(t)
	l := d.local(t)
	ctx := context.Background()
	if r.Local() {
		t.Fatal("a TCP client claims the shared arena")
	}
	hr, err := r.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(4*pChunkTokens, 2)
	chunks := make([][]byte, 4)
	for j := range chunks {
		chunks[j] = chunkData(j, 2, pChunkBytes)
	}
	if n, err := r.Store(ctx, client.Tokens(hr, tokens, 0), chunks); n != 4 || err != nil {
		t.Fatalf("TCP store: %d %v", n, err)
	}
	// Stored over TCP, visible over the local socket: the same keys.
	hl, err := l.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	if hit, err := l.Lookup(ctx, client.Tokens(hl, tokens, 0), 0); err != nil || hit.Chunks != 4 {
		t.Fatalf("local lookup of TCP-stored chunks: %+v %v", hit, err)
	}
	dst := make([][]byte, 4)
	for j := range dst {
		dst[j] = make([]byte, pChunkBytes)
	}
	n, tok, err := r.Retrieve(ctx, client.Tokens(hr, tokens, pChunkTokens), dst)
	if err != nil || n != 3 || tok != 3*pChunkTokens {
		t.Fatalf("TCP retrieve: %d chunks %d tokens %v", n, tok, err)
	}
	for j := range n {
		if !bytes.Equal(dst[j], chunks[j+1]) {
			t.Fatalf("chunk %d differs", j+1)
		}
	}
	// The zero-copy operations need the shared arena.
	if _, err := r.PrepareStore(ctx, client.Tokens(hr, tokens, 0), sizesOf(1, 8), 0); !client.IsStatus(err, wire.StatusUnsupported) {
		t.Errorf("PREPARE_STORE over TCP: %v, want unsupported", err)
	}
	// The connection still works after a refused request.
	if err := r.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// Raw keys, as a daemon using this one as its remote tier sends them.
	id, err := d.eng.ScopeID(pScope)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := chunk.NewChunker(pScope, pChunkTokens, true)
	keys := c.Keys(nil, tokens)
	if keys[0].Scope != id {
		t.Fatal("scope ids disagree")
	}
	n, _, err = r.Retrieve(ctx, client.Raw(keys[2:]), dst)
	if err != nil || n != 2 || !bytes.Equal(dst[0], chunks[2]) {
		t.Fatalf("raw-key retrieve: %d %v", n, err)
	}
}

func TestTCPRequiresToken(t *testing.T) {
	d := startService(t, 4<<20, server.ServiceOptions{})
	ctx := context.Background()
	_, err := client.DialTCP(ctx, d.tcp, client.Options{Token: "wrong"})
	if !client.IsStatus(err, wire.StatusUnauthorized) {
		t.Fatalf("wrong token: %v, want unauthorized", err)
	}
	_, err = client.DialTCP(ctx, d.tcp, client.Options{})
	if !client.IsStatus(err, wire.StatusUnauthorized) {
		t.Fatalf("no token: %v, want unauthorized", err)
	}
	// A peer that does not speak HELLO first learns only that it must.
	for _, first := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		frame(wire.OpStats, 0, 1, nil),
		frame(wire.OpLookup, 0, 1, make([]byte, 40)),
	} {
		status, body := rawExchange(t, d.tcp, first)
		if status != wire.StatusUnauthorized {
			t.Errorf("first bytes %.20q: status %v (%s), want unauthorized", first, status, body)
		}
		if bytes.Contains(body, []byte("chunk")) || bytes.Contains(body, []byte("llama")) {
			t.Errorf("unauthenticated reply leaks: %s", body)
		}
	}
	// Beyond loopback a token is mandatory.
	bare := server.NewService(d.eng, server.ServiceOptions{})
	defer bare.Shutdown(ctx)
	if ln, err := bare.ListenTCP("0.0.0.0:0", nil); err == nil {
		ln.Close()
		t.Error("listening on every interface without a token was allowed")
	}
}

func frame(op wire.Op, flags wire.Flags, id uint32, body []byte) []byte {
	b := append(wire.Begin(nil), body...)
	return wire.Finish(b, op, flags, id, wire.StatusOK)
}

// rawExchange sends bytes on a fresh TCP connection and returns the
// status of the first reply frame and its body; the daemon must close the
// connection after it.
func rawExchange(t *testing.T, addr string, send []byte) (wire.Status, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(send); err != nil {
		t.Fatal(err)
	}
	rd := wire.NewReader(conn)
	h, body, err := rd.Next()
	if err != nil {
		t.Fatalf("no reply to %.20q: %v", send, err)
	}
	if _, err := rd.Header(); err == nil {
		t.Errorf("the connection stayed open after a refused handshake")
	}
	return h.Status, append([]byte(nil), body...)
}

func TestUncommittedStoreIsNeverVisible(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	c := d.local(t)
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(3*pChunkTokens, 3)
	slots, err := c.PrepareStore(ctx, client.Tokens(h, tokens, 0), sizesOf(3, pChunkBytes), 0)
	if err != nil || len(slots.Slots) != 3 {
		t.Fatalf("prepare: %+v %v", slots, err)
	}
	for j, s := range slots.Slots {
		dst, _ := c.Slot(s)
		copy(dst, chunkData(j, 3, pChunkBytes))
	}
	used := d.eng.Arena().Used()
	other := d.local(t)
	ho, _ := other.Scope(ctx, pScope)
	if hit, err := other.Lookup(ctx, client.Tokens(ho, tokens, 0), 0); err != nil || hit.Chunks != 0 {
		t.Fatalf("written but uncommitted chunks are visible: %+v %v", hit, err)
	}
	// Commit two of three: exactly two become visible.
	if n, err := c.CommitStore(ctx, slots.Lease, 2); n != 2 || err != nil {
		t.Fatalf("commit: %d %v", n, err)
	}
	if hit, _ := other.Lookup(ctx, client.Tokens(ho, tokens, 0), 0); hit.Chunks != 2 {
		t.Fatalf("after committing two: %d chunks visible", hit.Chunks)
	}
	if d.eng.Arena().Used() >= used {
		t.Errorf("the third reservation was not returned: used %d, before %d", d.eng.Arena().Used(), used)
	}
	// A store abandoned by closing the connection leaves nothing behind.
	tokens2 := prompt(2*pChunkTokens, 4)
	before := d.eng.Arena().Used()
	if _, err := c.PrepareStore(ctx, client.Tokens(h, tokens2, 0), sizesOf(2, pChunkBytes), 0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	waitFor(t, "the abandoned reservation to return", func() bool { return d.eng.Arena().Used() == before })
	if hit, _ := other.Lookup(ctx, client.Tokens(ho, tokens2, 0), 0); hit.Chunks != 0 {
		t.Error("an abandoned store became visible")
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLeasesExpire(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	c := d.local(t)
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(2*pChunkTokens, 5)
	storeLocal(t, c, h, tokens, 5)
	hit, err := c.Lookup(ctx, client.Tokens(h, tokens, 0), 50)
	if err != nil || hit.Lease == 0 || hit.Chunks != 2 {
		t.Fatalf("lookup with lease: %+v %v", hit, err)
	}
	slots, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 50)
	if err != nil || slots.Lease == 0 {
		t.Fatal(err)
	}
	if d.eng.Arena().Pinned() == 0 {
		t.Fatal("nothing pinned under two leases")
	}
	waitFor(t, "leases to expire", func() bool { return d.eng.Arena().Pinned() == 0 })
	if err := c.Renew(ctx, slots.Lease, 1000); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("renewing an expired lease: %v", err)
	}
	// A renewed lease outlives its first deadline.
	slots, _ = c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 100)
	if err := c.Renew(ctx, slots.Lease, 60_000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if d.eng.Arena().Pinned() == 0 {
		t.Error("a renewed lease expired at its first deadline")
	}
}

func TestClearPrefetchStatsPing(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	c := d.local(t)
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(3*pChunkTokens, 6)
	storeLocal(t, c, h, tokens, 6)
	if ok, err := c.Prefetch(ctx, client.Tokens(h, tokens, 0)); err != nil || !ok {
		t.Errorf("prefetch: %v %v", ok, err)
	}
	js, err := c.Stats(ctx)
	if err != nil || !bytes.Contains(js, []byte(`"mem"`)) {
		t.Fatalf("stats: %s %v", js, err)
	}
	n, err := c.Clear(ctx, h)
	if err != nil || n != 3 {
		t.Fatalf("clear: %d %v", n, err)
	}
	if hit, _ := c.Lookup(ctx, client.Tokens(h, tokens, 0), 0); hit.Chunks != 0 {
		t.Error("chunks survive CLEAR")
	}
	if _, err := c.Clear(ctx, 99); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("clear of an unknown handle: %v", err)
	}
	if _, err := c.Lookup(ctx, client.Tokens(7, tokens, 0), 0); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("lookup with an unknown scope handle: %v", err)
	}
	if _, err := c.Lookup(ctx, client.Tokens(h, tokens, 3), 0); !client.IsStatus(err, wire.StatusBadRequest) {
		t.Errorf("skip that is not a chunk multiple: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMalformedFramesLeaveOthersServed sends broken frames on one
// connection after a good handshake: each gets an error reply or a closed
// connection, and another client is served throughout.
func TestMalformedFramesLeaveOthersServed(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	good := d.local(t)
	handle, _ := good.Scope(ctx, pScope)
	tokens := prompt(2*pChunkTokens, 7)
	storeLocal(t, good, handle, tokens, 7)

	hello := (&wire.Hello{Version: wire.Version, Token: testToken}).Append(nil)
	bad := [][]byte{
		frame(wire.OpLookup, 0, 2, []byte{1, 2, 3}),                             // truncated body
		frame(wire.OpLookup, 0, 2, make([]byte, 64)),                            // keys with trailing bytes
		frame(wire.OpStore, wire.FlagMore, 2, []byte{0, 0, 0, 0, 9}),            // store metadata garbage
		append(frame(wire.OpPing, 0, 2, nil)[:6], 1, 0, 0, 0, 0, 0, 0, 0, 0, 0), // reserved bits
		{0xff, 0xff, 0xff, 0x7f, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},            // oversized body
		{0x10, 0, 0, 0, 99, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},                    // unknown op
		frame(wire.OpCommitStore, wire.FlagReply, 2, make([]byte, 12)),          // a reply from a client
	}
	for i, b := range bad {
		conn, err := net.Dial("tcp", d.tcp)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(frame(wire.OpHello, 0, 1, hello))
		rd := wire.NewReader(conn)
		if h, _, err := rd.Next(); err != nil || h.Status != wire.StatusOK {
			t.Fatalf("case %d: handshake: %v %v", i, h, err)
		}
		conn.Write(b)
		h, _, err := rd.Next()
		if err == nil && h.Status == wire.StatusOK {
			t.Errorf("case %d: malformed frame accepted", i)
		}
		conn.Close()
		if hit, err := good.Lookup(ctx, client.Tokens(handle, tokens, 0), 0); err != nil || hit.Chunks != 2 {
			t.Fatalf("case %d: the good client is no longer served: %+v %v", i, hit, err)
		}
	}
}

func TestArenaFullMeansShorterStore(t *testing.T) {
	d := startService(t, 4*pChunkBytes, server.ServiceOptions{})
	ctx := context.Background()
	c := d.local(t)
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(8*pChunkTokens, 8)
	// Hold a retrieve lease on nothing; reserve 8 chunks in a 4-chunk arena.
	slots, err := c.PrepareStore(ctx, client.Tokens(h, tokens, 0), sizesOf(8, pChunkBytes), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(slots.Slots) == 0 || len(slots.Slots) > 4 {
		t.Fatalf("%d slots in an arena of 4 chunks", len(slots.Slots))
	}
	if _, err := c.CommitStore(ctx, slots.Lease, len(slots.Slots)); err != nil {
		t.Fatal(err)
	}
	if used := d.eng.Arena().Used(); used > d.eng.Arena().Capacity() {
		t.Errorf("arena over capacity: %d > %d", used, d.eng.Arena().Capacity())
	}
}

func TestShutdownReleasesEverything(t *testing.T) {
	eng, err := engine.Open(engine.Options{ChunkSize: pChunkTokens, RAMBytes: 8 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{})
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := server.ListenUnix(sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ln) }()
	ctx := context.Background()
	c, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(2*pChunkTokens, 9)
	storeLocal(t, c, h, tokens, 9)
	if _, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 0); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := svc.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p := eng.Arena().Pinned(); p != 0 {
		t.Errorf("%d bytes pinned after shutdown", p)
	}
	if err := c.Ping(ctx); err == nil {
		t.Error("a client is still served after shutdown")
	}
	// A second daemon can take over the socket path.
	ln2, err := server.ListenUnix(sock, 0)
	if err != nil {
		t.Fatalf("socket not reusable after shutdown: %v", err)
	}
	ln2.Close()
}

func TestListenUnixRefusesLiveSocketAndOtherFiles(t *testing.T) {
	d := startService(t, 4<<20, server.ServiceOptions{})
	if _, err := server.ListenUnix(d.sock, 0); err == nil {
		t.Error("a second listener took over a live socket")
	}
	file := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := server.ListenUnix(file, 0); err == nil {
		t.Error("a regular file was replaced by a socket")
	}
}
