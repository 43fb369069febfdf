package backends_test

import (
	"bytes"
	"context"
	"kvtier/internal/redistest"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// TestRemoteStoreRestartMidRun runs an engine with a real Redis as its
// remote tier, kills Redis mid-run and starts it again. While it is down
// the circuit opens, remote calls fail fast, and lookups and retrieves keep
// working from RAM; once it is back the tier rejoins by itself.
func TestRemoteStoreRestartMidRun(t *testing.T) {
	srv := redistest.Start(t)
	e, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU",
		RemoteURLs: []string{srv.URL()}, RemoteTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	scope := chunk.Scope{Model: "m", WorldSize: 1}
	prompt := func(salt uint32) []uint32 {
		p := make([]uint32, 64)
		for i := range p {
			p[i] = uint32(i) + salt*1000
		}
		return p
	}
	chunks := func(salt byte) [][]byte {
		out := make([][]byte, 4)
		for i := range out {
			out[i] = bytes.Repeat([]byte{salt, byte(i)}, 32<<10)
		}
		return out
	}
	store := func(salt uint32) {
		t.Helper()
		if n, err := e.Store(ctx, engine.Request{Scope: scope, Tokens: prompt(salt)}, chunks(byte(salt))); n != 4 || err != nil {
			t.Fatalf("store %d: %d %v", salt, n, err)
		}
	}
	store(1)
	if err := e.Manager().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	remoteTier := e.Manager().Tiers()[1]
	if remoteTier.Name() != "redis" || tier.PrefixContains(remoteTier, keysOf(t, e, scope, prompt(1))) != 4 {
		t.Fatal("the chunks did not reach Redis")
	}

	srv.Stop()
	// The local tiers keep serving while the remote store is gone.
	for i := range 20 {
		store(uint32(10 + i))
		hit, err := e.Lookup(engine.Request{Scope: scope, Tokens: prompt(1)})
		if err != nil || hit.Chunks != 4 {
			t.Fatalf("lookup with Redis down: %+v %v", hit, err)
		}
	}
	guard := remote.GuardOf(remoteTier)
	deadline := time.Now().Add(20 * time.Second)
	for guard.Health().State != remote.StateOpen {
		e.Lookup(engine.Request{Scope: scope, Tokens: prompt(99)}) // misses go to the remote tier
		if time.Now().After(deadline) {
			t.Fatalf("the circuit did not open: %+v", guard.Health())
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if n := tier.PrefixContains(remoteTier, keysOf(t, e, scope, prompt(1))); n != 0 {
		t.Errorf("an open circuit reported %d chunks", n)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		// Liveness bound, generous: "fast" here means no network wait.
		t.Errorf("an open circuit took %v to answer", took)
	}

	redistest.StartOn(t, srv.Port()) // empty: Redis kept nothing on disk
	deadline = time.Now().Add(20 * time.Second)
	for guard.Health().State != remote.StateClosed {
		if time.Now().After(deadline) {
			t.Fatalf("the tier did not rejoin: %+v", guard.Health())
		}
		time.Sleep(20 * time.Millisecond)
	}
	store(2)
	if err := e.Manager().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := tier.PrefixContains(remoteTier, keysOf(t, e, scope, prompt(2))); n != 4 {
		t.Errorf("after the restart the remote tier holds %d of 4 new chunks", n)
	}
}

func keysOf(t *testing.T, e *engine.Engine, scope chunk.Scope, tokens []uint32) []chunk.Key {
	keys, _, _, err := e.Keys(nil, engine.Request{Scope: scope, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}
