package remote

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
)

// damagedObject stores a good object for k through e, then flips a byte
// of its payload in f, and returns the damaged bytes.
func damagedObject(t *testing.T, e *Encoded, f *fake, k chunk.Key, data []byte) []byte {
	t.Helper()
	if err := e.Put(context.Background(), k, data); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.data[k][len(f.data[k])-1] ^= 1
	return append([]byte(nil), f.data[k]...)
}

func (f *fake) holds(k chunk.Key) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.data[k]
	return v, ok
}

// TestDamagedObjectOnProbationIsRemoved: a damaged object read while the
// circuit is closed on probation reopens it, and is removed all the same,
// so that after the back-off the same key is a plain miss that leaves the
// circuit closed (was: the removal went through the circuit the report had
// just opened, was refused, and the object reopened the circuit at every
// read after each back-off, forever).
func TestDamagedObjectOnProbationIsRemoved(t *testing.T) {
	f := newFake()
	g := guard(t, pingFake{f}, GuardOptions{Threshold: 2, CorruptBackoff: time.Minute})
	advance := testClock(g)
	e := Encode(g, "fake", nil, nil)
	ctx := context.Background()
	k := key(7)
	damagedObject(t, e, f, k, []byte("a chunk of KV, damaged in the store"))

	g.ReportCorrupt()
	g.ReportCorrupt() // open for corruption
	advance(time.Minute)
	g.probe()
	g.probe()
	if h := g.Health(); h.State != StateClosed {
		t.Fatalf("after the back-off and two probes: %+v", h)
	}
	if _, err := e.Get(ctx, k, make([]byte, 64)); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("read of the damaged object on probation: %v", err)
	}
	if h := g.Health(); h.State != StateOpen || h.CorruptOpens != 2 {
		t.Fatalf("a corrupt read on probation: %+v, want open again", h)
	}
	if _, ok := f.holds(k); ok {
		t.Fatal("the damaged object that reopened the circuit is still in the store")
	}
	advance(2 * time.Minute)
	g.probe()
	g.probe()
	if _, err := e.Get(ctx, k, make([]byte, 64)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("the same key after the back-off: %v, want a miss", err)
	}
	if h := g.Health(); h.State != StateClosed || h.CorruptOpens != 2 {
		t.Fatalf("after the miss: %+v, want closed", h)
	}
}

// TestDamagedReadSparesANewerObject: a reader that found an object
// damaged removes it only if the store still holds those bytes. Here the
// damaged object was read by Size (kept for the Get, as with any codec
// but raw), then replaced in the store by a good one (another reader
// removed the damaged object, a writer stored the chunk again): the Get
// that finds the kept bytes damaged leaves the good object alone.
func TestDamagedReadSparesANewerObject(t *testing.T) {
	f := newFake()
	g := guard(t, pingFake{f}, GuardOptions{Threshold: 5})
	zstd, _ := codec.Lookup("zstd")
	e := Encode(g, "fake", zstd, nil)
	ctx := context.Background()
	k := key(8)
	data := []byte("a chunk of KV that compresses: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
	damagedObject(t, e, f, k, data)
	size, ok := e.Size(k) // fetches the damaged object and keeps it
	if !ok {
		t.Fatal("Size of the damaged object (its header is intact)")
	}
	good, err := codec.Seal(nil, zstd, kvformat.Spec{}, data)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.data[k] = good // removed by another reader, stored again by a writer
	f.mu.Unlock()

	if _, err := e.Get(ctx, k, make([]byte, size)); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get of the kept damaged bytes: %v", err)
	}
	if v, ok := f.holds(k); !ok || string(v) != string(good) {
		t.Fatal("the good object stored since the damaged read was removed")
	}
	dst := make([]byte, size)
	if n, err := e.Get(ctx, k, dst); err != nil || string(dst[:n]) != string(data) {
		t.Fatalf("the good object: %q, %v", dst[:n], err)
	}

	// The damaged object itself, still there, is removed.
	k2 := key(9)
	damagedObject(t, e, f, k2, data)
	if _, err := e.Get(ctx, k2, make([]byte, size)); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get of a damaged object: %v", err)
	}
	if _, ok := f.holds(k2); ok {
		t.Fatal("the damaged object was not removed")
	}
}

