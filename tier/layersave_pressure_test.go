package tier_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// recBytes is what a geoChunk record takes on disk: a header block and the
// payload.
const recBytes = 4096 + geoChunk

// pressureManager is a manager over a logged disk tier of diskCap bytes.
// Room for two records takes 2*recBytes+8192: the tier evicts ahead to
// keep 1/64 of its capacity free.
func pressureManager(t *testing.T, diskCap int64) (*tier.Manager, *loggedWrites) {
	t.Helper()
	d := &loggedWrites{Tier: newDisk(t, t.TempDir(), diskCap), ranges: map[chunk.Key][][2]int{}}
	m, err := tier.NewManager(newRAM(t, 64*geoChunk), []tier.Tier{d}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m, d
}

// reserveFilled reserves chunks first..first+n-1 in RAM, filled with
// payload(seed+i).
func reserveFilled(t *testing.T, m *tier.Manager, first, n, seed int) ([]chunk.Key, []arena.ID) {
	t.Helper()
	var keys []chunk.Key
	var ids []arena.ID
	for i := first; i < first+n; i++ {
		id, b, err := m.Reserve(geoChunk)
		if err != nil {
			t.Fatal(err)
		}
		copy(b, payload(seed+i, geoChunk))
		keys, ids = append(keys, key(i)), append(ids, id)
	}
	return keys, ids
}

// noticeAll notices every layer of s.
func noticeAll(s *tier.LayerSave) {
	for layer := range testGeo.Layers {
		s.Layer(layer)
	}
}

// returns runs f and fails the test if it has not returned within a
// minute: a bound on a hang, far above any time f needs, not a timing
// check.
func returns(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s hangs", what)
	}
}

// sameOnDisk checks that every key the disk tier holds reads back with the
// bytes RAM holds for it, and returns how many it holds.
func sameOnDisk(t *testing.T, m *tier.Manager, d tier.Tier, keys []chunk.Key) int {
	t.Helper()
	n := 0
	for _, k := range keys {
		if !tier.Contains(d, k) {
			continue
		}
		n++
		want := make([]byte, geoChunk)
		if got, err := m.RAM().Get(context.Background(), k, want); err != nil || got != geoChunk {
			t.Fatalf("%v is on disk but not in RAM: %v", k, err)
		}
		got := make([]byte, geoChunk)
		if c, err := d.Get(context.Background(), k, got); err != nil || c != geoChunk || !bytes.Equal(got, want) {
			t.Fatalf("%v on disk: %d bytes, %v, equal to RAM %v", k, c, err, bytes.Equal(got, want))
		}
	}
	return n
}

// noLeak waits until the disk tier's used bytes are those of the records
// it holds: every extent a save opened was committed or given back.
func noLeak(t *testing.T, d tier.Tier) {
	t.Helper()
	waitUntil(t, "no extent left over", func() bool {
		st := tier.StatsOf(d)
		return st.Used == st.Objects*recBytes
	})
}

// TestLayerSaveLargerThanDisk: a save whose chunks need more room than the
// disk tier has. The chunks past its room get no range write (the save
// does not wait for room its own records hold) and are written whole at
// the commit, evicting older records: Flush, Sync and Close return, no
// extent is left over, and whatever is on disk has the bytes in RAM.
func TestLayerSaveLargerThanDisk(t *testing.T) {
	m, d := pressureManager(t, 2*recBytes+8192)
	keys, ids := reserveFilled(t, m, 0, 3, 0)
	s := m.BeginLayerSave(keys, ids, testGeo)
	noticeAll(s)
	// Two chunks fit and get range writes, which write every layer.
	waitUntil(t, "two chunks' layers written", func() bool {
		return d.written(keys[0])+d.written(keys[1])+d.written(keys[2]) == 2*geoChunk
	})
	if err := m.CommitRunSaved(keys, ids, s); err != nil {
		t.Fatal(err)
	}
	returns(t, "Flush", func() {
		if err := m.Flush(context.Background()); err != nil {
			t.Error(err)
		}
	})
	returns(t, "Sync", func() {
		rep, err := m.Sync(context.Background())
		if err != nil || rep[0].Pending != 0 {
			t.Errorf("sync: %+v %v", rep, err)
		}
	})
	_, qs := m.Stats()
	if qs[0].LayerSaved != 2 {
		t.Errorf("%d records saved by layers, want 2", qs[0].LayerSaved)
	}
	// The last chunk, written whole, evicted one of the others.
	if n := sameOnDisk(t, m, d, keys); n != 2 || !d.Contains(keys[2]) {
		t.Errorf("%d chunks on disk, the last %v; want 2 with the last", n, d.Contains(keys[2]))
	}
	noLeak(t, d)
	returns(t, "Close", func() { m.Close() })
}

