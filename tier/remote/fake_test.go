package remote

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

// Modes of the fake store.
const (
	healthy int32 = iota
	failing       // every call answers at once with a connection error
	hanging       // every call blocks until release is closed
)

var errRefused = errors.New("fake: connection refused")

// fake is an in-memory tier whose store can be made to fail or hang, to test
// the breaker around it.
type fake struct {
	mode     atomic.Int32
	calls    atomic.Int64 // inner calls started
	inflight atomic.Int64
	maxIn    atomic.Int64
	closed   atomic.Bool
	release  chan struct{}

	// scribble, when set, is written into Get's buffer after a hang ends,
	// so tests can see whether an abandoned call reached the caller's dst.
	scribble byte

	mu   sync.Mutex
	data map[chunk.Key][]byte
	// compared is how many bytes RemoveDamaged's conditions held, in all.
	compared int
}

func newFake() *fake {
	return &fake{release: make(chan struct{}), data: make(map[chunk.Key][]byte)}
}

// pingFake adds the optional Ping probe.
type pingFake struct{ *fake }

func (p pingFake) Ping(ctx context.Context) error {
	return p.enter(nil)
}

// enter counts a call and applies the mode; it returns the error a failing
// store gives.
func (f *fake) enter(after func()) error {
	f.calls.Add(1)
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	switch f.mode.Load() {
	case failing:
		return errRefused
	case hanging:
		<-f.release
		if after != nil {
			after()
		}
		return errRefused
	}
	return nil
}

func (f *fake) unhang() { close(f.release) }

func (f *fake) Name() string { return "fake" }

func (f *fake) Contains(k chunk.Key) bool {
	if f.enter(nil) != nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.data[k]
	return ok
}

func (f *fake) PrefixContains(keys []chunk.Key) int {
	if f.enter(nil) != nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range keys {
		if _, ok := f.data[k]; !ok {
			return i
		}
	}
	return len(keys)
}

func (f *fake) Size(k chunk.Key) (int, bool) {
	if f.enter(nil) != nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.data[k]
	return len(v), ok
}

func (f *fake) Get(ctx context.Context, k chunk.Key, dst []byte) (int, error) {
	err := f.enter(func() {
		if f.scribble != 0 {
			for i := range dst {
				dst[i] = f.scribble
			}
		}
	})
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.data[k]
	if !ok {
		return 0, fmt.Errorf("fake: %v: %w", k, tier.ErrNotFound)
	}
	if len(dst) < len(v) {
		return 0, fmt.Errorf("fake: dst too short")
	}
	return copy(dst, v), nil
}

func (f *fake) Put(ctx context.Context, k chunk.Key, data []byte) error {
	if err := f.enter(nil); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.data[k] = append([]byte(nil), data...)
	return nil
}

func (f *fake) Remove(k chunk.Key) bool {
	if f.enter(nil) != nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.data[k]
	delete(f.data, k)
	return ok
}

func (f *fake) Stats() tier.Stats { return tier.Stats{Name: "fake", Objects: 42} }

func (f *fake) Close() error { f.closed.Store(true); return nil }

func key(i int) chunk.Key {
	k := chunk.Key{Scope: 7}
	k.Hash[0], k.Hash[1] = byte(i), byte(i>>8)
	return k
}

// eventually polls cond until it holds; the generous limit only turns a
// hang into a failure, it does not measure speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// noLeak fails the test if goroutines started during it are still running
// at cleanup (with a small tolerance for runtime helpers).
func noLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		eventually(t, "goroutines to wind down", func() bool {
			return runtime.NumGoroutine() <= before+2
		})
	})
}

// RemoveDamaged implements DamageRemover: the object goes only while it
// matches d.
func (f *fake) RemoveDamaged(k chunk.Key, d Damage) Removal {
	if f.enter(nil) != nil {
		return DamageKept
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.compared += len(d.Head) + len(d.Part)
	v, ok := f.data[k]
	if !ok || !d.Matches(v) {
		return DamageGone
	}
	delete(f.data, k)
	return DamageRemoved
}
