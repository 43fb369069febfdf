package server_test

import (
	"context"
	"strconv"
	"testing"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/wire"
)

// TestStoredChainKeepsItsParents: a prompt's chain stored with STORE —
// by engine hashes in two requests, the second naming the whole chain
// again so that its cached head is skipped, and by tokens with the first
// chunks skipped — is committed as a run, each chunk its predecessor's
// child, so prefix-aware eviction takes the chain from its tail. Before,
// STORE committed its chunks as roots: the least recently used head went
// first and stranded the tail.
func TestStoredChainKeepsItsParents(t *testing.T) {
	const chain = 8
	sc := chunk.Scope{Model: "m", Namespace: "store-parents", WorldSize: 1}
	for _, kind := range []string{"hashes", "tokens"} {
		t.Run(kind, func(t *testing.T) {
			d := startTreeService(t, 24*pChunkBytes)
			c := d.remote(t)
			ctx := context.Background()
			h, err := c.Scope(ctx, sc)
			if err != nil {
				t.Fatal(err)
			}
			tokens := prompt(chain*pChunkTokens, 41)
			keys, _, _, err := d.eng.Keys(nil, engine.Request{Scope: sc, Tokens: tokens})
			if err != nil || len(keys) != chain {
				t.Fatalf("keys: %d, %v", len(keys), err)
			}
			chunks := make([][]byte, chain)
			for j := range chunks {
				chunks[j] = chunkData(j, 41, pChunkBytes)
			}
			store := func(k wire.Keys, chunks [][]byte) {
				t.Helper()
				if n, err := c.Store(ctx, k, chunks); err != nil || n != len(chunks) {
					t.Fatalf("store: %d of %d, %v", n, len(chunks), err)
				}
			}
			switch kind {
			case "hashes":
				hashes := make([]chunk.Hash, chain)
				for j, k := range keys {
					hashes[j] = k.Hash
				}
				store(client.Hashes(h, hashes[:chain/2]), chunks[:chain/2])
				store(client.Hashes(h, hashes), chunks) // the head is cached: skipped
			case "tokens":
				store(client.Tokens(h, tokens[:chain/2*pChunkTokens], 0), chunks[:chain/2])
				store(client.Tokens(h, tokens, chain/2*pChunkTokens), chunks[chain/2:])
			}
			if got := checkPrefixClosed(t, "before the stores", present(d, keys)); got != chain {
				t.Fatalf("%d of %d stored chunks held", got, chain)
			}
			// The tail is used last: were the chunks roots, the head would
			// be the least recently used leaf and go first.
			dst := make([][]byte, chain/2)
			for j := range dst {
				dst[j] = make([]byte, pChunkBytes)
			}
			if n, _, err := c.Retrieve(ctx, client.Raw(keys[chain/2:]), dst); err != nil || n != chain/2 {
				t.Fatalf("retrieve the tail: %d, %v", n, err)
			}
			other := pdKeys(200, 42)
			for i := range other {
				storeRaw(t, c, other[i:i+1], uint32(i), pChunkBytes)
				if checkPrefixClosed(t, "after store "+strconv.Itoa(i), present(d, keys)) == 0 {
					return
				}
			}
			t.Fatal("the stored chain outlived 200 stores into a tier of 24 chunks")
		})
	}
}
