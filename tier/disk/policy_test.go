package disk

import (
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier/policy"
)

// TestEveryPolicyEvicts runs the disk tier under each registered eviction
// policy: puts beyond the capacity evict exactly what a bare policy fed the
// same admissions and hits would evict, the tier stays within capacity, and
// a reopened tier serves what was left, and its evictions skip pinned
// records.
func TestEveryPolicyEvicts(t *testing.T) {
	const size, fits = 10000, 4
	rec := recordSize(size)
	for _, name := range policy.Names() {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Capacity: fits * rec, Headroom: -1, Policy: name}
			d := openTier(t, dir, opts)
			if d.Policy() != name {
				t.Fatalf("Policy() = %s, want %s", d.Policy(), name)
			}
			model, err := policy.New[chunk.Key](name)
			if err != nil {
				t.Fatal(err)
			}
			k := func(i int) chunk.Key { return testKey(uint64(i)) }
			resident := map[chunk.Key]bool{}
			for i := range 12 {
				if len(resident) == fits { // the tier must evict for this one
					victim, _ := model.Evict(nil)
					delete(resident, victim)
				}
				mustPut(t, d, k(i), testPayload(k(i), size))
				model.Admit(k(i))
				resident[k(i)] = true
				if i%3 == 1 { // hits on the oldest record and the newest, which the policies weigh differently
					for _, j := range []int{oldest(resident, k), i} {
						checkGet(t, d, k(j), testPayload(k(j), size))
						model.Access(k(j))
					}
				}
			}
			for i := range 12 {
				if d.Contains(k(i)) != resident[k(i)] {
					t.Fatalf("after 12 puts, Contains(%d) = %v, want %v (the policy's choice)", i, !resident[k(i)], resident[k(i)])
				}
			}
			st := d.Stats()
			if st.Evictions != 12-fits || st.Objects != fits || st.Used > st.Capacity {
				t.Fatalf("stats %+v; want %d evictions and %d objects within capacity", st, 12-fits, fits)
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			d = openTier(t, dir, opts)
			defer d.Close()
			for key := range resident {
				checkGet(t, d, key, testPayload(key, size))
			}
			// Pin all reopened records but one: the next put must evict
			// that one, whichever the policy would rather take.
			spare := k(oldest(resident, k))
			for key := range resident {
				if key != spare && d.Pin([]chunk.Key{key}, time.Hour) != 1 {
					t.Fatalf("Pin(%v) failed", key)
				}
			}
			mustPut(t, d, k(99), testPayload(k(99), size))
			if st := d.Stats(); st.Objects != fits || st.Evictions != 1 || d.Contains(spare) {
				t.Fatalf("after reopening and one more put: %+v, unpinned record kept: %v", st, d.Contains(spare))
			}
		})
	}
}

// oldest returns the lowest i whose key is resident.
func oldest(resident map[chunk.Key]bool, k func(int) chunk.Key) int {
	i := 0
	for !resident[k(i)] {
		i++
	}
	return i
}

func TestUnknownPolicyIsRefused(t *testing.T) {
	if d, err := Open(t.TempDir(), Options{Capacity: 1 << 20, Policy: "no-such-policy"}); err == nil {
		d.Close()
		t.Fatal("Open accepted an unknown eviction policy")
	}
}