// TestLayerSaveOverPinnedDisk: two saves at once over a disk tier whose
// room is all pinned but for one record. The first chunk to open gets it;
// the others get no range write (a save does not wait for room its own
// open record holds) and are written whole at the commit, or reported
// missing by Sync while the pins leave no room. Flush, Sync and Close
// return, the pinned records stay, no extent is left over, and a Sync once
// the pins have lapsed leaves nothing missing.
func TestLayerSaveOverPinnedDisk(t *testing.T) {
	m, d := pressureManager(t, 3*recBytes+8192)
	old, oldIDs := reserveFilled(t, m, 10, 2, 0)
	if err := m.CommitRun(old, oldIDs); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	const pin = 3 * time.Second
	if n := d.Pin(old, pin); n != 2 {
		t.Fatalf("pinned %d of 2", n)
	}
	pinned := time.Now()
	var saves []*tier.LayerSave
	var all [][]chunk.Key
	var allIDs [][]arena.ID
	for i := range 2 {
		keys, ids := reserveFilled(t, m, 2*i, 2, 0)
		s := m.BeginLayerSave(keys, ids, testGeo)
		noticeAll(s)
		saves, all, allIDs = append(saves, s), append(all, keys), append(allIDs, ids)
	}
	waitUntil(t, "one chunk's layers written", func() bool {
		n := 0
		for _, keys := range all {
			for _, k := range keys {
				n += d.written(k)
			}
		}
		return n == geoChunk
	})
	for i, s := range saves {
		if err := m.CommitRunSaved(all[i], allIDs[i], s); err != nil {
			t.Fatal(err)
		}
	}
	returns(t, "Flush", func() {
		if err := m.Flush(context.Background()); err != nil {
			t.Error(err)
		}
	})
	keys := append(append([]chunk.Key(nil), all[0]...), all[1]...)
	var rep []tier.TierSync
	returns(t, "Sync", func() { rep, _ = m.Sync(context.Background()) })
	if rep[0].Pending != 0 {
		t.Errorf("sync while pinned: %+v", rep[0])
	}
	if time.Since(pinned) < pin && (!d.Contains(old[0]) || !d.Contains(old[1])) {
		t.Error("a pinned record was evicted")
	}
	sameOnDisk(t, m, d, append(keys, old...))
	noLeak(t, d)
	// Once the pins lapse, a Sync writes whatever was missing.
	time.Sleep(time.Until(pinned.Add(pin)))
	returns(t, "Sync", func() { rep, _ = m.Sync(context.Background()) })
	if rep[0].Missing != 0 || rep[0].Pending != 0 {
		t.Errorf("sync after the pins: %+v", rep[0])
	}
	if n := sameOnDisk(t, m, d, append(keys, old...)); n != 3 {
		t.Errorf("%d chunks on disk, want 3 (the room of three records)", n)
	}
	noLeak(t, d)
	returns(t, "Close", func() { m.Close() })
}

