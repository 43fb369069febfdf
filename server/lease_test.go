package server_test

import (
	"context"
	"testing"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

// TestLeasesBelongToTheirConnection: leases live in one engine table, but
// a connection may only release, renew or commit its own, and closing it
// ends exactly its own.
func TestLeasesBelongToTheirConnection(t *testing.T) {
	d := startService(t, 16<<20, server.ServiceOptions{})
	ctx := context.Background()
	a, b := d.local(t), d.local(t)
	h, _ := a.Scope(ctx, pScope)
	tokens := prompt(2*pChunkTokens, 11)
	storeLocal(t, a, h, tokens, 11)
	held, err := a.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 60_000)
	if err != nil || held.Lease == 0 {
		t.Fatalf("prepare retrieve: %+v %v", held, err)
	}
	hb, _ := b.Scope(ctx, pScope)
	store, err := b.PrepareStore(ctx, client.Tokens(hb, prompt(pChunkTokens, 12), 0), sizesOf(1, pChunkBytes), 60_000)
	if err != nil || store.Lease == 0 {
		t.Fatalf("prepare store: %+v %v", store, err)
	}

	if err := b.Release(ctx, held.Lease); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("releasing another connection's lease: %v", err)
	}
	if err := b.Renew(ctx, held.Lease, 1000); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("renewing another connection's lease: %v", err)
	}
	if _, err := a.CommitStore(ctx, store.Lease, 1); !client.IsStatus(err, wire.StatusNotFound) {
		t.Errorf("committing another connection's lease: %v", err)
	}
	if got := d.eng.Stats().Arena.Leases; got != 2 {
		t.Fatalf("%d leases after the refused attempts, want both still held", got)
	}

	b.Close()
	waitFor(t, "the closed connection's lease to end", func() bool { return d.eng.Stats().Arena.Leases == 1 })
	if err := a.Release(ctx, held.Lease); err != nil {
		t.Errorf("the owner's release: %v", err)
	}
	if d.eng.Arena().Pinned() != 0 {
		t.Errorf("%d bytes pinned after every lease ended", d.eng.Arena().Pinned())
	}
}
