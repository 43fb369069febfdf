package arena

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// fragmented returns an arena about half full of mixed-size objects, so the
// benchmarks search real free lists rather than one pristine run.
func fragmented(b *testing.B) *Arena {
	a := newArena(b, 1<<16)
	rng := rand.New(rand.NewPCG(1, 2))
	var ids []ID
	for {
		size := 16 * page
		if rng.IntN(5) == 0 {
			size = 1 + rng.IntN(size)
		}
		id, err := a.Alloc(size)
		if err != nil {
			break
		}
		ids = append(ids, id)
	}
	for i, id := range ids {
		if i%2 == 0 {
			a.Unref(id)
		}
	}
	return a
}

func BenchmarkAllocUnref(b *testing.B) {
	a := fragmented(b)
	b.ReportAllocs()
	for b.Loop() {
		id, err := a.Alloc(16 * page)
		if err != nil {
			b.Fatal(err)
		}
		a.Unref(id)
	}
}

func BenchmarkAllocUnrefParallel(b *testing.B) {
	a := fragmented(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id, err := a.Alloc(16 * page)
			if err != nil {
				b.Error(err)
				return
			}
			a.Unref(id)
		}
	})
}

// BenchmarkRefUnref is what a reader costs the arena: the engine's leases
// take and drop one reference per chunk they hold.
func BenchmarkRefUnref(b *testing.B) {
	a := fragmented(b)
	id := mustAlloc(b, a, page)
	b.ReportAllocs()
	for b.Loop() {
		if !a.Ref(id) {
			b.Fatal("Ref of a live object failed")
		}
		a.Unref(id)
	}
}

// BenchmarkBaselineMutex is the floor under every arena call: one
// uncontended lock and unlock. Compare the others against it.
func BenchmarkBaselineMutex(b *testing.B) {
	var mu sync.Mutex
	n := 0
	for b.Loop() {
		mu.Lock()
		n++
		mu.Unlock()
	}
	_ = n
}
