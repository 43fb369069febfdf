package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTier opens a tier on cfg (Root defaults to a fresh temp dir) and waits
// for its first sweep, so tests start from a counted, cleaned directory.
func newTier(t testing.TB, cfg Config) *Tier {
	t.Helper()
	if cfg.Root == "" {
		cfg.Root = t.TempDir()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	tr, err := New(cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	<-tr.swept
	t.Cleanup(func() { tr.Close() })
	return tr
}

func key(i int) chunk.Key {
	k := chunk.Key{Scope: 0xabcdef0123456789}
	k.Hash[0], k.Hash[1], k.Hash[15] = byte(i), byte(i>>8), 0x5a
	return k
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	tr := newTier(t, Config{})
	ctx := context.Background()
	sizes := []int{0, 1, 4<<20 + 3, 2 << 20}
	for i, n := range sizes {
		data := randomBytes(n, uint64(i))
		if err := tr.Put(ctx, key(i), data); err != nil {
			t.Fatal(err)
		}
		if got, ok := tr.Size(key(i)); !ok || got != n {
			t.Fatalf("Size(%d) = %d, %v; want %d", i, got, ok, n)
		}
		dst := make([]byte, n+10)
		got, err := tr.Get(ctx, key(i), dst)
		if err != nil || !bytes.Equal(dst[:got], data) {
			t.Fatalf("Get(%d) = %d bytes, %v; want the %d bytes put", i, got, err, n)
		}
	}
	// The layout the package comment promises.
	k := key(0x0302)
	tr.Put(ctx, k, []byte("x"))
	want := filepath.Join(tr.Dir(), "02", "03", fmt.Sprintf("%016x%s", k.Scope, k.Hash))
	if _, err := os.Stat(want); err != nil {
		t.Fatalf("object not at %s: %v", want, err)
	}

	if err := tr.Put(ctx, key(2), []byte("different")); err != nil {
		t.Fatal(err)
	}
	if n, _ := tr.Size(key(2)); n != sizes[2] {
		t.Fatal("Put of a stored key replaced it")
	}
	if _, err := tr.Get(ctx, key(2), make([]byte, 100)); !errors.Is(err, io.ErrShortBuffer) {
		t.Fatalf("Get into a short buffer = %v, want ErrShortBuffer", err)
	}
	if _, err := tr.Get(ctx, key(999), make([]byte, 1)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get of a missing key = %v, want ErrNotFound", err)
	}
	if tier.Contains(tr, key(999)) || !tier.Contains(tr, key(1)) {
		t.Fatal("Contains is wrong")
	}
	if !tr.Remove(key(1)) || tr.Remove(key(1)) || tier.Contains(tr, key(1)) {
		t.Fatal("Remove is wrong")
	}
	s := tr.Stats()
	if s.Puts != 5 || s.Hits != 4 || s.Misses != 1 || s.Removes != 1 || s.Objects != 4 ||
		s.Used != int64(sizes[0]+sizes[2]+sizes[3]+1) {
		t.Fatalf("Stats = %+v", s)
	}
	if _, ok := tier.Tier(tr).(tier.Pinner); ok {
		t.Fatal("a shared directory cannot pin, so the fs tier must not be a tier.Pinner")
	}
}

func TestPrefixContains(t *testing.T) {
	for _, parallel := range []int{1, 3, 8} {
		t.Run(fmt.Sprint("parallel", parallel), func(t *testing.T) {
			tr := newTier(t, Config{Parallel: parallel})
			keys := make([]chunk.Key, 20)
			for i := range keys {
				keys[i] = key(i)
				if i < 13 || i == 15 {
					if err := tr.Put(context.Background(), keys[i], []byte{byte(i)}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if n := tr.PrefixContains(keys); n != 13 {
				t.Fatalf("PrefixContains = %d, want 13", n)
			}
			if n := tr.PrefixContains(keys[:13]); n != 13 {
				t.Fatalf("PrefixContains of stored keys = %d, want 13", n)
			}
			if n := tr.PrefixContains(keys[13:]); n != 0 {
				t.Fatalf("PrefixContains from a miss = %d, want 0", n)
			}
			if n := tr.PrefixContains(nil); n != 0 {
				t.Fatalf("PrefixContains(nil) = %d", n)
			}
		})
	}
}

// object builds writer w's version of a shared key: a length and a fill
// byte that both identify w, so a reader can tell a whole object from a mix.
func object(w int) []byte {
	return bytes.Repeat([]byte{byte(w + 1)}, 1<<20+w*4099)
}

func checkWhole(b []byte) error {
	if len(b) == 0 {
		return errors.New("read an empty object")
	}
	w := int(b[0]) - 1
	if w < 0 || len(b) != len(object(w)) {
		return fmt.Errorf("read %d bytes starting with %d: no writer wrote that", len(b), b[0])
	}
	if i := bytes.IndexFunc(b, func(r rune) bool { return r != rune(b[0]) }); i >= 0 {
		return fmt.Errorf("writer %d's object has a foreign byte at %d", w, i)
	}
	return nil
}

// TestConcurrentWritersOfOneKey races writers in two tier instances (as two
// nodes would) over one key, publishing it again and again, while readers
// check that every read is one writer's whole object: exactly one write
// publishes it (link(2) never replaces), one Put counts it, and no
// temporary file is left.
func TestConcurrentWritersOfOneKey(t *testing.T) {
	root := t.TempDir()
	nodes := []*Tier{newTier(t, Config{Root: root}), newTier(t, Config{Root: root})}
	k := key(7)
	path := nodes[0].path(k)
	const writers, rounds, readers = 6, 15, 3
	var wg sync.WaitGroup
	var created atomic.Int32
	for w := range writers {
		wg.Go(func() {
			data := object(w)
			for range rounds {
				// writeAtomic writes a whole temporary file every time,
				// where Put would stop at its Stat once one has won; only
				// the first link publishes.
				c, err := nodes[w%2].writeAtomic(path, data)
				if err != nil {
					t.Error(err)
					return
				}
				if c {
					created.Add(1)
				}
			}
		})
	}
	stop := make(chan struct{})
	var reads sync.WaitGroup
	for r := range readers {
		reads.Go(func() {
			dst := make([]byte, 2<<20)
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := nodes[r%2].Get(context.Background(), k, dst)
				if errors.Is(err, tier.ErrNotFound) {
					continue // before the first link
				}
				if err != nil {
					t.Error(err)
					return
				}
				if err := checkWhole(dst[:n]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	reads.Wait()
	if n := created.Load(); n != 1 {
		t.Fatalf("%d of %d writes published the object, want exactly 1", n, writers*rounds)
	}
	assertNoTemps(t, root)

	// Public Put from many goroutines at once: exactly one whole object.
	k2 := key(8)
	for w := range writers {
		wg.Go(func() {
			if err := nodes[w%2].Put(context.Background(), k2, object(w)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	dst := make([]byte, 2<<20)
	n, err := nodes[0].Get(context.Background(), k2, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkWhole(dst[:n]); err != nil {
		t.Fatal(err)
	}
	if puts := nodes[0].Stats().Puts + nodes[1].Stats().Puts; puts != 1 {
		t.Fatalf("%d Puts counted the object, want 1", puts)
	}
	assertNoTemps(t, root)
}

func assertNoTemps(t *testing.T, root string) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && isTemp(d.Name()) {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

// TestCrashLeftovers plants what a writer killed mid-Put leaves behind, a
// whole and a truncated temporary file, and checks readers never see them
// and the next Open removes the stale one.
func TestCrashLeftovers(t *testing.T) {
	root := t.TempDir()
	tr := newTier(t, Config{Root: root})
	ctx := context.Background()
	k, stored := key(1), key(2)
	data := randomBytes(1<<20, 1)
	if err := tr.Put(ctx, stored, data); err != nil {
		t.Fatal(err)
	}
	var temps []string
	for i, kk := range []chunk.Key{k, stored} {
		p := tr.path(kk)
		os.MkdirAll(filepath.Dir(p), 0o755)
		whole := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+tempMarker+fmt.Sprint("dead", i))
		torn := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+tempMarker+fmt.Sprint("torn", i))
		if err := os.WriteFile(whole, randomBytes(1<<20, 9), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(torn, randomBytes(1000, 9), 0o644); err != nil {
			t.Fatal(err)
		}
		temps = append(temps, whole, torn)
	}
	if tier.Contains(tr, k) || tr.PrefixContains([]chunk.Key{k}) != 0 {
		t.Fatal("a temporary file made its key visible")
	}
	if _, ok := tr.Size(k); ok {
		t.Fatal("a temporary file has a size")
	}
	if _, err := tr.Get(ctx, k, make([]byte, 2<<20)); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("Get next to a temporary file = %v, want ErrNotFound", err)
	}
	dst := make([]byte, 2<<20)
	if n, err := tr.Get(ctx, stored, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("stored object damaged by a neighbouring temporary file: %v", err)
	}
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatalf("Put over a crashed write: %v", err)
	}
	if n, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("Get after Put over a crashed write: %v", err)
	}

	// Age all but the last temporary file past TempMaxAge, then reopen.
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range temps[:len(temps)-1] {
		os.Chtimes(p, old, old)
	}
	tr.Close()
	tr = newTier(t, Config{Root: root})
	for _, p := range temps[:len(temps)-1] {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale temporary file %s survived Open: %v", p, err)
		}
	}
	if _, err := os.Stat(temps[len(temps)-1]); err != nil {
		t.Errorf("Open removed a fresh temporary file (a write in progress): %v", err)
	}
	if s := tr.Stats(); s.Objects != 2 || s.Used != 2<<20 {
		t.Fatalf("after reopen Stats = %+v, want 2 objects of 1 MiB", s)
	}
}

func TestCapacityEvictsOldest(t *testing.T) {
	tr := newTier(t, Config{Capacity: 8 << 20, SweepInterval: time.Hour})
	ctx := context.Background()
	base := time.Now().Add(-time.Hour)
	const n = 12
	for i := range n {
		if err := tr.Put(ctx, key(i), randomBytes(1<<20, uint64(i))); err != nil {
			t.Fatal(err)
		}
		mt := base.Add(time.Duration(i) * time.Minute)
		os.Chtimes(tr.path(key(i)), mt, mt)
	}
	if err := tr.Put(ctx, key(100), make([]byte, 9<<20)); !errors.Is(err, tier.ErrTooLarge) {
		t.Fatalf("Put beyond capacity = %v, want ErrTooLarge", err)
	}
	tr.sweep(ctx)
	// 12 MiB down to 90% of 8 MiB (7.2 MiB) takes the 5 oldest.
	for i := range n {
		if got, want := tier.Contains(tr, key(i)), i >= 5; got != want {
			t.Errorf("key %d present = %v, want %v", i, got, want)
		}
	}
	if s := tr.Stats(); s.Evictions != 5 || s.Objects != 7 || s.Used != 7<<20 {
		t.Fatalf("Stats after eviction = %+v", s)
	}
	tr.sweep(ctx)
	if s := tr.Stats(); s.Evictions != 5 {
		t.Fatalf("a sweep under capacity evicted: %+v", s)
	}
}

func TestIsTemp(t *testing.T) {
	obj := strings.Repeat("ab", nameLen/2)
	for name, want := range map[string]bool{
		"." + obj + ".tmp-1f":    true,
		".ping.tmp-0":            true,
		obj:                      false,
		".other.tmp-12":          false, // someone else's file in a shared root
		"." + obj[1:] + ".tmp-1": false,
		".bashrc":                false,
	} {
		if isTemp(name) != want {
			t.Errorf("isTemp(%q) = %v", name, !want)
		}
	}
}

func TestOldestKeepsJustEnough(t *testing.T) {
	o := &oldest{need: 10}
	for i, size := range []int64{4, 4, 4, 4, 4} {
		o.offer(file{path: fmt.Sprint(i), size: size, mtime: int64(10 - i)}) // later files are older
	}
	var got []string
	for _, f := range o.files {
		got = append(got, f.path)
	}
	if o.total != 12 || len(got) != 3 || strings.Contains(strings.Join(got, ""), "0") || strings.Contains(strings.Join(got, ""), "1") {
		t.Fatalf("victims %v (total %d), want the 3 oldest: 2, 3, 4", got, o.total)
	}
}

func TestPingAndClose(t *testing.T) {
	root := t.TempDir()
	tr := newTier(t, Config{Root: root})
	if err := tr.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertNoTemps(t, root)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := tr.Ping(context.Background()); err == nil {
		t.Fatal("Ping of a removed directory succeeded")
	}
	tr.Close()
	if _, err := tr.Get(context.Background(), key(1), nil); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Get after Close = %v, want ErrClosed", err)
	}
	if err := tr.Put(context.Background(), key(1), nil); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("Put after Close = %v, want ErrClosed", err)
	}
}

func TestOpenByURL(t *testing.T) {
	root := t.TempDir()
	tr, err := remote.Open(context.Background(), "fs://"+root+"?capacity=1GiB&prefix=team-a&sweep=1h&parallel=4", remote.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close(tr)
	ft := tr.(*Tier)
	if ft.cfg.Capacity != 1<<30 || ft.cfg.Parallel != 4 || ft.cfg.SweepInterval != time.Hour ||
		ft.Dir() != filepath.Join(root, "team-a")+"/" {
		t.Fatalf("URL options not applied: %+v, dir %s", ft.cfg, ft.Dir())
	}
	if _, ok := any(tr).(remote.Pinger); !ok {
		t.Fatal("fs tier does not offer Ping to the circuit breaker")
	}
}

func TestParseURLRejects(t *testing.T) {
	for _, raw := range []string{
		"fs:relative/path",
		"fs://nfs-server/export",
		"fs://u:pw@localhost/x",
		"fs://",
		"fs:///x#frag",
		"fs:///x?capacity=lots",
		"fs:///x?capacity=-1GB",
		"fs:///x?capacity=1e30",
		"fs:///x?prefix=../escape",
		"fs:///x?prefix=/abs",
		"fs:///x?sweep=0s",
		"fs:///x?parallel=0",
		"fs:///x?capacity=1GB&capacity=2GB",
		"fs:///x?capasity=1GB",
	} {
		_, err := remote.Open(context.Background(), raw, remote.Options{Logger: quiet})
		if err == nil {
			t.Errorf("Open(%q) succeeded", raw)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("Open(%q) leaks the password: %v", raw, err)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "10GiB": 10 << 30, "1.5 TiB": 3 << 39, "500MB": 500e6,
		"2kb": 2000, "7B": 7, "3mib": 3 << 20,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "1 XB", "NaN", "Inf", "1e40"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) succeeded", in)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"10GiB", "1.5TB", "0x1p10", "9223372036854775807", "1e18kb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := ParseBytes(s); err == nil && n < 0 {
			t.Fatalf("ParseBytes(%q) = %d", s, n)
		}
	})
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"fs:///a?capacity=1GiB", "fs://localhost/a?prefix=b/c", "fs:///a?sweep=1s&parallel=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		c, err := ParseURL(u)
		if err != nil {
			return
		}
		if !filepath.IsAbs(c.Root) || c.Capacity < 0 || c.Prefix == ".." || strings.HasPrefix(c.Prefix, "../") || strings.HasPrefix(c.Prefix, "/") {
			t.Fatalf("ParseURL(%q) accepted %+v", s, c)
		}
	})
}
