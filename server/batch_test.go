package server_test

import (
	"context"
	"encoding/binary"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// TestLookupBatchMatchesSingleLookups asks a real daemon about prompts of
// every kind of hit — whole, partial, partial last chunk, miss, skip, hash
// keys, raw keys, a failing entry — once with one LOOKUP each and once in
// one LOOKUP_BATCH, on both sockets, and wants the same answers.
func TestLookupBatchMatchesSingleLookups(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	setup := d.local(t)
	h, err := setup.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	whole := prompt(4*pChunkTokens, 1)
	storeLocal(t, setup, h, whole, 1)
	partial := append(append([]uint32(nil), whole[:2*pChunkTokens]...), prompt(3*pChunkTokens, 2)...)
	short := prompt(2*pChunkTokens+5, 3) // 2 whole chunks and a partial one, all stored
	storeLocal(t, setup, h, short, 3)
	keys, _, _, err := d.eng.Keys(nil, requestOf(whole))
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]chunk.Hash, 0, len(keys)+1)
	for _, k := range keys {
		hashes = append(hashes, k.Hash)
	}
	hashes = append(hashes, chunk.Hash{0xee}) // one more that is not stored

	for _, c := range []*client.Client{d.local(t), d.remote(t)} {
		hc, err := c.Scope(ctx, pScope)
		if err != nil {
			t.Fatal(err)
		}
		lookups := []wire.Lookup{
			{Keys: client.Tokens(hc, whole, 0)},
			{Keys: client.Tokens(hc, partial, 0)},
			{Keys: client.Tokens(hc, short, 0)},
			{Keys: client.Tokens(hc, prompt(3*pChunkTokens, 99), 0)}, // a miss
			{Keys: client.Tokens(hc, whole, 2*pChunkTokens)},
			{Keys: client.Hashes(hc, hashes)},
			{Keys: client.Raw(keys[:3])},
			{Keys: client.Tokens(hc+7, whole, 0)},         // unknown scope handle
			{Keys: client.Tokens(hc, whole, 3)},           // skip that is not a chunk multiple
			{LeaseMS: 0, Keys: client.Tokens(hc, nil, 0)}, // an empty prompt
		}
		var want []wire.LookupResult
		for _, l := range lookups {
			hit, err := c.Lookup(ctx, l.Keys, l.LeaseMS)
			want = append(want, resultOf(hit, err))
		}
		got, err := c.LookupBatch(ctx, lookups)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d results for %d lookups", len(got), len(want))
		}
		for i := range want {
			if !sameResult(got[i], want[i]) {
				t.Errorf("lookup %d: batch says %+v, LOOKUP says %+v", i, got[i], want[i])
			}
		}
		if got[0].Reply.Chunks != 4 || got[1].Reply.Chunks != 2 || got[2].Reply.Tokens != uint32(len(short)) ||
			got[3].Reply.Chunks != 0 || got[5].Reply.Chunks != 4 || got[6].Reply.Chunks != 3 {
			t.Errorf("hits are not what was stored: %+v", got)
		}
		if got[7].Status != wire.StatusNotFound || got[8].Status != wire.StatusBadRequest {
			t.Errorf("failing entries: %+v, %+v", got[7], got[8])
		}
		if err := client.ResultErr(&got[7]); !client.IsStatus(err, wire.StatusNotFound) {
			t.Errorf("ResultErr = %v", err)
		}
	}
}

func requestOf(tokens []uint32) engine.Request {
	return engine.Request{Scope: pScope, Tokens: tokens}
}

func resultOf(hit wire.LookupReply, err error) wire.LookupResult {
	if se, ok := err.(*client.StatusError); ok {
		return wire.LookupResult{Status: se.Status, Message: se.Message}
	}
	hit.ByTier = append([]uint32(nil), hit.ByTier...)
	return wire.LookupResult{Reply: hit}
}

func sameResult(a, b wire.LookupResult) bool {
	if a.Status != b.Status || a.Message != b.Message {
		return false
	}
	if a.Status != wire.StatusOK {
		return true
	}
	return a.Reply.Tokens == b.Reply.Tokens && a.Reply.Chunks == b.Reply.Chunks &&
		a.Reply.Lease == b.Reply.Lease && reflect.DeepEqual(a.Reply.ByTier, b.Reply.ByTier)
}

// TestLookupBatchLeases: a lookup of a batch that asks for a lease gets
// one, which pins the hit until it is released, as LOOKUP's does.
func TestLookupBatchLeases(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	c := d.local(t)
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(3*pChunkTokens, 4)
	storeLocal(t, c, h, tokens, 4)
	got, err := c.LookupBatch(ctx, []wire.Lookup{
		{LeaseMS: 60_000, Keys: client.Tokens(h, tokens, 0)},
		{Keys: client.Tokens(h, tokens, 0)},
		{LeaseMS: 60_000, Keys: client.Tokens(h, prompt(pChunkTokens, 55), 0)}, // a miss: no lease
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Reply.Lease == 0 || got[1].Reply.Lease != 0 || got[2].Reply.Lease != 0 {
		t.Fatalf("leases %d, %d, %d", got[0].Reply.Lease, got[1].Reply.Lease, got[2].Reply.Lease)
	}
	lease := got[0].Reply.Lease
	if err := c.Release(ctx, lease); err != nil {
		t.Fatalf("releasing the batch's lease: %v", err)
	}
	if err := c.Release(ctx, lease); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("released twice: %v", err)
	}
}

// TestLookupBatchMaxLeases: once the connection holds MaxLeases, a
// lookup that asks for one more fails alone.
func TestLookupBatchMaxLeases(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{MaxLeases: 2})
	ctx := context.Background()
	c := d.local(t)
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(2*pChunkTokens, 5)
	storeLocal(t, c, h, tokens, 5)
	l := wire.Lookup{LeaseMS: 60_000, Keys: client.Tokens(h, tokens, 0)}
	got, err := c.LookupBatch(ctx, []wire.Lookup{l, l, l, {Keys: l.Keys}})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Status != wire.StatusOK || got[1].Status != wire.StatusOK || got[2].Status != wire.StatusNoSpace ||
		got[3].Status != wire.StatusOK || got[3].Reply.Chunks != 2 {
		t.Errorf("results %+v", got)
	}
}

