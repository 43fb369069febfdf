package engine_test

import (
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/tier"
)

// neverDone is a pending chunk whose layers never arrive.
type neverDone struct{ taken int }

func (n *neverDone) WaitLayer(ctx context.Context, _ tier.LayerGeometry, _ int) error {
	<-ctx.Done()
	return ctx.Err()
}
func (n *neverDone) Taken() { n.taken++ }

// TestPendingFreedWhilePublished: a pending chunk whose key another client
// stored meanwhile is freed by its own commit; a layerwise reader that
// still finds it published must not take it (a freed reservation has no
// slot, and its progress would say usable).
func TestPendingFreedWhilePublished(t *testing.T) {
	e := open(t, 16<<20, "", true)
	ctx := context.Background()
	key := chunk.Key{Scope: 7, Hash: chunk.Hash{1, 2, 3}}
	const size = 4096
	var pending, other engine.Writes
	pending.Begin(e)
	if _, err := pending.Reserve(key, size); err != nil {
		t.Fatal(err)
	}
	src := &neverDone{}
	pending.Publish(key, src)
	other.Begin(e)
	if _, err := other.Reserve(key, size); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	// The pending reservation is committed, and freed, before it is
	// withdrawn: the order a reader must survive.
	held, n, err := pending.CommitHeld(nil)
	if err != nil || n != 1 {
		t.Fatalf("commit of the pending chunk: %d, %v", n, err)
	}
	defer e.Unhold(held[0]) // the stored copy
	// The stored copy leaves RAM (evicted, dropped): a reader looks for a
	// pending chunk next.
	keys := []chunk.Key{key}
	if e.DropLocal(keys) != 1 {
		t.Fatal("the stored copy was not in RAM")
	}
	slots, id, err := e.PrepareRetrieveLayers(ctx, keys, engine.Layers{Layers: 4, Parts: 2}, time.Minute, nil)
	if err != nil || id != 0 || len(slots) != 0 || src.taken != 0 {
		t.Fatalf("took %+v (lease %d, taken %d, %v) of a freed reservation still published", slots, id, src.taken, err)
	}
	e.Unpublish(key)
}
