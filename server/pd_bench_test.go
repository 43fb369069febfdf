package server_test

import (
	"context"
	"fmt"
	"testing"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/server"
)

// pdRig is a producer and a consumer served in this process, with
// connections to push from one and read on the other.
type pdRig struct {
	prod, cons *daemon
	pc, cc     *client.Client
	dst        [][]byte
	id         uint64
}

func newPDRig(tb testing.TB, chunks, size int) *pdRig {
	r := &pdRig{prod: startService(tb, 128<<20, server.ServiceOptions{}),
		cons: startService(tb, 128<<20, server.ServiceOptions{})}
	r.pc, r.cc = r.prod.local(tb), r.cons.remote(tb)
	r.dst = make([][]byte, chunks)
	for j := range r.dst {
		r.dst[j] = make([]byte, size)
	}
	return r
}

// transfer pushes keys to the consumer, waits for them there and reads
// them (which ends their holds), then drops them from the consumer so
// the next transfer stores them again.
func (r *pdRig) transfer(ctx context.Context, keys []chunk.Key) error {
	r.id++
	if _, err := r.pc.Push(ctx, r.id, r.cons.tcp, client.Raw(keys), 0, true); err != nil {
		return err
	}
	if w, err := r.cc.Wait(ctx, client.Raw(keys), 0, 10000); err != nil || int(w.Chunks) != len(keys) {
		return fmt.Errorf("wait: %+v %v", w, err)
	}
	if n, _, err := r.cc.Retrieve(ctx, client.Raw(keys), r.dst); err != nil || n != len(keys) {
		return fmt.Errorf("retrieve: %d %v", n, err)
	}
	r.cons.eng.Clear(keys[0].Scope)
	return nil
}

// BenchmarkPush measures a transfer of n chunks of 64 KiB from PUSH to
// the consumer's WAIT returning (and its read). With -benchmem, allocs/op
// staying flat from 8 to 64 chunks shows the push path allocates nothing
// per chunk.
func BenchmarkPush(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			r := newPDRig(b, n, pChunkBytes)
			keys := pdKeys(n, 20)
			storeRaw(b, r.prod.remote(b), keys, 21, pChunkBytes)
			ctx := context.Background()
			b.SetBytes(int64(n * pChunkBytes))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := r.transfer(ctx, keys); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestPushAllocsPerChunk: the allocations of a whole transfer (both
// daemons, both clients) do not grow with its chunks.
func TestPushAllocsPerChunk(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ctx := context.Background()
	per := func(n int) float64 {
		r := newPDRig(t, n, 4096)
		keys := pdKeys(n, byte(30+n))
		storeRaw(t, r.prod.remote(t), keys, 22, 4096)
		for range 3 { // warm: connection pool, maps, scratch slices
			if err := r.transfer(ctx, keys); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(20, func() {
			if err := r.transfer(ctx, keys); err != nil {
				t.Fatal(err)
			}
		})
	}
	small, large := per(8), per(64)
	t.Logf("allocations per transfer: %.0f for 8 chunks, %.0f for 64", small, large)
	if perChunk := (large - small) / 56; perChunk >= 0.5 {
		t.Errorf("%.2f allocations per extra chunk (%.0f for 8 chunks, %.0f for 64)", perChunk, small, large)
	}
}