// TestLookupBatchMalformed: a batch that breaks the format or the limits
// is refused with a clear error, and the connection goes on serving.
func TestLookupBatchMalformed(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	one := (&wire.Lookup{Keys: wire.Keys{Scope: 1, Tokens: prompt(pChunkTokens, 1)}}).Append(nil)
	batch := func(count uint32, n int) []byte {
		b := binary.LittleEndian.AppendUint32(nil, count)
		for range n {
			b = append(b, one...)
		}
		return b
	}
	cases := []struct {
		body []byte
		want string
	}{
		{nil, "lookup batch count"},
		{batch(0, 0), "no lookups"},
		{batch(wire.MaxBatch+1, 1), "limit 1024"},
		{batch(2, 1), "lookup batch lease: need 4 bytes"},
		{batch(5, 1), "5 lookups in"},
		{append(batch(1, 1), 7), "trailing bytes"},
	}
	conn, rd := handshakeTCP(t, d)
	for i, c := range cases {
		conn.Write(frame(wire.OpLookupBatch, 0, uint32(10+i), c.body))
		h, body, err := rd.Next()
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if h.Status != wire.StatusBadRequest || h.ID != uint32(10+i) || !strings.Contains(string(body), c.want) {
			t.Errorf("case %d: status %v, %q; want bad request saying %q", i, h.Status, body, c.want)
		}
	}
	// Still in step: a good request on the same connection is answered.
	conn.Write(frame(wire.OpPing, 0, 99, []byte("ok")))
	if h, body, err := rd.Next(); err != nil || h.Status != wire.StatusOK || string(body) != "ok" {
		t.Fatalf("ping after the bad batches: %v %q %v", h, body, err)
	}
	// The client refuses empty and oversized batches before sending.
	c := d.local(t)
	if _, err := c.LookupBatch(context.Background(), nil); err == nil {
		t.Error("an empty batch was sent")
	}
	if _, err := c.LookupBatch(context.Background(), make([]wire.Lookup, wire.MaxBatch+1)); err == nil {
		t.Error("an oversized batch was sent")
	}
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// handshakeTCP opens a TCP connection and says HELLO.
func handshakeTCP(t *testing.T, d *daemon) (net.Conn, *wire.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", d.tcp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	hello := (&wire.Hello{Version: wire.Version, Token: testToken}).Append(nil)
	conn.Write(frame(wire.OpHello, 0, 1, hello))
	rd := wire.NewReader(conn)
	if h, _, err := rd.Next(); err != nil || h.Status != wire.StatusOK {
		t.Fatalf("handshake: %v %v", h, err)
	}
	return conn, rd
}

// TestLookupAllocs: once a connection is warm, a LOOKUP (by tokens or by
// engine hashes) and a LOOKUP_BATCH allocate nothing — in the client or in the daemon, whose
// allocations AllocsPerRun counts too since both run in this process.
func TestLookupAllocs(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	setup := d.local(t)
	tokens := prompt(256*pChunkTokens, 8) // 4,096 tokens, the first 4 chunks stored
	if got := storeLocal(t, setup, mustScope(t, setup), tokens[:4*pChunkTokens], 8); got != 4 {
		t.Fatalf("stored %d", got)
	}
	ck, err := chunk.NewChunker(pScope, pChunkTokens, false)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []chunk.Hash
	for _, k := range ck.Keys(nil, tokens) {
		hashes = append(hashes, k.Hash)
	}
	for _, c := range []*client.Client{d.local(t), d.remote(t)} {
		keys := client.Tokens(mustScope(t, c), tokens, 0)
		byHash := client.Hashes(keys.Scope, hashes)
		batch := []wire.Lookup{{Keys: keys}, {Keys: keys}, {Keys: client.Tokens(keys.Scope, tokens[:pChunkTokens], 0)}, {Keys: byHash}}
		lookup := func() {
			if hit, err := c.Lookup(ctx, keys, 0); err != nil || hit.Chunks != 4 {
				t.Fatal(hit, err)
			}
		}
		lookupHashes := func() {
			if hit, err := c.Lookup(ctx, byHash, 0); err != nil || hit.Chunks != 4 || hit.Tokens != 0 {
				t.Fatal(hit, err)
			}
		}
		lookupBatch := func() {
			if res, err := c.LookupBatch(ctx, batch); err != nil || res[0].Reply.Chunks != 4 || res[2].Reply.Chunks != 1 || res[3].Reply.Chunks != 4 {
				t.Fatal(res, err)
			}
		}
		if a := testing.AllocsPerRun(200, lookup); a != 0 {
			t.Errorf("%.2f allocations per LOOKUP", a)
		}
		if a := testing.AllocsPerRun(200, lookupHashes); a != 0 {
			t.Errorf("%.2f allocations per LOOKUP by engine hashes", a)
		}
		if a := testing.AllocsPerRun(200, lookupBatch); a != 0 {
			t.Errorf("%.2f allocations per LOOKUP_BATCH", a)
		}
	}
}

func mustScope(t *testing.T, c *client.Client) uint32 {
	t.Helper()
	h, err := c.Scope(context.Background(), pScope)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
