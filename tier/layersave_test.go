package tier_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/disk"
)

// loggedWrites is the disk tier with its range writes recorded, so a test
// can see which ranges reached the tier before the commit.
type loggedWrites struct {
	*disk.Tier
	mu     sync.Mutex
	ranges map[chunk.Key][][2]int
	opened int
}

func (l *loggedWrites) OpenWrite(ctx context.Context, k chunk.Key, size int) (tier.RangeWrite, error) {
	w, err := l.Tier.OpenWrite(ctx, k, size)
	if w == nil || err != nil {
		return w, err
	}
	l.mu.Lock()
	l.opened++
	l.mu.Unlock()
	return loggedWrite{w, l, k}, nil
}

// written returns how many bytes of k's ranges reached the tier.
func (l *loggedWrites) written(k chunk.Key) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.ranges[k] {
		n += r[1] - r[0]
	}
	return n
}

type loggedWrite struct {
	tier.RangeWrite
	l *loggedWrites
	k chunk.Key
}

func (w loggedWrite) WriteRange(ctx context.Context, src []byte, from, to int) error {
	err := w.RangeWrite.WriteRange(ctx, src, from, to)
	if err == nil {
		w.l.mu.Lock()
		w.l.ranges[w.k] = append(w.l.ranges[w.k], [2]int{from, to})
		w.l.mu.Unlock()
	}
	return err
}

