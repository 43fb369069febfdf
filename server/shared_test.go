package server_test

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// TestRequestBufferLookupsMatch: lookups whose tokens lie in a request
// buffer answer exactly as those that send them, alone and in batches,
// including batches whose tokens do not all fit in the buffer.
func TestRequestBufferLookupsMatch(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	setup := d.local(t)
	h := mustScope(t, setup)
	whole := prompt(4*pChunkTokens, 11)
	storeLocal(t, setup, h, whole, 11)
	short := prompt(2*pChunkTokens+5, 12)
	storeLocal(t, setup, h, short, 12)

	plain := d.local(t)
	shared, err := client.DialUnix(ctx, d.sock, client.Options{RequestBuffer: wire.MinRequestBuffer})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	if !shared.SharesTokens() || plain.SharesTokens() {
		t.Fatal("SharesTokens is wrong")
	}
	hp, hs := mustScope(t, plain), mustScope(t, shared)
	prompts := []struct {
		tokens []uint32
		skip   int
	}{
		{whole, 0}, {short, 0}, {whole, 2 * pChunkTokens}, {prompt(3*pChunkTokens, 99), 0}, {nil, 0},
		{append(append([]uint32(nil), whole[:pChunkTokens]...), prompt(pChunkTokens, 98)...), 0},
		{prompt(1100, 13), 0}, // 4,400 bytes: more than the rest of a 4 KiB buffer
	}
	var plainBatch, sharedBatch []wire.Lookup
	for _, p := range prompts {
		want, err := plain.Lookup(ctx, client.Tokens(hp, p.tokens, p.skip), 0)
		if err != nil {
			t.Fatal(err)
		}
		want.ByTier = append([]uint32(nil), want.ByTier...)
		got, err := shared.Lookup(ctx, client.Tokens(hs, p.tokens, p.skip), 0)
		if err != nil {
			t.Fatal(err)
		}
		if !sameResult(wire.LookupResult{Reply: got}, wire.LookupResult{Reply: want}) {
			t.Errorf("%d tokens: shared %+v, sent %+v", len(p.tokens), got, want)
		}
		plainBatch = append(plainBatch, wire.Lookup{Keys: client.Tokens(hp, p.tokens, p.skip)})
		sharedBatch = append(sharedBatch, wire.Lookup{Keys: client.Tokens(hs, p.tokens, p.skip)})
	}
	want, err := plain.LookupBatch(ctx, plainBatch)
	if err != nil {
		t.Fatal(err)
	}
	want = append([]wire.LookupResult(nil), want...)
	got, err := shared.LookupBatch(ctx, sharedBatch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if !sameResult(got[i], want[i]) {
			t.Errorf("batch entry %d: shared %+v, sent %+v", i, got[i], want[i])
		}
	}
	if got[0].Reply.Chunks != 4 || got[1].Reply.Tokens != uint32(len(short)) {
		t.Errorf("hits are not what was stored: %+v", got)
	}
	// The caller's lookups are left as they were.
	if sharedBatch[0].Keys.Kind != wire.KindTokens || len(sharedBatch[0].Keys.Tokens) != len(whole) {
		t.Errorf("LookupBatch changed the caller's keys: %+v", sharedBatch[0].Keys.Kind)
	}
	if a := testing.AllocsPerRun(100, func() {
		if _, err := shared.Lookup(ctx, client.Tokens(hs, whole, 0), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := shared.LookupBatch(ctx, sharedBatch); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("%.2f allocations per LOOKUP and LOOKUP_BATCH through the request buffer", a)
	}
}

// rawLocal is a hand-driven local connection: HELLO said, the arena's fd
// closed, frames written and read directly.
type rawLocal struct {
	t    *testing.T
	conn *net.UnixConn
	rd   *wire.Reader
	id   uint32
}

func dialRawLocal(t *testing.T, d *daemon) *rawLocal {
	t.Helper()
	c, err := net.Dial("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := &rawLocal{t: t, conn: c.(*net.UnixConn), rd: wire.NewReader(c)}
	hello := (&wire.Hello{Version: wire.Version}).Append(nil)
	if fd, h, _ := r.send(wire.OpHello, hello); h.Status != wire.StatusOK || fd < 0 {
		t.Fatalf("handshake: %+v fd %d", h, fd)
	} else {
		unix.Close(fd)
	}
	return r
}

// send writes a frame and reads its reply, with the fd it carries (-1 if
// none). The whole reply is read with recvmsg, which is why this reader
// has no buffer.
func (r *rawLocal) send(op wire.Op, body []byte) (int, wire.Header, []byte) {
	r.t.Helper()
	r.id++
	if _, err := r.conn.Write(frame(op, 0, r.id, body)); err != nil {
		r.t.Fatal(err)
	}
	var hdr [wire.HeaderSize]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := r.conn.ReadMsgUnix(hdr[:], oob)
	if err != nil || n != len(hdr) {
		r.t.Fatalf("reading the reply header: %d bytes, %v", n, err)
	}
	fd := -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) > 0 {
		if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) > 0 {
			fd = fds[0]
		}
	}
	h, err := wire.ParseHeader(hdr[:])
	if err != nil {
		r.t.Fatal(err)
	}
	replyBody, err := r.rd.Body(h)
	if err != nil {
		r.t.Fatal(err)
	}
	return fd, h, append([]byte(nil), replyBody...)
}

// TestRequestBufferIsSealed: a client cannot shrink or grow its request
// buffer under the daemon's mapping (a read past a shrunk end would be a
// SIGBUS in the daemon), and lookups reaching the buffer's last byte and
// past it are served and refused.
func TestRequestBufferIsSealed(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	r := dialRawLocal(t, d)
	_, h, body := r.send(wire.OpScope, (&wire.Scope{WorldSize: 1, Model: pScope.Model, Format: pScope.Format}).Append(nil))
	if h.Status != wire.StatusOK {
		t.Fatalf("scope: %s", body)
	}
	handle := binary.LittleEndian.Uint32(body)
	fd, h, body := r.send(wire.OpRequestBuffer, (&wire.RequestBuffer{Bytes: 5000}).Append(nil))
	if h.Status != wire.StatusOK || fd < 0 {
		t.Fatalf("request buffer: %v %s fd %d", h.Status, body, fd)
	}
	defer unix.Close(fd)
	size := int(binary.LittleEndian.Uint32(body))
	if size < 5000 || size%4096 != 0 {
		t.Fatalf("granted %d bytes", size)
	}
	for _, to := range []int64{0, int64(size) / 2, 2 * int64(size)} {
		if err := unix.Ftruncate(fd, to); err == nil {
			t.Fatalf("the client resized its request buffer to %d bytes", to)
		}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	tokens := unsafe.Slice((*uint32)(unsafe.Pointer(&mem[0])), size/4)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	lookup := func(offset uint64, count uint32) (wire.Header, []byte) {
		keys := wire.Keys{Scope: handle, Kind: wire.KindShared, Shared: wire.SharedTokens{Offset: offset, Count: count}}
		_, h, body := r.send(wire.OpLookup, (&wire.Lookup{Keys: keys}).Append(nil))
		return h, body
	}
	if h, body := lookup(uint64(size)-4*pChunkTokens, pChunkTokens); h.Status != wire.StatusOK {
		t.Errorf("a lookup ending at the buffer's last byte: %v %s", h.Status, body)
	}
	for _, c := range []struct {
		offset uint64
		count  uint32
	}{{uint64(size) - 4, 2}, {uint64(size), 1}, {1 << 62, 1 << 31}} {
		if h, body := lookup(c.offset, c.count); h.Status != wire.StatusBadRequest || !strings.Contains(string(body), "request buffer") {
			t.Errorf("%d tokens at %d of %d bytes: %v %s", c.count, c.offset, size, h.Status, body)
		}
	}
	if _, h, body := r.send(wire.OpRequestBuffer, (&wire.RequestBuffer{Bytes: 5000}).Append(nil)); h.Status != wire.StatusBadRequest ||
		!strings.Contains(string(body), "already") {
		t.Errorf("a second request buffer: %v %s", h.Status, body)
	}
	// Keys in the buffer are for lookups only.
	keys := wire.Keys{Scope: handle, Kind: wire.KindShared, Shared: wire.SharedTokens{Count: pChunkTokens}}
	for _, req := range []struct {
		op   wire.Op
		body []byte
	}{
		{wire.OpPrepareRetrieve, (&wire.PrepareRetrieve{Keys: keys}).Append(nil)},
		{wire.OpPrefetch, (&wire.KeysOnly{Keys: keys}).Append(nil)},
		{wire.OpSizes, (&wire.KeysOnly{Keys: keys}).Append(nil)},
	} {
		if _, h, body := r.send(req.op, req.body); h.Status != wire.StatusBadRequest || !strings.Contains(string(body), "LOOKUP") {
			t.Errorf("%s with keys in the request buffer: %v %s", req.op, h.Status, body)
		}
	}
	if _, h, _ := r.send(wire.OpPing, nil); h.Status != wire.StatusOK {
		t.Fatal("the connection is no longer served")
	}
}

// TestRequestBufferRefusals: no buffer on TCP, none of a size out of the
// limits, and keys that name a buffer the connection does not have.
func TestRequestBufferRefusals(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	conn, rd := handshakeTCP(t, d)
	conn.Write(frame(wire.OpRequestBuffer, 0, 5, (&wire.RequestBuffer{Bytes: 1 << 20}).Append(nil)))
	if h, body, err := rd.Next(); err != nil || h.Status != wire.StatusUnsupported {
		t.Errorf("REQUEST_BUFFER over TCP: %+v %s %v", h, body, err)
	}
	r := dialRawLocal(t, d)
	if _, h, body := r.send(wire.OpRequestBuffer, (&wire.RequestBuffer{Bytes: wire.MaxRequestBuffer + 1}).Append(nil)); h.Status != wire.StatusBadRequest {
		t.Errorf("an oversized request buffer: %v %s", h.Status, body)
	}
	keys := wire.Keys{Scope: 1, Kind: wire.KindShared, Shared: wire.SharedTokens{Count: 1}}
	_, h, _ := r.send(wire.OpScope, (&wire.Scope{WorldSize: 1, Model: "m"}).Append(nil))
	if h.Status != wire.StatusOK {
		t.Fatal("scope")
	}
	if _, h, body := r.send(wire.OpLookup, (&wire.Lookup{Keys: keys}).Append(nil)); h.Status != wire.StatusBadRequest ||
		!strings.Contains(string(body), "has none") {
		t.Errorf("keys in a request buffer the connection lacks: %v %s", h.Status, body)
	}
	if _, err := client.DialUnix(context.Background(), d.sock, client.Options{RequestBuffer: 100}); err == nil {
		t.Error("the client asked for a request buffer under the minimum")
	}
}
