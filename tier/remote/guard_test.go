package remote

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// guard wraps f for a test. A probe interval of an hour keeps the
// background probe out of tests that drive g.probe by hand.
func guard(t *testing.T, inner tier.Tier, o GuardOptions) *Guarded {
	t.Helper()
	if o.ProbeInterval == 0 {
		o.ProbeInterval = time.Hour
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute // tests that need a timeout set one
	}
	o.Logger = quiet
	g := Guard(inner, o)
	t.Cleanup(func() { g.Close() })
	return g
}

func TestGuardPassesThrough(t *testing.T) {
	noLeak(t)
	f := newFake()
	g := guard(t, f, GuardOptions{})
	ctx := context.Background()
	if err := g.Put(ctx, key(1), []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if !tier.Contains(g, key(1)) || tier.Contains(g, key(2)) {
		t.Fatal("Contains disagrees with the inner tier")
	}
	if n, ok := g.Size(key(1)); !ok || n != 5 {
		t.Fatalf("Size = %d, %v; want 5, true", n, ok)
	}
	if n := g.PrefixContains([]chunk.Key{key(1), key(2)}); n != 1 {
		t.Fatalf("PrefixContains = %d, want 1", n)
	}
	dst := make([]byte, 8)
	n, err := g.Get(ctx, key(1), dst)
	if err != nil || string(dst[:n]) != "hello" {
		t.Fatalf("Get = %q, %v", dst[:n], err)
	}
	if _, ok := tier.Tier(g).(tier.Pinner); ok {
		t.Fatal("a guarded remote tier cannot pin, so it must not be a tier.Pinner")
	}
	if !g.Remove(key(1)) || tier.Contains(g, key(1)) {
		t.Fatal("Remove did not reach the inner tier")
	}
	if g.Name() != "fake" || g.Stats().Objects != 42 {
		t.Fatalf("Name/Stats not passed through: %q %+v", g.Name(), g.Stats())
	}
	if h := g.Health(); h.State != StateClosed || h.Failures != 0 || h.FastFails != 0 {
		t.Fatalf("healthy store gave %+v", h)
	}
}

func TestGuardNotFoundIsNotAFailure(t *testing.T) {
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 2})
	for i := range 20 {
		_, err := g.Get(context.Background(), key(i), make([]byte, 4))
		if !errors.Is(err, tier.ErrNotFound) {
			t.Fatalf("Get of a missing key = %v, want ErrNotFound", err)
		}
		if tier.Contains(g, key(i)) || g.PrefixContains([]chunk.Key{key(i)}) != 0 {
			t.Fatal("missing key reported present")
		}
	}
	if h := g.Health(); h.State != StateClosed || h.Failures != 0 {
		t.Fatalf("misses tripped the breaker: %+v", h)
	}
}

func TestGuardOpensAfterThresholdAndFailsFast(t *testing.T) {
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 3})
	f.mode.Store(failing)
	ctx := context.Background()
	for i := range 3 {
		if g.Health().State != StateClosed {
			t.Fatalf("opened after %d failures, threshold is 3", i)
		}
		if err := g.Put(ctx, key(i), []byte("x")); !errors.Is(err, errRefused) {
			t.Fatalf("Put = %v, want the store's error", err)
		}
	}
	h := g.Health()
	if h.State != StateOpen || h.Opens != 1 || h.Failures != 3 {
		t.Fatalf("after 3 failures: %+v", h)
	}

	calls := f.calls.Load()
	if _, err := g.Get(ctx, key(1), make([]byte, 4)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get while open = %v, want ErrUnavailable", err)
	}
	if err := g.Put(ctx, key(1), []byte("x")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Put while open = %v, want ErrUnavailable", err)
	}
	if tier.Contains(g, key(1)) || g.PrefixContains([]chunk.Key{key(1)}) != 0 || g.Remove(key(1)) {
		t.Fatal("open circuit answered present")
	}
	if _, ok := g.Size(key(1)); ok {
		t.Fatal("open circuit answered a size")
	}
	if got := f.calls.Load(); got != calls {
		t.Fatalf("open circuit made %d inner calls", got-calls)
	}
	if h := g.Health(); h.FastFails != 6 {
		t.Fatalf("FastFails = %d, want 6", h.FastFails)
	}
}

func TestGuardSuccessResetsTheCount(t *testing.T) {
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 3})
	ctx := context.Background()
	for range 5 {
		f.mode.Store(failing)
		g.Put(ctx, key(1), []byte("x"))
		g.Put(ctx, key(1), []byte("x"))
		f.mode.Store(healthy)
		if err := g.Put(ctx, key(1), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if h := g.Health(); h.State != StateClosed || h.Failures != 10 {
		t.Fatalf("non-consecutive failures opened the circuit: %+v", h)
	}
}

func TestGuardTimeoutsDoNotBlockAndOpen(t *testing.T) {
	noLeak(t)
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 2, Timeout: 20 * time.Millisecond})
	defer f.unhang() // before Close, which runs at cleanup
	f.mode.Store(hanging)

	if tier.Contains(g, key(1)) {
		t.Fatal("hung Contains answered true")
	}
	_, err := g.Get(context.Background(), key(1), make([]byte, 4))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung Get = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	h := g.Health()
	if h.State != StateOpen || h.Timeouts != 2 || h.Abandoned != 2 {
		t.Fatalf("after two timeouts: %+v", h)
	}
}

