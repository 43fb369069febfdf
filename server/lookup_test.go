package server_test

import (
	"context"
	"errors"
	"testing"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// TestLookupMatchesEngine checks the daemon's in-place keying of LOOKUP
// tokens against the engine's own Lookup, which keys the same tokens the
// other way (chunk.Chunker.Keys): every way a lookup can carry its tokens
// (in the frame over the local socket and TCP, in the request buffer,
// in a batch) must give the engine's hit for prompts that match whole,
// in part, with a partial last chunk, with a skip, and not at all, and
// refuse the skips the engine refuses.
func TestLookupMatchesEngine(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	setup := d.local(t)
	h := mustScope(t, setup)
	whole := prompt(6*pChunkTokens, 21)
	storeLocal(t, setup, h, whole, 21)
	short := prompt(3*pChunkTokens+7, 22) // a partial last chunk
	storeLocal(t, setup, h, short, 22)

	diverged := append(append([]uint32(nil), whole[:2*pChunkTokens]...), prompt(3*pChunkTokens, 23)...)
	cases := []struct {
		tokens []uint32
		skip   int
	}{
		{whole, 0}, {whole, 2 * pChunkTokens}, {whole, len(whole)}, {whole[:4*pChunkTokens+3], 0},
		{short, 0}, {short, pChunkTokens}, {short[:len(short)-1], 0}, {diverged, 0},
		{prompt(5*pChunkTokens, 24), 0}, {nil, 0}, {whole[:1], 0},
		{whole, 3}, {whole, len(whole) + pChunkTokens}, // refused
	}
	shared, err := client.DialUnix(ctx, d.sock, client.Options{RequestBuffer: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	clients := map[string]*client.Client{"local": d.local(t), "tcp": d.remote(t), "request buffer": shared}
	for name, c := range clients {
		hc := mustScope(t, c)
		var batch []wire.Lookup
		var wants []wire.LookupResult
		for _, tc := range cases {
			want := engineResult(t, d.eng, tc.tokens, tc.skip)
			got, err := c.Lookup(ctx, client.Tokens(hc, tc.tokens, tc.skip), 0)
			checkLookup(t, name, len(tc.tokens), tc.skip, got, err, want)
			batch = append(batch, wire.Lookup{Keys: client.Tokens(hc, tc.tokens, tc.skip)})
			wants = append(wants, want)
		}
		res, err := c.LookupBatch(ctx, batch)
		if err != nil {
			t.Fatalf("%s: batch: %v", name, err)
		}
		for i, r := range res {
			if r.Status != wants[i].Status || (r.Status == wire.StatusOK && (r.Reply.Chunks != wants[i].Reply.Chunks || r.Reply.Tokens != wants[i].Reply.Tokens)) {
				t.Errorf("%s: batch entry %d (%d tokens, skip %d): %+v, engine %+v", name, i, len(cases[i].tokens), cases[i].skip, r, wants[i])
			}
		}
	}
}

// engineResult is what the engine says of a lookup: a hit, or the status
// the daemon must refuse it with.
func engineResult(t *testing.T, eng *engine.Engine, tokens []uint32, skip int) wire.LookupResult {
	t.Helper()
	hit, err := eng.Lookup(engine.Request{Scope: pScope, Tokens: tokens, Skip: skip})
	switch {
	case errors.Is(err, chunk.ErrSkip):
		return wire.LookupResult{Status: wire.StatusBadRequest}
	case err != nil:
		t.Fatal(err)
	}
	return wire.LookupResult{Reply: wire.LookupReply{Chunks: uint32(hit.Chunks), Tokens: uint32(hit.Tokens)}}
}

func checkLookup(t *testing.T, name string, n, skip int, got wire.LookupReply, err error, want wire.LookupResult) {
	t.Helper()
	var se *client.StatusError
	switch {
	case want.Status != wire.StatusOK:
		if !errors.As(err, &se) || se.Status != want.Status {
			t.Errorf("%s: %d tokens, skip %d: err %v, want status %v", name, n, skip, err, want.Status)
		}
	case err != nil:
		t.Errorf("%s: %d tokens, skip %d: %v", name, n, skip, err)
	case got.Chunks != want.Reply.Chunks || got.Tokens != want.Reply.Tokens:
		t.Errorf("%s: %d tokens, skip %d: hit %d chunks, %d tokens; engine %d, %d", name, n, skip,
			got.Chunks, got.Tokens, want.Reply.Chunks, want.Reply.Tokens)
	}
}

// TestLookupScopesOnOneConnection: the chunker a connection keeps for a
// scope handle is that scope's; the same tokens under another handle of
// the same connection are other chunks.
func TestLookupScopesOnOneConnection(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	c := d.local(t)
	tokens := prompt(4*pChunkTokens, 31)
	h := mustScope(t, c)
	storeLocal(t, c, h, tokens, 31)
	other := pScope
	other.Model = "another-model"
	h2, err := c.Scope(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	for _, hc := range []uint32{h, h2, h} {
		got, err := c.Lookup(ctx, client.Tokens(hc, tokens, 0), 0)
		want := uint32(4)
		if hc == h2 {
			want = 0
		}
		if err != nil || got.Chunks != want {
			t.Fatalf("handle %d: hit %d chunks (%v), want %d", hc, got.Chunks, err, want)
		}
	}
	if _, err := c.Lookup(ctx, client.Tokens(h2+1, tokens, 0), 0); err == nil {
		t.Fatal("a lookup under an unregistered handle succeeded")
	}
}
