package server_test

import (
	"context"
	"strconv"
	"testing"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// startTreeService is startService with a prefix-aware eviction policy
// (TREELRU: the least recently used leaf first) and a RAM tier of ramBytes.
func startTreeService(t *testing.T, ramBytes int64) *daemon {
	t.Helper()
	eopts := lruEngine(ramBytes)
	eopts.Policy = "TREELRU"
	return startServing(t, eopts, server.ServiceOptions{}, "")
}

// present says which of keys the daemon's RAM holds, one key at a time
// (a lookup does not count as a use).
func present(d *daemon, keys []chunk.Key) []bool {
	out := make([]bool, len(keys))
	for j := range keys {
		n, _ := d.eng.LookupKeys(keys[j : j+1])
		out[j] = n == 1
	}
	return out
}

// checkPrefixClosed fails when a chunk of the chain is held while the one
// before it is gone: a lookup stops at the gap, so the tail is stranded.
func checkPrefixClosed(t *testing.T, at string, have []bool) int {
	t.Helper()
	n := 0
	for n < len(have) && have[n] {
		n++
	}
	for j := n; j < len(have); j++ {
		if have[j] {
			t.Fatalf("%s: chunk %d of the pushed chain is held but chunk %d was evicted (held: %v)", at, j, n, have)
		}
	}
	return n
}

// pushedChainSurvivesAsPrefix pushes a chain of chunks with receive (in
// two requests of one transfer, so the second request's first chunk
// follows the first request's last), reads them all once (ending their
// holds), uses the tail again so that it is the most recently used, then
// stores unrelated chunks until the whole chain is evicted, checking
// after each store that what is left of the chain is a prefix. Without
// parents every pushed chunk is a root and a leaf, and the least recently
// used head goes first, stranding the tail.
func pushedChainSurvivesAsPrefix(t *testing.T, receive func(c *client.Client, keys []chunk.Key, chunks [][]byte)) {
	const size, chain = 64 << 10, 8
	d := startTreeService(t, 24*size)
	c := d.remote(t)
	ctx := context.Background()
	keys := pdKeys(chain, 31)
	chunks := make([][]byte, chain)
	for j := range chunks {
		chunks[j] = chunkData(j, 31, size)
	}
	receive(c, keys[:chain/2], chunks[:chain/2])
	receive(c, keys[chain/2:], chunks[chain/2:])
	checkRaw(t, c, keys, 31, size) // ends the holds
	dst := make([][]byte, chain/2)
	for j := range dst {
		dst[j] = make([]byte, size)
	}
	if n, _, err := c.Retrieve(ctx, client.Raw(keys[chain/2:]), dst); err != nil || n != chain/2 {
		t.Fatalf("retrieve the tail: %d, %v", n, err)
	}
	if got := checkPrefixClosed(t, "before the stores", present(d, keys)); got != chain {
		t.Fatalf("%d of %d pushed chunks held before any store", got, chain)
	}
	other := pdKeys(200, 32)
	for i := range other {
		storeRaw(t, c, other[i:i+1], uint32(i), size)
		if checkPrefixClosed(t, "after store "+strconv.Itoa(i), present(d, keys)) == 0 {
			return
		}
	}
	t.Fatalf("the pushed chain outlived 200 stores into a tier of 24 chunks")
}

// TestReceivedChunksKeepTheirParents: chunks pushed with RECEIVE are
// stored as their predecessors' children, across the requests of one
// transfer, so prefix-aware eviction takes the chain from its tail.
func TestReceivedChunksKeepTheirParents(t *testing.T) {
	pushedChainSurvivesAsPrefix(t, func(c *client.Client, keys []chunk.Key, chunks [][]byte) {
		if n, err := c.Receive(context.Background(), 7, 60000, keys, chunks, nil); err != nil || n != len(keys) {
			t.Fatalf("receive: %d of %d, %v", n, len(keys), err)
		}
	})
}

// TestReceivedLayersKeepTheirParents is the same for RECEIVE_LAYERS.
func TestReceivedLayersKeepTheirParents(t *testing.T) {
	pushedChainSurvivesAsPrefix(t, func(c *client.Client, keys []chunk.Key, chunks [][]byte) {
		m := &wire.ReceiveLayers{Receive: wire.Receive{Transfer: 7, HoldMS: 60000, Keys: wire.Keys{Kind: wire.KindRaw, Raw: keys}}}
		for _, b := range chunks {
			m.Sizes = append(m.Sizes, uint32(len(b)))
		}
		if !m.RangesFor(4, 2, 1) {
			t.Fatal("chunks do not split into 8 spans")
		}
		if n, err := c.ReceiveLayers(context.Background(), m, chunks, nil, nil); err != nil || n != len(keys) {
			t.Fatalf("receive layers: %d of %d, %v", n, len(keys), err)
		}
	})
}

// TestPushChain: the parents PushChain names, within a request and
// across the requests of a transfer, and none across transfers.
func TestPushChain(t *testing.T) {
	keys := pdKeys(5, 40)
	var c engine.PushChain
	c.Begin(3, keys[:2])
	if _, ok := c.Next(); ok {
		t.Fatal("the first chunk of a transfer has a parent")
	}
	if p, ok := c.Next(); !ok || p != keys[0] {
		t.Fatalf("second chunk's parent %v %v", p, ok)
	}
	c.Begin(3, nil) // a probe changes nothing
	c.Begin(3, keys[2:4])
	if p, ok := c.Parent(keys[2:4], 0); !ok || p != keys[1] {
		t.Fatalf("the next request's first parent %v %v, want the previous request's last", p, ok)
	}
	c.Begin(4, keys[4:])
	if _, ok := c.Next(); ok {
		t.Fatal("another transfer's first chunk follows the previous transfer")
	}
	if _, ok := c.Next(); ok {
		t.Fatal("past the request's chunks")
	}
}
