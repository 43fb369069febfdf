package tier_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/disk"
)

// A small layered geometry: 8 layers, K and V, 16 tokens of 512-byte rows,
// so a chunk is 128 KiB and each of its 16 ranges 8 KiB (two disk pieces).
var testGeo = tier.LayerGeometry{Layers: 8, Parts: 2}

const geoChunk = 8 * 2 * 16 * 512

func TestLayerGeometryRanges(t *testing.T) {
	g := tier.LayerGeometry{Layers: 4, Parts: 2}
	// 240 bytes: eight spans of 30, K_0..K_3 then V_0..V_3.
	for _, c := range []struct{ layer, part, from int }{{0, 0, 0}, {1, 0, 30}, {3, 0, 90}, {0, 1, 120}, {3, 1, 210}} {
		from, to, ok := g.Range(240, c.layer, c.part)
		if !ok || from != c.from || to != c.from+30 {
			t.Fatalf("layer %d part %d: [%d, %d) %v, want from %d", c.layer, c.part, from, to, ok, c.from)
		}
	}
	for _, bad := range []struct{ n, layer, part int }{{244, 0, 0}, {240, 4, 0}, {240, 0, 2}, {0, 0, 0}, {240, -1, 0}} {
		if _, _, ok := g.Range(bad.n, bad.layer, bad.part); ok {
			t.Fatalf("Range(%v) accepted", bad)
		}
	}
	if (tier.LayerGeometry{Layers: 4, Parts: 3}).Valid() || (tier.LayerGeometry{Layers: 0, Parts: 1}).Valid() {
		t.Fatal("three parts accepted")
	}
}

// gatedDisk holds back range reads of layers from `from` on until gate is
// closed, so a test can see layer 0 become ready while the rest is still
// unread. It is the real disk tier otherwise.
type gatedDisk struct {
	*disk.Tier
	gate chan struct{}
	from int
}

func (g gatedDisk) OpenRange(ctx context.Context, k chunk.Key, dst []byte) (tier.RangeRead, error) {
	r, err := g.Tier.OpenRange(ctx, k, dst)
	if err != nil {
		return nil, err
	}
	return gatedRead{r, g, len(dst)}, nil
}

type gatedRead struct {
	tier.RangeRead
	g gatedDisk
	n int
}

