package redis

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// TestForeignValueLeavesRedisServing: a list under an object's key is
// someone else's value, not damage. Range reads of it (OpenRange, then a
// Get through the breaker) fail with ErrCorrupt and count in the tier's
// Corrupt, but not as corrupt reads of the store: the circuit stays closed
// (was: five OpenRange calls opened it for corruption).
func TestForeignValueLeavesRedisServing(t *testing.T) {
	srv := sharedServer(t)
	rt := openTier(t, srv.url(""))
	g := remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second, Threshold: 2, ProbeInterval: time.Hour})
	e := remote.Encode(g, "redis", nil, nil)
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	k := testKey(uniqueScope(), 1)
	if err := srv.rawClient().RPush(ctx, rt.keyName(k), "someone", "else's").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := e.OpenRange(ctx, k, make([]byte, 4096)); !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("OpenRange of a list: %v", err)
		}
		if _, err := g.Get(ctx, k, make([]byte, 4096)); !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("Get of a list: %v", err)
		}
	}
	if h := g.Health(); h.State != remote.StateClosed || h.Corrupt != 0 || h.CorruptOpens != 0 {
		t.Fatalf("after reads of a foreign value: %+v, want closed, no corrupt read", h)
	}
	if rt.Stats().Corrupt == 0 {
		t.Fatal("the foreign value was not counted")
	}
	if n, _ := srv.rawClient().Exists(ctx, rt.keyName(k)).Result(); n != 1 {
		t.Fatal("the foreign value was removed")
	}
}

// TestForeignValueInLookupsLeavesRedisServing: whole reads (Encoded.Get,
// which asks Size first) and prefix lookups of a key holding a list find
// it not stored and count it in the tier's Corrupt, never as a failure of
// Redis (was: STRLEN's WRONGTYPE counted as a failure, and two of them
// opened the circuit).
func TestForeignValueInLookupsLeavesRedisServing(t *testing.T) {
	srv := sharedServer(t)
	rt := openTier(t, srv.url(""))
	ctx := context.Background()
	scope := uniqueScope()
	good, foreign := testKey(scope, 1), testKey(scope, 2)
	if err := rt.Put(ctx, good, payload(1000, 1)); err != nil {
		t.Fatal(err)
	}
	if err := srv.rawClient().RPush(ctx, rt.keyName(foreign), "someone", "else's").Err(); err != nil {
		t.Fatal(err)
	}
	g := remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second, Threshold: 2, ProbeInterval: time.Hour})
	e := remote.Encode(g, "redis", nil, nil)
	t.Cleanup(func() { e.Close() })
	for range 4 {
		if _, err := e.Get(ctx, foreign, make([]byte, 4096)); err == nil {
			t.Fatal("Get of a list succeeded")
		}
		if n := g.PrefixContains([]chunk.Key{good, foreign, good}); n != 1 {
			t.Fatalf("PrefixContains = %d, want 1", n)
		}
		if n, ok, err := rt.SizeErr(foreign); ok || n != 0 || err != nil {
			t.Fatalf("SizeErr of a list = %d, %v, %v; want not stored, no error", n, ok, err)
		}
		if _, err := rt.PrefixContainsErr([]chunk.Key{foreign}); err != nil {
			t.Fatalf("PrefixContainsErr of a list: %v", err)
		}
	}
	if h := g.Health(); h.State != remote.StateClosed || h.Failures != 0 {
		t.Fatalf("after lookups of a foreign value: %+v, want closed, no failure", h)
	}
	if rt.Stats().Corrupt == 0 {
		t.Fatal("the foreign value was not counted")
	}
}

// TestRemoveDamagedComparesTheValue: RemoveDamaged deletes only a value
// that still holds the damaged bytes, at the head and at the offset given,
// with the length given.
func TestRemoveDamagedComparesTheValue(t *testing.T) {
	srv := sharedServer(t)
	rt := openTier(t, srv.url(""))
	ctx := context.Background()
	k := testKey(uniqueScope(), 1)
	v := payload(10000, 3)
	if err := rt.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
	other := append([]byte(nil), v...)
	other[6000] ^= 1
	for name, d := range map[string]remote.Damage{
		"other value":  {Size: len(v), Head: other},
		"other length": {Size: len(v) + 1, Head: v[:100]},
		"other head":   {Size: -1, Head: other[5000:5100]},
		"other part":   {Size: -1, Head: v[:100], Off: 5990, Part: other[5990:6010]},
		"past the end": {Size: -1, Head: v[:100], Off: 9990, Part: v[:20]},
	} {
		if r := rt.RemoveDamaged(k, d); r != remote.DamageGone {
			t.Fatalf("%s: %v, want DamageGone (replaced)", name, r)
		}
		if n, _ := srv.rawClient().Exists(ctx, rt.keyName(k)).Result(); n != 1 {
			t.Fatalf("%s: the value is gone", name)
		}
	}
	if rt.RemoveDamaged(k, remote.Damage{Size: -1, Head: v[:100], Off: 5990, Part: v[5990:6010]}) != remote.DamageRemoved {
		t.Fatal("the matching value was not removed")
	}
	if err := rt.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
	if rt.RemoveDamaged(k, remote.Damage{Size: len(v), Head: v}) != remote.DamageRemoved {
		t.Fatal("the matching whole value was not removed")
	}
	if n, _ := srv.rawClient().Exists(ctx, rt.keyName(k)).Result(); n != 0 || rt.Stats().Removes != 2 {
		t.Fatalf("after two removals: exists %d, removes %d", n, rt.Stats().Removes)
	}
	if r := rt.RemoveDamaged(k, remote.Damage{Size: -1, Head: v[:100]}); r != remote.DamageGone {
		t.Fatalf("a missing key: %v, want DamageGone", r)
	}
}

// TestRangeReadOfAReplacedObjectIsAMiss: an object replaced between
// OpenRange and ReadRange (expired and stored again, here with other
// bytes) fails the old piece table's checks; that is a miss, not damage:
// nothing counts as corrupt and the new object stays (was: counted +2 and
// removed).
func TestRangeReadOfAReplacedObjectIsAMiss(t *testing.T) {
	srv := sharedServer(t)
	rt := openTier(t, srv.url(""))
	g := remote.Guard(rt, remote.GuardOptions{Timeout: 10 * time.Second, ProbeInterval: time.Hour})
	e := remote.Encode(g, "redis", nil, nil)
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	r := rand.New(rand.NewPCG(9, 10))
	first, second := make([]byte, 100000), make([]byte, 100000)
	for i := range first {
		first[i], second[i] = byte(r.Uint32()), byte(r.Uint32())
	}
	k := testKey(uniqueScope(), 1)
	if err := e.Put(ctx, k, first); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(first))
	rr, err := e.OpenRange(ctx, k, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	if err := srv.rawClient().Del(ctx, rt.keyName(k)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, k, second); err != nil {
		t.Fatal(err)
	}
	if err := rr.ReadRange(ctx, 0, 4096); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("range of a replaced object: %v, want a miss", err)
	}
	if h := g.Health(); h.Corrupt != 0 || e.Stats().Corrupt != 0 {
		t.Fatalf("a replaced object counted as damaged: %+v, tier corrupt %d", h, e.Stats().Corrupt)
	}
	got := make([]byte, len(second))
	if n, err := e.Get(ctx, k, got); err != nil || !bytes.Equal(got[:n], second) {
		t.Fatalf("the new object: %d bytes, %v", n, err)
	}
}
