package remote

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
)

func TestCallDeadline(t *testing.T) {
	for _, tc := range []struct {
		base time.Duration
		bw   int64
		n    int
		want time.Duration
	}{
		{100 * time.Millisecond, 128 << 20, 0, 100 * time.Millisecond},
		{100 * time.Millisecond, 128 << 20, 32 << 20, 350 * time.Millisecond},
		{10 * time.Millisecond, 1 << 20, 1 << 19, 510 * time.Millisecond},
		{10 * time.Millisecond, 0, 1 << 30, 10 * time.Millisecond}, // no bandwidth: the base alone
		{time.Second, 1, 512 << 20, time.Second + (512<<20)*time.Second},
	} {
		if got := CallDeadline(tc.base, tc.bw, tc.n); got != tc.want {
			t.Errorf("CallDeadline(%v, %d, %d) = %v, want %v", tc.base, tc.bw, tc.n, got, tc.want)
		}
	}
}

func TestBoundCallKeepsAnEarlierDeadline(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	ctx, done := BoundCall(parent, time.Millisecond, 1, 1)
	defer done()
	if ctx != parent {
		t.Error("BoundCall replaced a context that had a deadline")
	}
	ctx, done = BoundCall(context.Background(), time.Second, 1<<20, 1<<20)
	defer done()
	d, ok := ctx.Deadline()
	if left := time.Until(d); !ok || left < time.Second || left > 2*time.Second {
		t.Errorf("BoundCall without a deadline: %v left, want about 2s", left)
	}
}

