package engine_test

import (
	"context"
	"testing"
	"time"

	"kvtier/engine"
	"kvtier/tier/policy"
)

// TestStoreLeaseNamesParents stores a four-chunk prompt through a store
// lease (its first chunk stored already, so the lease skips it) into a RAM
// tier of four chunks, then two chunks of another prompt. Under LRU the
// prompt's oldest chunks go and nothing of it can be found; under TREELRU,
// which CommitStore tells each chunk's parent, the tail goes and the first
// two chunks are still a hit.
func TestStoreLeaseNamesParents(t *testing.T) {
	for _, tc := range []struct {
		policy string
		hit    int
	}{{policy.LRU, 0}, {policy.TREELRU, 2}} {
		e, err := engine.Open(engine.Options{ChunkSize: chunkTokens, RAMBytes: 4 << 12, Policy: tc.policy})
		if err != nil {
			t.Fatal(err)
		}
		if p := e.Manager().RAM().Arena().PageSize(); p != 1<<12 {
			e.Close()
			t.Skipf("arena pages of %d bytes, the test sizes RAM for 4 KiB ones", p)
		}
		ctx := context.Background()
		toks := tokens(4*chunkTokens, 1)
		req := engine.Request{Scope: scope, Tokens: toks}
		if n, err := e.Store(ctx, engine.Request{Scope: scope, Tokens: toks[:chunkTokens]}, chunksOf(toks, 0, 1)); n != 1 || err != nil {
			t.Fatalf("%s: store head: %d, %v", tc.policy, n, err)
		}
		keys, _, _, err := e.Keys(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		sizes := []uint32{512, 512, 512, 512}
		slots, id, err := e.PrepareStore(keys, sizes, time.Minute, nil)
		if err != nil || len(slots) != 4 || !slots[0].Stored {
			t.Fatalf("%s: prepare store: %+v, %v", tc.policy, slots, err)
		}
		for j := 1; j < 4; j++ {
			dst, err := e.Manager().RAM().Arena().Region(int64(slots[j].Offset), int(slots[j].Len))
			if err != nil {
				t.Fatal(err)
			}
			copy(dst, chunksOf(toks, j, j+1)[0])
		}
		if n, err := e.CommitStore(id, 4); n != 4 || err != nil {
			t.Fatalf("%s: commit store: %d, %v", tc.policy, n, err)
		}
		other := tokens(2*chunkTokens, 2)
		if n, err := e.Store(ctx, engine.Request{Scope: scope, Tokens: other}, chunksOf(other, 0, 2)); n != 2 || err != nil {
			t.Fatalf("%s: store other: %d, %v", tc.policy, n, err)
		}
		hit, err := e.Lookup(req)
		if err != nil || hit.Chunks != tc.hit {
			t.Errorf("%s: lookup after pressure: %d chunks, %v; want %d", tc.policy, hit.Chunks, err, tc.hit)
		}
		e.Close()
	}
}