// TestForeignErrorIsNotDamage: ErrCorrupt from the store that wraps
// codec.ErrForeign (a Redis list under an object's key) counts neither as
// a corrupt read nor towards opening the circuit.
func TestForeignErrorIsNotDamage(t *testing.T) {
	g := guard(t, foreignFake{newFake()}, GuardOptions{Threshold: 2})
	for range 10 {
		if _, err := g.Get(context.Background(), key(1), make([]byte, 4)); !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("foreign value: %v", err)
		}
	}
	if h := g.Health(); h.State != StateClosed || h.Corrupt != 0 || h.CorruptOpens != 0 {
		t.Fatalf("after 10 reads of a foreign value: %+v, want closed, nothing corrupt", h)
	}
}

// foreignFake answers every Get with a foreign value's error, as the Redis
// tier does for a key that holds a list.
type foreignFake struct{ *fake }

func (c foreignFake) Get(context.Context, chunk.Key, []byte) (int, error) {
	return 0, errors.Join(tier.ErrCorrupt, codec.ErrForeign)
}

// TestLateCorruptReportIsNoOpening: a corrupt read reported while the
// circuit is open already (for failures) holds the probes, but is no
// opening: neither opening count moves.
func TestLateCorruptReportIsNoOpening(t *testing.T) {
	g := guard(t, pingFake{newFake()}, GuardOptions{Threshold: 1})
	g.transition(StateClosed, StateOpen, "test")
	g.ReportCorrupt()
	if h := g.Health(); h.State != StateOpen || h.Opens != 1 || h.CorruptOpens != 0 {
		t.Fatalf("corrupt report while open: %+v, want one opening, none for corruption", h)
	}
}

// TestCorruptBackoffMaxBelowBackoff: a cap set below the back-off is the
// back-off (was: the default 10 minutes).
func TestCorruptBackoffMaxBelowBackoff(t *testing.T) {
	o := GuardOptions{CorruptBackoff: time.Minute, CorruptBackoffMax: time.Second}.withDefaults()
	if o.CorruptBackoffMax != time.Minute {
		t.Fatalf("CorruptBackoffMax = %v, want the back-off, 1m", o.CorruptBackoffMax)
	}
	if o := (GuardOptions{}).withDefaults(); o.CorruptBackoff != DefaultCorruptBackoff || o.CorruptBackoffMax != DefaultCorruptBackoffMax {
		t.Fatalf("defaults: %v, %v", o.CorruptBackoff, o.CorruptBackoffMax)
	}
}

// TestProbationEndRacesAnOpening: a circuit opened for corruption between
// a verified read's look at the probation and its end of it stays on
// probation with its doubled back-off (was: open for corruption, off
// probation, back-off reset).
func TestProbationEndRacesAnOpening(t *testing.T) {
	g := guard(t, pingFake{newFake()}, GuardOptions{Threshold: 1, CorruptBackoff: time.Minute, CorruptBackoffMax: time.Hour})
	advance := testClock(g)
	g.ReportCorrupt()
	advance(time.Minute)
	g.probe()
	g.probe() // closed, on probation, next back-off 2 min
	g.cor.racing = func() { g.cor.racing = nil; g.ReportCorrupt() }
	g.ReportVerified()
	if h := g.Health(); h.State != StateOpen || !g.cor.probation.Load() {
		t.Fatalf("opened for corruption during a verified read: %+v, probation %v", h, g.cor.probation.Load())
	}
	g.cor.mu.Lock()
	next := g.cor.backoff
	g.cor.mu.Unlock()
	if next != 4*time.Minute {
		t.Fatalf("next back-off %v, want 4m (the back-off was reset)", next)
	}
}

// TestReadersOfOneDamagedObjectCountOnce: several readers that found one
// object damaged at once (a hot chunk read by concurrent requests) each
// come to remove it; the first does and counts the read against the
// store, the others find it gone and do not (was: all five counted, and
// the circuit opened for corruption over one damaged object). All five
// count in the tier's own Corrupt.
func TestReadersOfOneDamagedObjectCountOnce(t *testing.T) {
	f := newFake()
	g := guard(t, pingFake{f}, GuardOptions{Threshold: 2})
	e := Encode(g, "fake", nil, nil)
	k := key(4)
	bad := damagedObject(t, e, f, k, []byte("a hot chunk of KV, damaged in the store"))
	for range 5 {
		e.damaged(k, codec.ErrCorrupt, Damage{Size: len(bad), Head: bad})
	}
	if _, ok := f.holds(k); ok {
		t.Fatal("the damaged object was not removed")
	}
	if h := g.Health(); h.State != StateClosed || h.Corrupt != 1 {
		t.Fatalf("after five readers of one damaged object: %+v, want closed, one corrupt read", h)
	}
	if got := e.corrupt.Load(); got != 5 {
		t.Fatalf("tier Corrupt = %d, want 5", got)
	}
}