func TestOpenTakesTimeoutAndBandwidth(t *testing.T) {
	var got *url.URL
	var gotOpts Options
	register(t, "test-deadline", func(ctx context.Context, u *url.URL, o Options) (tier.Tier, error) {
		got, gotOpts = u, o
		return newFake(), nil
	})
	raw := "test-deadline://u:pw@host:1/db?prefix=a%2Fb&timeout=150ms&bandwidth=1GiB&x=1"
	tr, err := Open(context.Background(), raw, Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tier.Close(tr)
	// The backend sees its own parameters, untouched, and none of ours.
	if got.RawQuery != "prefix=a%2Fb&x=1" {
		t.Errorf("backend query %q", got.RawQuery)
	}
	if gotOpts.Timeout != 150*time.Millisecond || gotOpts.Bandwidth != 1<<30 {
		t.Errorf("backend options %+v", gotOpts)
	}
	o, err := OptionsOf(raw, Options{Timeout: time.Second})
	if err != nil || o.Timeout != gotOpts.Timeout || o.Bandwidth != gotOpts.Bandwidth {
		t.Errorf("OptionsOf = %+v, %v; Open used %+v", o, err, gotOpts)
	}
	o, err = OptionsOf("test-deadline://host:1", Options{Timeout: time.Second})
	if err != nil || o.Timeout != time.Second || o.Bandwidth != DefaultBandwidth {
		t.Errorf("OptionsOf without parameters = %+v, %v", o, err)
	}
}

func TestOpenRejectsBadDeadlines(t *testing.T) {
	register(t, "test-bad-deadline", func(ctx context.Context, u *url.URL, o Options) (tier.Tier, error) {
		t.Error("backend reached with a bad parameter")
		return newFake(), nil
	})
	for _, q := range []string{"timeout=0s", "timeout=-1s", "timeout=soon", "bandwidth=0", "bandwidth=fast", "timeout=%zz"} {
		raw := "test-bad-deadline://u:s3cret@host:1/?" + q
		_, err := Open(context.Background(), raw, Options{})
		if !errors.Is(err, ErrBadURL) {
			t.Errorf("%s: %v, want ErrBadURL", q, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error shows the password: %v", q, err)
		}
	}
}

// cachedFake answers Contains and Size from a cache of its own, as the
// Redis and S3 tiers do, so they keep answering while the store hangs.
type cachedFake struct{ *fake }

func (c cachedFake) Contains(chunk.Key) bool          { return true }
func (c cachedFake) Size(chunk.Key) (int, bool)       { return 4, true }
func (c cachedFake) PrefixContains(k []chunk.Key) int { return len(k) }

// TestGuardCachedAnswersDoNotHideFailures: answers that never reached the
// store must not reset the failure count, or the circuit never opens.
func TestGuardCachedAnswersDoNotHideFailures(t *testing.T) {
	f := newFake()
	g := guard(t, cachedFake{f}, GuardOptions{Threshold: 3})
	f.mode.Store(failing)
	ctx := context.Background()
	for range 3 {
		if !tier.Contains(g, key(1)) {
			t.Fatal("cached Contains answered false")
		}
		g.Size(key(1))
		g.PrefixContains([]chunk.Key{key(1)})
		if _, err := g.Get(ctx, key(1), make([]byte, 4)); err == nil {
			t.Fatal("Get of a failing store succeeded")
		}
	}
	if h := g.Health(); h.State != StateOpen {
		t.Fatalf("three failed reads between cached answers: %+v", h)
	}
}

// reportingFake reports its presence checks' errors (PresenceReporter).
type reportingFake struct{ *fake }

func (r reportingFake) SizeErr(k chunk.Key) (int, bool, error) {
	if err := r.enter(nil); err != nil {
		return 0, false, err
	}
	n, ok := r.fake.Size(k)
	return n, ok, nil
}

func (r reportingFake) PrefixContainsErr(keys []chunk.Key) (int, error) {
	if err := r.enter(nil); err != nil {
		return 0, err
	}
	return r.fake.PrefixContains(keys), nil
}

// TestGuardCountsReportedPresenceErrors: a store that refuses connections
// fails presence checks at once; reported, those failures open the
// circuit, while plain misses do not.
func TestGuardCountsReportedPresenceErrors(t *testing.T) {
	f := newFake()
	g := guard(t, reportingFake{f}, GuardOptions{Threshold: 3})
	for range 5 {
		tier.Contains(g, key(1))
		g.PrefixContains([]chunk.Key{key(1)})
	}
	if h := g.Health(); h.State != StateClosed || h.Failures != 0 {
		t.Fatalf("misses counted as failures: %+v", h)
	}
	f.mode.Store(failing)
	tier.Contains(g, key(1))
	g.Size(key(1))
	g.PrefixContains([]chunk.Key{key(1)})
	if h := g.Health(); h.State != StateOpen || h.Failures != 3 {
		t.Fatalf("three refused presence checks: %+v", h)
	}
}

// slowFake answers Get after delay, as a store moving a large object does.
type slowFake struct {
	*fake
	delay time.Duration
}

func (s slowFake) Get(ctx context.Context, k chunk.Key, dst []byte) (int, error) {
	select {
	case <-time.After(s.delay):
		return s.fake.Get(ctx, k, dst)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestGuardDeadlineGrowsWithSize: a Get may take its base deadline plus
// its bytes at the assumed bandwidth. The margins are wide (a 100 ms read
// against 20 ms and 5 s deadlines) so a loaded machine cannot flip them.
func TestGuardDeadlineGrowsWithSize(t *testing.T) {
	f := newFake()
	g := guard(t, slowFake{f, 100 * time.Millisecond}, GuardOptions{Timeout: 20 * time.Millisecond, Bandwidth: 1 << 20})
	ctx := context.Background()
	big := make([]byte, 5<<20) // 5 s at 1 MiB/s
	if err := f.Put(ctx, key(1), big); err != nil {
		t.Fatal(err)
	}
	if err := f.Put(ctx, key(2), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Get(ctx, key(1), big); err != nil || n != len(big) {
		t.Errorf("a large Get within its size's deadline: %d, %v", n, err)
	}
	if _, err := g.Get(ctx, key(2), make([]byte, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a one-byte Get slower than the base deadline: %v, want a timeout", err)
	}
}