func (r gatedRead) ReadRange(ctx context.Context, from, to int) error {
	span := r.n / (testGeo.Layers * testGeo.Parts)
	if from/span%testGeo.Layers >= r.g.from {
		select {
		case <-r.g.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return r.RangeRead.ReadRange(ctx, from, to)
}

// streamFixture stores n chunks on disk only, and those in inRAM in RAM
// too, under a manager whose lower tier is lower(disk).
func streamFixture(t *testing.T, n int, inRAM map[int]bool, lower func(*disk.Tier) tier.Tier) (*tier.Manager, *disk.Tier, string, []chunk.Key, [][]byte) {
	t.Helper()
	ram := newRAM(t, 64*geoChunk)
	dir := t.TempDir()
	d := newDisk(t, dir, 64<<20)
	var keys []chunk.Key
	var chunks [][]byte
	for i := range n {
		keys = append(keys, key(i))
		chunks = append(chunks, payload(i, geoChunk))
		if err := d.Put(context.Background(), keys[i], chunks[i]); err != nil {
			t.Fatal(err)
		}
		if inRAM[i] {
			if err := ram.Put(context.Background(), keys[i], chunks[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	m, err := tier.NewManager(ram, []tier.Tier{lower(d)}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, d, dir, keys, chunks
}

// checkLayer compares layer's ranges of every chunk in ids with the stored bytes.
func checkLayer(t *testing.T, a *arena.Arena, ids []arena.ID, chunks [][]byte, layer int) {
	t.Helper()
	for c, id := range ids {
		got := a.Bytes(id)
		for part := range testGeo.Parts {
			from, to, _ := testGeo.Range(len(got), layer, part)
			if !bytes.Equal(got[from:to], chunks[c][from:to]) {
				t.Fatalf("chunk %d layer %d part %d: wrong bytes", c, layer, part)
			}
		}
	}
}

// TestStreamLayerZeroBeforeTheRest: with a mix of RAM and disk chunks,
// layer 0 of every chunk is ready (and holds the stored bytes) while the
// later layers cannot yet be read; then every layer arrives, the chunks
// become RAM chunks, and nothing stays pinned.
func TestStreamLayerZeroBeforeTheRest(t *testing.T) {
	gate := make(chan struct{})
	m, _, _, keys, chunks := streamFixture(t, 6, map[int]bool{0: true, 3: true}, func(d *disk.Tier) tier.Tier {
		return gatedDisk{d, gate, 1}
	})
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(context.Background(), keys, ids, func() tier.LayerGeometry { return testGeo }, time.Now().Add(time.Minute))
	if err != nil || n != 6 || s == nil || s.Chunks() != 5 {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	usable, ready, err := s.Wait(ctx, 0)
	if err != nil || usable != 5 || ready != 1 {
		t.Fatalf("Wait(0) = %d usable, %d ready, %v; want 5, 1 with later layers held back", usable, ready, err)
	}
	checkLayer(t, m.RAM().Arena(), ids, chunks, 0)
	if m.RAM().Contains(keys[1]) {
		t.Fatal("a chunk became visible in RAM before all its layers were in")
	}
	close(gate)
	for layer := 1; layer < testGeo.Layers; layer++ {
		if usable, ready, err = s.Wait(ctx, layer); err != nil || usable != 5 || ready <= layer {
			t.Fatalf("Wait(%d) = %d, %d, %v", layer, usable, ready, err)
		}
		checkLayer(t, m.RAM().Arena(), ids, chunks, layer)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if !m.RAM().Contains(k) {
			t.Fatalf("chunk %d not in RAM after its stream", i)
		}
	}
	for _, id := range ids {
		m.RAM().Arena().Unref(id)
	}
	if p := m.RAM().Arena().Pinned(); p != 0 {
		t.Fatalf("%d bytes pinned after the stream and the release", p)
	}
}

// TestStreamCorruptLayerShortensThePrefix damages layer 3 of chunk 2 on
// disk: chunks 0 and 1 arrive whole and become RAM chunks; chunks 2 and 3
// are reported unusable, never become visible, and the record is dropped.
func TestStreamCorruptLayerShortensThePrefix(t *testing.T) {
	m, d, dir, keys, chunks := streamFixture(t, 4, nil, func(d *disk.Tier) tier.Tier { return d })
	from, _, _ := testGeo.Range(geoChunk, 3, 1)
	damage(t, dir, chunks[2][from:from+64])

	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(context.Background(), keys, ids, func() tier.LayerGeometry { return testGeo }, time.Now().Add(time.Minute))
	if err != nil || n != 4 || s == nil {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	usable, ready, err := s.Wait(context.Background(), testGeo.Layers-1)
	if err != nil || usable != 2 || ready != testGeo.Layers {
		t.Fatalf("Wait = %d usable, %d ready, %v; want 2, all", usable, ready, err)
	}
	for layer := range testGeo.Layers {
		checkLayer(t, m.RAM().Arena(), ids[:2], chunks[:2], layer)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if m.RAM().Contains(k) != (i < 2) {
			t.Fatalf("chunk %d in RAM: %v", i, m.RAM().Contains(k))
		}
	}
	if d.Contains(keys[2]) || d.Stats().Corrupt != 1 {
		t.Fatalf("the damaged record was kept: %+v", d.Stats())
	}
	for _, id := range ids {
		m.RAM().Arena().Unref(id)
	}
	if p := m.RAM().Arena().Pinned(); p != 0 {
		t.Fatalf("%d bytes pinned after the stream", p)
	}
}

// damage flips a byte of the first segment file where it holds want, a
// stretch of one stored payload.
func damage(t *testing.T, dir string, want []byte) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, want); i >= 0 {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte{b[i+10] ^ 0xff}, int64(i+10)); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("payload bytes not found on disk")
}

// TestStreamEndsAtItsDeadline: layers that never arrive (held back past the
// lease's deadline) end the stream on time with no usable chunk, none is
// committed, and nothing stays pinned.
func TestStreamEndsAtItsDeadline(t *testing.T) {
	gate := make(chan struct{}) // never opened
	m, _, _, keys, _ := streamFixture(t, 3, nil, func(d *disk.Tier) tier.Tier { return gatedDisk{d, gate, 1} })
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(context.Background(), keys, ids, func() tier.LayerGeometry { return testGeo }, time.Now().Add(200*time.Millisecond))
	if err != nil || n != 3 || s == nil {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	usable, ready, err := s.Wait(ctx, testGeo.Layers-1)
	if err != nil || usable != 0 {
		t.Fatalf("Wait = %d usable, %d ready, %v; want none usable once the deadline passed", usable, ready, err)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if m.RAM().Contains(k) {
			t.Fatalf("chunk %d committed after its stream failed", i)
		}
	}
	for _, id := range ids {
		m.RAM().Arena().Unref(id)
	}
	if p := m.RAM().Arena().Pinned(); p != 0 {
		t.Fatalf("%d bytes pinned", p)
	}
}

// TestStreamExtendOutlivesTheFirstDeadline: a renewed lease moves its
// stream's deadline, so reads held back past the first deadline still
// complete, every chunk is usable and is committed.
func TestStreamExtendOutlivesTheFirstDeadline(t *testing.T) {
	gate := make(chan struct{})
	m, _, _, keys, chunks := streamFixture(t, 3, nil, func(d *disk.Tier) tier.Tier { return gatedDisk{d, gate, 1} })
	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(context.Background(), keys, ids, func() tier.LayerGeometry { return testGeo }, time.Now().Add(time.Second))
	if err != nil || n != 3 || s == nil {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	s.Extend(time.Now().Add(time.Minute))
	time.Sleep(1500 * time.Millisecond) // past the first deadline
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	usable, ready, err := s.Wait(ctx, testGeo.Layers-1)
	if err != nil || usable != 3 || ready != testGeo.Layers {
		t.Fatalf("Wait = %d usable, %d ready, %v; want 3 usable with every layer", usable, ready, err)
	}
	for layer := range testGeo.Layers {
		checkLayer(t, m.RAM().Arena(), ids, chunks, layer)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if !m.RAM().Contains(k) {
			t.Fatalf("chunk %d not committed after its extended stream finished", i)
		}
	}
	for _, id := range ids {
		m.RAM().Arena().Unref(id)
	}
}

// loggedDisk records the ranges each chunk's reader asks for.
type loggedDisk struct {
	*disk.Tier
	mu     *sync.Mutex
	ranges map[chunk.Key][][2]int
}

func (l loggedDisk) OpenRange(ctx context.Context, k chunk.Key, dst []byte) (tier.RangeRead, error) {
	r, err := l.Tier.OpenRange(ctx, k, dst)
	if err != nil {
		return nil, err
	}
	return loggedRead{r, l, k}, nil
}

type loggedRead struct {
	tier.RangeRead
	l loggedDisk
	k chunk.Key
}

func (r loggedRead) ReadRange(ctx context.Context, from, to int) error {
	r.l.mu.Lock()
	r.l.ranges[r.k] = append(r.l.ranges[r.k], [2]int{from, to})
	r.l.mu.Unlock()
	return r.RangeRead.ReadRange(ctx, from, to)
}

// TestStreamReadsTheWindowInOneRange: each chunk reads layer 0's K and V
// alone, then layers 1 to 3 (the window once layer 0 is everywhere) in one
// range per part; every later range stays within one part, and together
// they cover the chunk once, with the stored bytes.
func TestStreamReadsTheWindowInOneRange(t *testing.T) {
	l := loggedDisk{mu: new(sync.Mutex), ranges: map[chunk.Key][][2]int{}}
	m, _, _, keys, chunks := streamFixture(t, 4, nil, func(d *disk.Tier) tier.Tier {
		l.Tier = d
		return l
	})
	ids := make([]arena.ID, len(keys))
	_, s, err := m.AcquireStream(context.Background(), keys, ids, func() tier.LayerGeometry { return testGeo }, time.Now().Add(time.Minute))
	if err != nil || s == nil {
		t.Fatalf("AcquireStream: %v, %v", s, err)
	}
	if usable, _, err := s.Wait(context.Background(), testGeo.Layers-1); err != nil || usable != 4 {
		t.Fatalf("Wait = %d usable, %v", usable, err)
	}
	for layer := range testGeo.Layers {
		checkLayer(t, m.RAM().Arena(), ids, chunks, layer)
	}
	span := geoChunk / (testGeo.Layers * testGeo.Parts)
	part := func(p, first, last int) [2]int {
		return [2]int{(p*testGeo.Layers + first) * span, (p*testGeo.Layers + last + 1) * span}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, k := range keys {
		rs := l.ranges[k]
		want := [][2]int{part(0, 0, 0), part(1, 0, 0), part(0, 1, 3), part(1, 1, 3)}
		if len(rs) < len(want) || [4][2]int(rs[:4]) != [4][2]int(want) {
			t.Fatalf("chunk %d: first ranges %v, want %v", c, rs, want)
		}
		covered := 0
		for _, r := range rs {
			if r[0]/(geoChunk/testGeo.Parts) != (r[1]-1)/(geoChunk/testGeo.Parts) {
				t.Fatalf("chunk %d: range %v spans two parts", c, r)
			}
			covered += r[1] - r[0]
		}
		if covered != geoChunk || len(rs) >= testGeo.Layers*testGeo.Parts {
			t.Fatalf("chunk %d: %d ranges covering %d bytes: %v", c, len(rs), covered, rs)
		}
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for _, id := range ids {
		m.RAM().Arena().Unref(id)
	}
}

// TestStreamTinyLayersReadInBlocks: a chunk stated as 16,384 layers of
// 4-byte spans is read in ranges of at least 4 KiB of each part, not in
// one range per window of three layers (some 11,000 tier requests, each
// with its progress update): the reads cover the chunk once, each within
// one part, and every layer of every chunk holds the stored bytes when
// Wait says it is ready.
func TestStreamTinyLayersReadInBlocks(t *testing.T) {
	l := loggedDisk{mu: new(sync.Mutex), ranges: map[chunk.Key][][2]int{}}
	m, _, _, keys, chunks := streamFixture(t, 3, map[int]bool{1: true}, func(d *disk.Tier) tier.Tier {
		l.Tier = d
		return l
	})
	geo := tier.LayerGeometry{Layers: geoChunk / 8, Parts: 2}
	ids := make([]arena.ID, len(keys))
	_, s, err := m.AcquireStreamExact(context.Background(), keys, ids, geo, time.Now().Add(time.Minute))
	if err != nil || s == nil {
		t.Fatalf("AcquireStreamExact: %v, %v", s, err)
	}
	a := m.RAM().Arena()
	if usable, ready, err := s.Wait(context.Background(), 0); err != nil || usable != len(keys) || ready < 1 {
		t.Fatalf("Wait(0) = %d usable, %d ready, %v", usable, ready, err)
	} else {
		for c, id := range ids {
			b := a.Bytes(id)
			for layer := range ready {
				for part := range geo.Parts {
					from, to, _ := geo.Range(len(b), layer, part)
					if !bytes.Equal(b[from:to], chunks[c][from:to]) {
						t.Fatalf("chunk %d layer %d part %d: wrong bytes once ready", c, layer, part)
					}
				}
			}
		}
	}
	if usable, _, err := s.Wait(context.Background(), geo.Layers-1); err != nil || usable != len(keys) {
		t.Fatalf("Wait = %d usable, %v", usable, err)
	}
	for c, id := range ids {
		if !bytes.Equal(a.Bytes(id), chunks[c]) {
			t.Fatalf("chunk %d: wrong bytes", c)
		}
	}
	l.mu.Lock()
	for c, k := range keys {
		if c == 1 {
			continue // in RAM
		}
		rs := l.ranges[k]
		covered := 0
		for _, r := range rs {
			if r[0]/(geoChunk/geo.Parts) != (r[1]-1)/(geoChunk/geo.Parts) {
				t.Fatalf("chunk %d: range %v spans two parts", c, r)
			}
			covered += r[1] - r[0]
		}
		if most := geoChunk / (4 << 10); covered != geoChunk || len(rs) > most {
			t.Fatalf("chunk %d: %d ranges covering %d bytes, want at most %d covering %d", c, len(rs), covered, most, geoChunk)
		}
	}
	l.mu.Unlock()
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for _, id := range ids {
		a.Unref(id)
	}
}
