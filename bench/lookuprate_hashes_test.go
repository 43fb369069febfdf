package bench

import (
	"context"
	"slices"
	"strings"
	"testing"

	"kvtier/engine"
	"kvtier/server"
)

// TestHashLookupsChecked: the engine-hash clients get every prompt's
// cached chunks from a real daemon, and a prompt whose hashes are wrong
// (here its first chunk's) fails the call instead of counting as a
// lookup; the kind that hashes in the client does not use the
// precomputed hashes at all.
func TestHashLookupsChecked(t *testing.T) {
	ctx := context.Background()
	eng, err := engine.Open(engine.Options{ChunkSize: 256, RAMBytes: 64 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{Token: benchToken})
	defer svc.Shutdown(context.Background())
	sock, cleanup, err := serveLocal(svc)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ps, err := storePrompts(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct {
		name          string
		batch         int
		rehash        bool
		lookupsPerDo  int
		callsPerRound int
	}{
		{"lookup", 1, false, 1, len(ps)},
		{"batch", rateBatch, false, rateBatch, 1},
		{"client hashes", 1, true, 1, len(ps)},
	} {
		c, err := dialHashLookup(ctx, sock, ps, k.batch, k.rehash)
		if err != nil {
			t.Fatal(err)
		}
		for range k.callsPerRound {
			if n, err := c.do(ctx); err != nil || n != k.lookupsPerDo {
				t.Errorf("%s: %d lookups, %v", k.name, n, err)
			}
		}
		c.Close()
	}
	bad := slices.Clone(ps)
	bad[0].hashes = slices.Clone(ps[0].hashes)
	bad[0].hashes[0][0] ^= 1
	c, err := dialHashLookup(ctx, sock, bad, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.do(ctx); err == nil || !strings.Contains(err.Error(), "prompt 0 by hashes hit 0 chunks") {
		t.Errorf("lookup by a wrong hash: %v, want a failed check", err)
	}
	// The client-hashing kind keys the tokens itself on every call, so
	// the wrong precomputed hash does not reach the daemon.
	rc, err := dialHashLookup(ctx, sock, bad, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.do(ctx); err != nil {
		t.Errorf("lookup hashed by the client: %v", err)
	}
}