func TestGuardBoundsAbandonedCalls(t *testing.T) {
	noLeak(t)
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 1000, Timeout: 5 * time.Millisecond, MaxAbandoned: 3})
	f.mode.Store(hanging)
	for range 10 {
		tier.Contains(g, key(1))
		g.Size(key(1))
	}
	h := g.Health()
	if h.State != StateClosed {
		t.Fatalf("threshold 1000 should keep the circuit closed: %+v", h)
	}
	if h.Abandoned != 3 || h.Timeouts != 3 || h.FastFails != 17 {
		t.Fatalf("want 3 abandoned calls, then fast fails: %+v", h)
	}
	if f.maxIn.Load() != 3 {
		t.Fatalf("%d inner calls ran at once, bound is 3", f.maxIn.Load())
	}
	f.unhang()
	eventually(t, "abandoned calls to finish", func() bool { return g.Health().Abandoned == 0 })
	f.mode.Store(healthy)
	if err := g.Put(context.Background(), key(1), []byte("x")); err != nil {
		t.Fatalf("Put after the hang cleared: %v", err)
	}
}

func TestGuardAbandonedGetNeverWritesCallerBuffer(t *testing.T) {
	f := newFake()
	f.scribble = 0xEE
	g := guard(t, f, GuardOptions{Timeout: 5 * time.Millisecond})
	f.mode.Store(hanging)
	dst := bytes.Repeat([]byte{1}, 64)
	if _, err := g.Get(context.Background(), key(1), dst); err == nil {
		t.Fatal("hung Get succeeded")
	}
	f.unhang()
	eventually(t, "abandoned Get to finish", func() bool { return g.Health().Abandoned == 0 })
	if !bytes.Equal(dst, bytes.Repeat([]byte{1}, 64)) {
		t.Fatal("an abandoned Get wrote into the caller's buffer")
	}
}

func TestGuardCallerCancelIsNotAFailure(t *testing.T) {
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 1})
	defer f.unhang()
	f.mode.Store(hanging)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for f.inflight.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := g.Get(ctx, key(1), make([]byte, 4))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Get = %v, want context.Canceled", err)
	}
	if h := g.Health(); h.State != StateClosed || h.Failures != 0 {
		t.Fatalf("caller's cancel counted against the store: %+v", h)
	}
}

// TestGuardProbeCycle drives the probe by hand: open → half-open on a good
// probe, a failed trial call reopens, two good probes close.
func TestGuardProbeCycle(t *testing.T) {
	f := newFake()
	g := guard(t, pingFake{f}, GuardOptions{Threshold: 1})
	ctx := context.Background()
	f.mode.Store(failing)
	g.Put(ctx, key(1), []byte("x"))
	g.probe()
	if h := g.Health(); h.State != StateOpen || h.ProbeFail != 1 {
		t.Fatalf("failed probe: %+v", h)
	}
	f.mode.Store(healthy)
	g.probe()
	if h := g.Health(); h.State != StateHalfOpen || h.ProbeOK != 1 {
		t.Fatalf("good probe should half-open: %+v", h)
	}
	f.mode.Store(failing)
	if err := g.Put(ctx, key(1), []byte("x")); !errors.Is(err, errRefused) {
		t.Fatalf("half-open trial Put = %v, want the store's error", err)
	}
	if h := g.Health(); h.State != StateOpen || h.Opens != 2 {
		t.Fatalf("failed trial should reopen: %+v", h)
	}
	f.mode.Store(healthy)
	g.probe()
	g.probe()
	if h := g.Health(); h.State != StateClosed {
		t.Fatalf("two good probes should close: %+v", h)
	}
}

func TestGuardHalfOpenAdmitsOneTrial(t *testing.T) {
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 1})
	g.state.Store(int32(StateHalfOpen))
	f.mode.Store(hanging)
	done := make(chan bool)
	go func() { done <- tier.Contains(g, key(1)) }()
	eventually(t, "trial call to reach the store", func() bool { return f.inflight.Load() == 1 })
	calls := f.calls.Load()
	if tier.Contains(g, key(2)) || f.calls.Load() != calls {
		t.Fatal("a second call got through while the trial was in flight")
	}
	if g.Health().FastFails != 1 {
		t.Fatalf("second call should fail fast: %+v", g.Health())
	}
	f.unhang()
	if <-done {
		t.Fatal("hung trial answered true")
	}
}