// TestLayerSaveSameKeyDoesNotStallWriters: while a save holds keys K0 and
// K1 open, another store commits the same keys (another path: layer saves
// off, a TCP STORE, a PD transfer) and then an unrelated key K7. The
// writer goroutines do not wait for the open save: K7 reaches the disk,
// Flush returns, and K0 and K1 count as missing, not failed. When the
// save then ends — committed (RAM holds the other store's copies, so the
// save gives its records up) or aborted — a Sync writes K0 and K1 with the
// bytes in RAM.
func TestLayerSaveSameKeyDoesNotStallWriters(t *testing.T) {
	for _, commit := range []bool{true, false} {
		name := "then aborted"
		if commit {
			name = "then committed"
		}
		t.Run(name, func(t *testing.T) {
			m, d := pressureManager(t, 64<<20)
			keysA, idsA := reserveFilled(t, m, 0, 2, 100) // the save's bytes
			s := m.BeginLayerSave(keysA, idsA, testGeo)
			s.Layer(0)
			waitUntil(t, "the save's records opened", func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.opened == 2 })
			keysB, idsB := reserveFilled(t, m, 0, 2, 200) // another store's bytes
			if err := m.CommitRun(keysB, idsB); err != nil {
				t.Fatal(err)
			}
			keysC, idsC := reserveFilled(t, m, 7, 1, 0)
			if err := m.CommitRun(keysC, idsC); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the unrelated key on disk", func() bool { return d.Contains(keysC[0]) })
			returns(t, "Flush", func() {
				// K0 and K1 are not on disk yet: Flush says so.
				if err := m.Flush(context.Background()); !errors.Is(err, tier.ErrNotDurable) {
					t.Errorf("Flush with the save open = %v, want ErrNotDurable", err)
				}
			})
			var rep []tier.TierSync
			returns(t, "Sync", func() { rep, _ = m.Sync(context.Background()) })
			if rep[0].Missing != 2 || rep[0].Pending != 0 {
				t.Errorf("sync with the save open: %+v; want the two keys missing", rep[0])
			}
			if _, qs := m.Stats(); qs[0].Failed != 0 {
				t.Errorf("%d writes counted failed; deferred writes are not failures", qs[0].Failed)
			}
			if commit {
				if err := m.CommitRunSaved(keysA, idsA, s); err != nil {
					t.Fatal(err)
				}
			} else {
				s.Abort()
				for _, id := range idsA {
					m.RAM().Arena().Unref(id)
				}
			}
			noLeak(t, d) // the save gave its records up
			returns(t, "Sync", func() { rep, _ = m.Sync(context.Background()) })
			if rep[0].Missing != 0 || rep[0].Redone != 2 {
				t.Errorf("sync after the save: %+v; want the two keys redone", rep[0])
			}
			all := append(append([]chunk.Key(nil), keysB...), keysC...)
			if n := sameOnDisk(t, m, d, all); n != 3 {
				t.Fatalf("%d of 3 keys on disk", n)
			}
			// RAM holds the other store's copies; the disk must too.
			got := make([]byte, geoChunk)
			if _, err := d.Get(context.Background(), keysB[0], got); err != nil || !bytes.Equal(got, payload(200, geoChunk)) {
				t.Fatalf("K0 on disk is not the committed store's: %v", err)
			}
			noLeak(t, d)
			returns(t, "Close", func() { m.Close() })
		})
	}
}

// TestLayerSaveManyLayers: a save of the most layers a geometry may have
// (geoChunk as 65,536 layers of one-byte K and V spans) keeps its notices
// in a few KiB, not in a channel and a flag per layer, and writes layers
// noticed out of order — runs crossing bitmap words included — into a
// record that reads back byte-exact.
func TestLayerSaveManyLayers(t *testing.T) {
	geo := tier.LayerGeometry{Layers: tier.MaxLayers, Parts: 2}
	m, d := pressureManager(t, 64<<20)
	keys, ids := reserveFilled(t, m, 0, 1, 0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := m.BeginLayerSave(keys, ids, geo)
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Errorf("a save of %d layers allocated %d bytes", geo.Layers, grew)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, layer := range r.Perm(geo.Layers) {
		s.Layer(layer)
	}
	s.Layer(geo.Layers) // out of range: ignored
	waitUntil(t, "every layer written", func() bool { return d.written(keys[0]) == geoChunk })
	if err := m.CommitRunSaved(keys, ids, s); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := sameOnDisk(t, m, d, keys); n != 1 {
		t.Fatal("the record is not on disk")
	}
	if _, qs := m.Stats(); qs[0].LayerSaved != 1 || qs[0].LayerBytes != geoChunk {
		t.Fatalf("%+v: want one record saved by layers", qs[0])
	}
	returns(t, "Close", func() { m.Close() })
}