// rangeStore is a fake that reads ranges, short at an object's end; after,
// when set, runs after each range read.
type rangeStore struct {
	*fake
	after func(off int)
}

func (r *rangeStore) Ping(context.Context) error { return nil }

func (r *rangeStore) GetRange(_ context.Context, k chunk.Key, off int, dst []byte) (int, error) {
	r.mu.Lock()
	v := r.data[k]
	n := 0
	if off < len(v) {
		n = copy(dst, v[off:])
	}
	r.mu.Unlock()
	if r.after != nil {
		r.after(off)
	}
	return n, nil
}

// TestTruncatedRangeReadSparesAGoodObject: a range read that comes back
// short (a truncated object) states the length it found, so that a good
// object stored under the key since (another reader removed the truncated
// one, a writer stored the chunk again), which begins with the same
// bytes, is not removed in its place (was: no length, and the good object
// matched). The error names the piece that was cut, not the first piece
// read. A truncated object still there is removed; so is a truncated
// header, and a good object that replaced it is spared likewise.
func TestTruncatedRangeReadSparesAGoodObject(t *testing.T) {
	data := make([]byte, 3*4096+100) // four pieces of 4 KiB
	for i := range data {
		data[i] = byte(i * 7)
	}
	good, err := codec.SealPieced(nil, kvformat.Spec{}, data)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		cut         int  // bytes of the object stored
		swap        bool // the good object replaces it after the read
		headerFails bool // OpenRange fails
	}{
		{"cut in the last piece, replaced", len(good) - 50, true, false},
		{"cut in the last piece, still there", len(good) - 50, false, false},
		{"cut in the header, replaced", 100, true, true},
		{"cut in the header, still there", 100, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			s := &rangeStore{fake: f}
			e := Encode(s, "fake", nil, nil)
			k := key(3)
			f.data[k] = append([]byte(nil), good[:tc.cut]...)
			swapAfter := func(off int) {
				if tc.swap && (off > 0 || tc.headerFails) {
					s.after = nil
					f.mu.Lock()
					f.data[k] = append([]byte(nil), good...)
					f.mu.Unlock()
				}
			}
			dst := make([]byte, len(data))
			if tc.headerFails {
				s.after = swapAfter
			}
			rr, err := e.OpenRange(ctx, k, dst)
			if tc.headerFails {
				if !errors.Is(err, tier.ErrCorrupt) {
					t.Fatalf("OpenRange of a cut header: %v", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				s.after = swapAfter
				err = rr.ReadRange(ctx, 0, len(data))
				if !errors.Is(err, tier.ErrCorrupt) || !strings.Contains(err.Error(), "piece 3 of 4") {
					t.Fatalf("ReadRange of a cut object: %v, want piece 3 corrupt", err)
				}
			}
			v, ok := f.holds(k)
			switch {
			case tc.swap && (!ok || !bytes.Equal(v, good)):
				t.Fatal("the good object stored since the short read was removed")
			case !tc.swap && ok:
				t.Fatal("the truncated object was not removed")
			}
		})
	}
}

// TestWholeDamageIsBounded: a whole read of a large damaged object hands
// the store a condition of its length, its first bytes and one window of
// its last, not the object (was: all of it, which Redis received as a
// script argument and the shared filesystem read back whole), and the
// object is removed all the same; an object of another length stays.
func TestWholeDamageIsBounded(t *testing.T) {
	f := newFake()
	g := guard(t, pingFake{f}, GuardOptions{Threshold: 5})
	e := Encode(g, "fake", nil, nil)
	ctx := context.Background()
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	k := key(5)
	bad := damagedObject(t, e, f, k, data)
	if _, err := e.Get(ctx, k, make([]byte, len(data))); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("Get of a damaged object: %v", err)
	}
	if _, ok := f.holds(k); ok {
		t.Fatal("the damaged object was not removed")
	}
	f.mu.Lock()
	compared := f.compared
	f.mu.Unlock()
	if compared > 2*damageWindow {
		t.Fatalf("the condition held %d bytes of a %d-byte object, want at most %d", compared, len(bad), 2*damageWindow)
	}
	d := wholeDamage(bad)
	if !d.Matches(bad) || d.Matches(bad[:len(bad)-1]) || d.Matches(append(bad[:len(bad):len(bad)], 0)) {
		t.Fatal("the bounded condition does not tell the object from one of another length")
	}
	small := []byte("a small object")
	if d := wholeDamage(small); !d.Matches(small) || len(d.Part) != 0 {
		t.Fatalf("a small object's condition: %+v", d)
	}
}