func TestGuardRecoversByItself(t *testing.T) {
	for _, tc := range []struct {
		name  string
		inner func(*fake) tier.Tier
	}{
		{"ping", func(f *fake) tier.Tier { return pingFake{f} }},
		{"size", func(f *fake) tier.Tier { return f }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeak(t)
			f := newFake()
			g := guard(t, tc.inner(f), GuardOptions{
				Threshold: 2, Timeout: 10 * time.Millisecond, ProbeInterval: time.Millisecond,
			})
			f.mode.Store(hanging)
			tier.Contains(g, key(1))
			tier.Contains(g, key(1))
			if g.Health().State == StateClosed {
				t.Fatal("timeouts did not open the circuit")
			}
			f.mode.Store(healthy)
			f.unhang()
			eventually(t, "circuit to close", func() bool { return g.Health().State == StateClosed })
			if h := g.Health(); h.ProbeOK < 2 {
				t.Fatalf("closed without two good probes: %+v", h)
			}
			if err := g.Put(context.Background(), key(1), []byte("x")); err != nil {
				t.Fatalf("Put after recovery: %v", err)
			}
		})
	}
}

func TestGuardClose(t *testing.T) {
	noLeak(t)
	f := newFake()
	g := Guard(f, GuardOptions{ProbeInterval: time.Millisecond, Logger: quiet})
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if !f.closed.Load() {
		t.Fatal("Close did not close the inner tier")
	}
	if err := g.Put(context.Background(), key(1), nil); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Put after Close = %v, want ErrClosed", err)
	}
	if g.Close() != nil {
		t.Fatal("second Close failed")
	}
}

func BenchmarkGuard(b *testing.B) {
	f := newFake()
	f.Put(context.Background(), key(1), make([]byte, 1<<20))
	g := Guard(f, GuardOptions{Logger: quiet})
	defer g.Close()
	dst := make([]byte, 1<<20)
	b.Run("contains/direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tier.Contains(f, key(1))
		}
	})
	b.Run("contains/guarded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tier.Contains(g, key(1))
		}
	})
	b.Run("get1MiB/direct", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(1 << 20)
		for b.Loop() {
			f.Get(context.Background(), key(1), dst)
		}
	})
	b.Run("get1MiB/guarded", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(1 << 20)
		for b.Loop() {
			g.Get(context.Background(), key(1), dst)
		}
	})
	b.Run("fastfail", func(b *testing.B) {
		g := Guard(f, GuardOptions{Logger: quiet, ProbeInterval: time.Hour})
		defer g.Close()
		g.state.Store(int32(StateOpen))
		b.ReportAllocs()
		for b.Loop() {
			g.Get(context.Background(), key(1), dst)
		}
	})
}

// TestGuardWithoutOptionalInterfaces guards a tier that has only the four
// methods of tier.Tier: Remove answers false without calling the store,
// PrefixContains asks Size key by key, and Stats carries the name alone.
func TestGuardWithoutOptionalInterfaces(t *testing.T) {
	noLeak(t)
	f := newFake()
	g := guard(t, struct{ tier.Tier }{f}, GuardOptions{})
	ctx := context.Background()
	for i := range 2 {
		if err := g.Put(ctx, key(i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	calls := f.calls.Load()
	if g.Remove(key(0)) || f.calls.Load() != calls {
		t.Fatal("Remove of a tier that cannot remove reached the store or reported success")
	}
	if n := g.PrefixContains([]chunk.Key{key(0), key(1), key(5)}); n != 2 || f.calls.Load() != calls+3 {
		t.Fatalf("PrefixContains = %d after %d calls; want 2 after 3 Size calls", n, f.calls.Load()-calls)
	}
	if st := g.Stats(); st != (tier.Stats{Name: "fake"}) {
		t.Fatalf("Stats = %+v, want the name alone", st)
	}
	enc := Encode(g, "enc", nil, nil)
	if enc.Remove(key(0)) || !enc.Contains(key(0)) {
		t.Fatal("Encoded over a tier that cannot remove removed")
	}
}

// Admits hands out the half-open trial as a call through the breaker
// would, once, until Report gives it back with the outcome.
func TestGuardAdmitsOneTrialWhenHalfOpen(t *testing.T) {
	f := newFake()
	g := guard(t, f, GuardOptions{Threshold: 1})
	g.state.Store(int32(StateHalfOpen))
	ok, trial := g.Admits()
	if !ok || !trial {
		t.Fatalf("first Admits when half-open = %v, %v; want the trial", ok, trial)
	}
	if ok, _ := g.Admits(); ok {
		t.Fatal("a second Admits got through while the trial was out")
	}
	g.Report(context.Background(), nil, trial) // the trial answered: the circuit closes
	if h := g.Health(); h.State != StateClosed {
		t.Fatalf("after the trial's success: %+v", h)
	}
	if ok, trial := g.Admits(); !ok || trial {
		t.Fatalf("Admits when closed = %v, %v; want admitted, no trial", ok, trial)
	}
	g.state.Store(int32(StateOpen))
	if ok, _ := g.Admits(); ok {
		t.Fatal("Admits let a call through an open circuit")
	}
}