// saveFixture reserves n chunks of geoChunk bytes in RAM under a manager
// whose lower tier is the logged disk tier.
func saveFixture(t *testing.T, n int) (*tier.Manager, *loggedWrites, []chunk.Key, []arena.ID, [][]byte) {
	t.Helper()
	d := &loggedWrites{Tier: newDisk(t, t.TempDir(), 64<<20), ranges: map[chunk.Key][][2]int{}}
	m, err := tier.NewManager(newRAM(t, 64*geoChunk), []tier.Tier{d}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	var keys []chunk.Key
	var ids []arena.ID
	var chunks [][]byte
	for i := range n {
		id, _, err := m.Reserve(geoChunk)
		if err != nil {
			t.Fatal(err)
		}
		keys, ids, chunks = append(keys, key(i)), append(ids, id), append(chunks, payload(i, geoChunk))
	}
	return m, d, keys, ids, chunks
}

// fillLayer copies layer's ranges of every chunk into its reservation.
func fillLayer(m *tier.Manager, ids []arena.ID, chunks [][]byte, layer int) {
	for c, id := range ids {
		buf := m.RAM().Arena().Bytes(id)
		for part := range testGeo.Parts {
			from, to, _ := testGeo.Range(len(buf), layer, part)
			copy(buf[from:to], chunks[c][from:to])
		}
	}
}

// waitUntil polls cond for up to ten seconds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// TestLayerSaveWritesEachLayerBeforeTheNext: each layer of every chunk
// reaches the disk tier before the next layer is filled; after the commit
// the chunks are RAM chunks and their records read back the bytes filled.
func TestLayerSaveWritesEachLayerBeforeTheNext(t *testing.T) {
	m, d, keys, ids, chunks := saveFixture(t, 3)
	s := m.BeginLayerSave(keys, ids, testGeo)
	t.Cleanup(s.Abort) // lets the manager close if the test fails early; nothing after the commit
	if s == nil {
		t.Fatal("no save over a disk tier")
	}
	for layer := range testGeo.Layers {
		fillLayer(m, ids, chunks, layer)
		s.Layer(layer)
		s.Layer(layer) // a second notice is ignored
		for _, k := range keys {
			waitUntil(t, "layer written", func() bool { return d.written(k) == (layer+1)*geoChunk/testGeo.Layers })
		}
		if d.Contains(keys[0]) {
			t.Fatal("a record is visible before the commit")
		}
	}
	if err := m.CommitRunSaved(keys, ids, s); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for c, k := range keys {
		if !m.RAM().Contains(k) {
			t.Fatalf("chunk %d is not in RAM", c)
		}
		got := make([]byte, geoChunk)
		if n, err := d.Get(context.Background(), k, got); err != nil || n != geoChunk || !bytes.Equal(got, chunks[c]) {
			t.Fatalf("chunk %d on disk: %d bytes, %v, equal %v", c, n, err, bytes.Equal(got, chunks[c]))
		}
	}
	if st := m.RAM().Arena().Stats(); st.Pinned != 0 {
		t.Fatalf("%d bytes still pinned after the save", st.Pinned)
	}
}

// TestLayerSaveAbortGivesExtentsBack: a save ended without a commit leaves
// no record and no space taken on disk.
func TestLayerSaveAbortGivesExtentsBack(t *testing.T) {
	m, d, keys, ids, chunks := saveFixture(t, 2)
	s := m.BeginLayerSave(keys, ids, testGeo)
	t.Cleanup(s.Abort)
	for layer := range 4 {
		fillLayer(m, ids, chunks, layer)
		s.Layer(layer)
	}
	waitUntil(t, "four layers written", func() bool { return d.written(keys[1]) == 4*geoChunk/testGeo.Layers })
	if d.Stats().Used == 0 {
		t.Fatal("no extent reserved while layers are written")
	}
	s.Abort()
	for _, id := range ids { // the lease's references, as the engine drops them
		m.RAM().Arena().Unref(id)
	}
	waitUntil(t, "extents given back", func() bool { return d.Stats().Used == 0 })
	for _, k := range keys {
		if d.Contains(k) || m.RAM().Contains(k) {
			t.Fatalf("%v stored after an abort", k)
		}
	}
	s.Layer(5) // after the end: ignored
}

// TestLayerSavePartialCommit: a commit of the first chunk only stores it,
// whole layers written or not, and gives the second chunk's extent back;
// a chunk with no layer noticed is written whole at the commit.
func TestLayerSavePartialCommit(t *testing.T) {
	m, d, keys, ids, chunks := saveFixture(t, 2)
	s := m.BeginLayerSave(keys, ids, testGeo)
	t.Cleanup(s.Abort)
	for layer := range 3 {
		fillLayer(m, ids, chunks, layer)
		s.Layer(layer)
	}
	for layer := 3; layer < testGeo.Layers; layer++ {
		fillLayer(m, ids, chunks, layer) // filled, never noticed: the commit writes them
	}
	if err := m.CommitRunSaved(keys[:1], ids[:1], s); err != nil {
		t.Fatal(err)
	}
	m.RAM().Arena().Unref(ids[1])
	if err := m.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, geoChunk)
	if _, err := d.Get(context.Background(), keys[0], got); err != nil || !bytes.Equal(got, chunks[0]) {
		t.Fatalf("chunk 0: %v", err)
	}
	waitUntil(t, "chunk 1's extent given back", func() bool { return !d.Contains(keys[1]) && d.Stats().Objects == 1 })

	// No layer noticed: nothing opened, the commit writes whole.
	m2, d2, keys2, ids2, chunks2 := saveFixture(t, 1)
	s2 := m2.BeginLayerSave(keys2, ids2, testGeo)
	copy(m2.RAM().Arena().Bytes(ids2[0]), chunks2[0])
	if err := m2.CommitRunSaved(keys2, ids2, s2); err != nil {
		t.Fatal(err)
	}
	if err := m2.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.Get(context.Background(), keys2[0], got); err != nil || !bytes.Equal(got, chunks2[0]) || d2.opened != 0 {
		t.Fatalf("whole write at commit: %v, %d range writes opened", err, d2.opened)
	}
}

// TestLayerSaveNeedsARangeWriter: without a tier that writes ranges, or
// with no geometry, there is no save and CommitRunSaved is CommitRun.
func TestLayerSaveNeedsARangeWriter(t *testing.T) {
	m, _, keys, ids, _ := saveFixture(t, 1)
	if s := m.BeginLayerSave(keys, ids, tier.LayerGeometry{}); s != nil {
		t.Fatal("a save without a geometry")
	}
	if err := m.CommitRunSaved(keys, ids, nil); err != nil || !m.RAM().Contains(keys[0]) {
		t.Fatalf("commit without a save: %v", err)
	}
	plain, err := tier.NewManager(newRAM(t, 4*geoChunk), nil, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if s := plain.BeginLayerSave(keys, ids[:0], testGeo); s != nil {
		t.Fatal("a save with no lower tier")
	}
}
