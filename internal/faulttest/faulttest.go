// Package faulttest drills a remote tier through the failures a shared
// store has in production — hung, dead, or silent behind a port that
// accepts and never answers — and checks what kvtier promises then: a
// chunk held only by the sick store reads as a miss, never an error; once
// the circuit breaker has cut the store off, reading costs next to
// nothing; and the tier serves again soon after the store recovers.
//
// The drill stacks the tier the way the engine does (a RAM tier over
// remote.Encode over remote.Guard) with the default deadlines. The caller
// supplies a real store and real ways to make it sick; the package only
// adds Relay, a TCP listener in front of a real server that can go silent.
//
// Timing is noisy on shared machines: the drill asserts bounds several
// times the ones kvtier aims for and logs every measured figure.
package faulttest

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/mem"
	"kvtier/tier/remote"
)

// Aims and the looser bounds the drill asserts.
const (
	// FastCall bounds each read from the 7th on, when the breaker must be
	// open (the aim is 50 ms).
	FastCall = 250 * time.Millisecond
	// Rejoin bounds how long after the store recovers the tier serves
	// again (the aim is 1 s).
	Rejoin = 5 * time.Second
	// Calls is how many reads the drill makes while the store is sick.
	Calls = 12
	// slowAllowed is how many leading calls may wait for the deadline
	// before the breaker opens.
	slowAllowed = 6

	chunkBytes = 64 << 10
	fillers    = 40 // stored after the targets to push them out of RAM
	ramBytes   = 1 << 20
	hang       = 30 * time.Second // a liveness bound, not a measurement
)

// Drill is one remote tier stacked under a small RAM tier.
type Drill struct {
	Guard   *remote.Guarded
	Manager *tier.Manager
	scope   uint64
}

// New stacks inner (an opened remote tier, which the drill closes) under a
// 1 MiB RAM tier, stores Calls target chunks and enough after them that the
// targets live only in inner.
func New(t *testing.T, inner tier.Tier) *Drill {
	t.Helper()
	a, err := arena.New(arena.Options{Capacity: ramBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ram, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	g := remote.Guard(inner, remote.GuardOptions{Logger: slog.New(slog.DiscardHandler)})
	enc := remote.Encode(g, inner.Name(), nil, nil)
	m, err := tier.NewManager(ram, []tier.Tier{enc}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	d := &Drill{Guard: g, Manager: m, scope: uint64(time.Now().UnixNano())}
	for i := range Calls + fillers {
		d.store(t, enc, i)
	}
	for i := range Calls {
		n, byTier, _ := m.Lookup([]chunk.Key{d.Key(i)})
		if n != 1 || byTier[0] != 0 {
			t.Fatalf("target %d is not held by %s alone: %d %v", i, inner.Name(), n, byTier)
		}
	}
	return d
}

// store writes chunk i through the manager until the remote tier has it.
// The default deadlines are tight for a machine running the race detector,
// and a write that misses one is dropped, not retried: storing again
// queues it again.
func (d *Drill) store(t *testing.T, remoteTier tier.Tier, i int) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(hang)
	for {
		if n, err := d.Manager.Store(ctx, []chunk.Key{d.Key(i)}, [][]byte{Chunk(i)}); err != nil || n != 1 {
			t.Fatalf("store %d: %d, %v", i, n, err)
		}
		// A queued write keeps its chunk busy in RAM; let it land before
		// the next store needs the space.
		flush, cancel := context.WithTimeout(ctx, hang)
		err := d.Manager.Flush(flush)
		cancel()
		// Not durable: the store still refuses (its breaker is not yet
		// closed again); the loop below tries again until hang.
		if err != nil && !errors.Is(err, tier.ErrNotDurable) {
			t.Fatalf("writing chunk %d to %s: %v", i, remoteTier.Name(), err)
		}
		if tier.Contains(remoteTier, d.Key(i)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("chunk %d never reached %s: %+v", i, remoteTier.Name(), d.Guard.Health())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Key names chunk i of the drill.
func (d *Drill) Key(i int) chunk.Key {
	return chunk.Key{Scope: d.scope, Hash: chunk.Hash{byte(i), byte(i >> 8), 0xfa, 0x17}}
}

// Chunk is the content of chunk i.
func Chunk(i int) []byte {
	b := make([]byte, chunkBytes)
	for j := range b {
		b[j] = byte(i*7 + j)
	}
	return b
}

// Sick reads each target in its own Retrieve while the store is sick and
// checks that every read is a miss without error, and that the reads from
// the 7th on are fast and the breaker open. It returns each read's time.
func (d *Drill) Sick(t *testing.T) []time.Duration {
	t.Helper()
	dst := [][]byte{make([]byte, chunkBytes)}
	took := make([]time.Duration, Calls)
	for i := range Calls {
		start := time.Now()
		n, err := d.Manager.Retrieve(context.Background(), []chunk.Key{d.Key(i)}, dst)
		took[i] = time.Since(start)
		if err != nil {
			t.Fatalf("read %d with the store sick: %v (want a miss, not an error)", i+1, err)
		}
		if n != 0 {
			t.Fatalf("read %d with the store sick returned %d chunks", i+1, n)
		}
	}
	CheckFast(t, took)
	if h := d.Guard.Health(); h.State == remote.StateClosed {
		t.Errorf("after %d failed reads the circuit is closed: %+v", Calls, h)
	}
	return took
}

// CheckFast logs every call's time and fails the test when a call after
// the first few took longer than FastCall.
func CheckFast(t testing.TB, took []time.Duration) {
	t.Helper()
	var worst time.Duration
	for _, d := range took[min(slowAllowed, len(took)):] {
		worst = max(worst, d)
	}
	t.Logf("per-call times with the store sick: %v", took)
	t.Logf("worst of calls %d-%d: %v (bound %v, aim 50ms)", slowAllowed+1, len(took), worst, FastCall)
	if worst > FastCall {
		t.Errorf("calls %d-%d took up to %v each, bound %v", slowAllowed+1, len(took), worst, FastCall)
	}
}

// Healed waits until the circuit closes again and returns how long that
// took after since, the moment the store recovered.
func (d *Drill) Healed(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	WaitRejoin(t, since, func() bool { return d.Guard.Health().State == remote.StateClosed })
	return time.Since(since)
}

// WaitRejoin polls closed until it is true, logs how long after since that
// was, and fails the test when it was later than Rejoin.
func WaitRejoin(t testing.TB, since time.Time, closed func() bool) {
	t.Helper()
	for !closed() {
		if time.Since(since) > hang {
			t.Fatalf("the tier did not rejoin within %v", hang)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(since)
	t.Logf("tier rejoined %v after the store recovered (bound %v, aim 1s)", took, Rejoin)
	if took > Rejoin {
		t.Errorf("rejoining took %v, bound %v", took, Rejoin)
	}
}

// Served checks that chunk i reads back whole now.
func (d *Drill) Served(t *testing.T, i int) {
	t.Helper()
	dst := [][]byte{make([]byte, chunkBytes)}
	n, err := d.Manager.Retrieve(context.Background(), []chunk.Key{d.Key(i)}, dst)
	if err != nil || n != 1 || string(dst[0]) != string(Chunk(i)) {
		t.Fatalf("read of chunk %d after the store recovered: %d chunks, %v", i, n, err)
	}
}
