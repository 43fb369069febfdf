package announce_test

import (
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/wire"
)

// The shape of the daemon the tests run, as package server's tests use it.
const (
	pChunkTokens = 16
	pChunkBytes  = 64 << 10
)

var pScope = chunk.Scope{Model: "llama", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

func prompt(n int, salt uint32) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(i)*7 + salt
	}
	return p
}

// storeLocal stores the chunks of tokens through the zero-copy path.
func storeLocal(t testing.TB, c *client.Client, handle uint32, tokens []uint32, salt uint32) int {
	t.Helper()
	ctx := context.Background()
	n := (len(tokens) + pChunkTokens - 1) / pChunkTokens
	sizes := make([]uint32, n)
	for i := range sizes {
		sizes[i] = pChunkBytes
	}
	slots, err := c.PrepareStore(ctx, client.Tokens(handle, tokens, 0), sizes, 0)
	if err != nil {
		t.Fatal(err)
	}
	for j, s := range slots.Slots {
		if s.State != wire.SlotWrite {
			continue
		}
		dst, err := c.Slot(s)
		if err != nil {
			t.Fatal(err)
		}
		for i := range dst {
			dst[i] = byte(uint32(i*31+j*17) + salt)
		}
	}
	got, err := c.CommitStore(ctx, slots.Lease, len(slots.Slots))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
