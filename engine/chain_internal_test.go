package engine

import (
	"testing"
	"time"

	"kvtier/chunk"
)

// TestPushChainForgetsAReusedTransfer: a batch follows the previous one
// only for the same transfer ID and within MaxTransferTime of that
// transfer's first batch on the connection; a transfer ID the producer
// uses again later, for another prompt, starts a new chain.
func TestPushChainForgetsAReusedTransfer(t *testing.T) {
	key := func(i uint64) chunk.Key { return chunk.Key{Scope: 1, Hash: chunk.Hash{byte(i), 1}} }
	clock := time.Unix(1000, 0)
	c := PushChain{now: func() time.Time { return clock }}
	first := func() (chunk.Key, bool) { return c.Parent(c.keys, 0) }

	c.Begin(7, []chunk.Key{key(0), key(1)})
	if _, ok := first(); ok {
		t.Fatal("a transfer's first batch has a parent")
	}
	clock = clock.Add(MaxTransferTime / 2)
	c.Begin(7, []chunk.Key{key(2), key(3)})
	if up, ok := first(); !ok || up != key(1) {
		t.Fatalf("second batch of the transfer: parent %v, %v; want %v", up, ok, key(1))
	}
	clock = clock.Add(MaxTransferTime/2 + time.Second) // past the transfer's longest life
	c.Begin(7, []chunk.Key{key(4), key(5)})
	if up, ok := first(); ok {
		t.Fatalf("a reused transfer ID's first batch is the child of %v", up)
	}
	clock = clock.Add(time.Second) // the reused ID's chain goes on
	c.Begin(7, []chunk.Key{key(6)})
	if up, ok := first(); !ok || up != key(5) {
		t.Fatalf("second batch of the reused transfer: parent %v, %v; want %v", up, ok, key(5))
	}
	c.Begin(8, []chunk.Key{key(7)})
	if _, ok := first(); ok {
		t.Fatal("another transfer's first batch has a parent")
	}
}
