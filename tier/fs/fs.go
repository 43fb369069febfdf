// Package fs is a remote tier on a shared filesystem directory (NFS, CephFS,
// Lustre, or a local disk): every node that mounts the directory sees every
// chunk any node wrote. URL: fs:///abs/path[?capacity=10GiB].
//
// Layout. One file per chunk key, fanned out by the first two bytes of the
// chunk hash so that no directory holds more than a sliver of the cache:
//
//	<root>/<prefix>/<h0>/<h1>/<scope:16 hex><hash:32 hex>
//
// where h0 and h1 are the hash's first two bytes in hex and prefix defaults
// to "kvtier/". The file holds the object's bytes and nothing else.
//
// Crash safety. A writer creates ".<name>.tmp-<random>" in the target
// directory, writes and fsyncs it, hard-links it as <name>, removes the
// temporary name and fsyncs the directory. The link is atomic and never
// replaces a file, so a reader opens either no file or a whole one, and of
// concurrent writers of the same key, in any process, the first to link
// publishes its object and the others find it there (objects are
// content-addressed: the same bytes) and drop theirs. Only that first
// writer counts the object in its process's Used and Objects, so a Put
// abandoned at its deadline and its retry, both finishing, count it once.
// On a file system without hard links the writer renames instead (the
// last one wins) and counts the object when no file was there just
// before, which two racing writers can still both see. Readers only ever
// open exact object names, so temporary files, including ones a crash left
// half-written, are invisible; the sweeper removes those older than
// TempMaxAge.
//
// Capacity. Without ?capacity the directory grows without bound (an
// operator or the store's own quota manages it). With it, a background
// sweeper walks the tree every SweepInterval and, when the total exceeds the
// capacity, removes the oldest files by modification time until 90% is
// left. Reads do not refresh a file's time, so this is FIFO by write time:
// cheap on NFS and good enough for a cache whose hot chunks also live in the
// faster tiers above it. Several nodes may sweep the same directory; they
// agree on which files are oldest, and removing a file already removed is
// harmless.
package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"kvtier/chunk"
	"kvtier/internal/ratelog"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// Tier stores chunks as files under one directory. All methods are safe for
// concurrent use, also by several processes sharing the directory.
type Tier struct {
	cfg    Config
	dir    string // Root/Prefix, with a trailing separator
	logger *slog.Logger
	logs   ratelog.Set // sweep failures: once per sweep, or per file, while the directory is unhealthy

	closed atomic.Bool
	stop   context.CancelFunc
	swept  chan struct{} // closed after the first sweep
	done   chan struct{} // closed when the sweeper exits

	used, objects                          atomic.Int64
	hits, misses, puts, evictions, removes atomic.Uint64
	bytesRead, bytesWritten, tempsRemoved  atomic.Uint64

	// beforePublish, when set (tests only), runs after a Put's temporary
	// file is written and synced, just before it is published: it lets a
	// test order two writers of one key deterministically.
	beforePublish func()
	// beforeUnlinkDamaged, when set (tests only), runs in RemoveDamaged
	// after the file was compared, before its identity is checked again.
	beforeUnlinkDamaged func()
	// link and dirSync, when set (tests only), stand in for os.Link and
	// syncDir in a Put's publish.
	link    func(oldname, newname string) error
	dirSync func(dir string) error
}

// Besides tier.Tier, a Tier is a tier.PrefixContainer, tier.Remover,
// tier.StatsReporter, io.Closer and remote.Pinger. A shared directory does
// not pin.
var (
	_ tier.Tier            = (*Tier)(nil)
	_ tier.PrefixContainer = (*Tier)(nil)
	_ tier.Remover         = (*Tier)(nil)
	_ tier.StatsReporter   = (*Tier)(nil)
	_ io.Closer            = (*Tier)(nil)
	_ remote.Pinger        = (*Tier)(nil)
)

// Open is the remote.OpenFunc for the "fs" scheme.
func Open(ctx context.Context, u *url.URL, o remote.Options) (tier.Tier, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return New(cfg, logger)
}

// New opens (creating if needed) the tier described by cfg and starts its
// sweeper, which first removes stale temporary files and counts what is
// stored.
func New(cfg Config, logger *slog.Logger) (*Tier, error) {
	cfg = cfg.withDefaults()
	if !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("fs tier: root %q is not absolute", cfg.Root)
	}
	prefix, err := cleanPrefix(cfg.Prefix)
	if err != nil {
		return nil, fmt.Errorf("fs tier: prefix: %w", err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	dir := filepath.Join(cfg.Root, prefix)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("fs tier: create %s: %w", dir, err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("fs tier: %s is not a usable directory: %v", dir, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Tier{
		cfg: cfg, dir: dir + string(filepath.Separator), logger: logger,
		stop: cancel, swept: make(chan struct{}), done: make(chan struct{}),
	}
	go t.sweeper(ctx)
	return t, nil
}

// Dir returns the directory holding the tier's files.
func (t *Tier) Dir() string { return t.dir }

// Name implements tier.Tier.
func (t *Tier) Name() string { return "fs" }

// Size implements tier.Tier with one stat.
func (t *Tier) Size(key chunk.Key) (int, bool) {
	if t.closed.Load() {
		return 0, false
	}
	fi, err := os.Stat(t.path(key))
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	return int(fi.Size()), true
}

// PrefixContains implements tier.PrefixContainer. It stats up to Config.Parallel keys
// at once, so on a network filesystem a whole prefix costs about one round
// trip per Parallel keys rather than one per key.
func (t *Tier) PrefixContains(keys []chunk.Key) int {
	workers := min(t.cfg.Parallel, len(keys))
	if workers <= 1 {
		for i, k := range keys {
			if _, ok := t.Size(k); !ok {
				return i
			}
		}
		return len(keys)
	}
	var next atomic.Int64
	var firstMiss atomic.Int64
	firstMiss.Store(int64(len(keys)))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= firstMiss.Load() {
					return // every later key is past a known miss
				}
				if _, ok := t.Size(keys[i]); ok {
					continue
				}
				for m := firstMiss.Load(); i < m && !firstMiss.CompareAndSwap(m, i); m = firstMiss.Load() {
				}
				return
			}
		})
	}
	wg.Wait()
	return int(firstMiss.Load())
}

// Get implements tier.Tier.
func (t *Tier) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	if t.closed.Load() {
		return 0, tier.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	p := t.path(key)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			t.misses.Add(1)
			return 0, fmt.Errorf("fs tier: %v: %w", key, tier.ErrNotFound)
		}
		return 0, fmt.Errorf("fs tier: get %v: %w", key, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("fs tier: get %v: %w", key, err)
	}
	size := fi.Size()
	if size > int64(len(dst)) {
		return 0, fmt.Errorf("fs tier: get %v: object is %d bytes, buffer %d: %w", key, size, len(dst), io.ErrShortBuffer)
	}
	// Files are published whole by link(2) (or rename, where the file
	// system has no hard links) and never written in place, so a short
	// read means something outside kvtier changed it.
	if _, err := io.ReadFull(f, dst[:size]); err != nil {
		return 0, fmt.Errorf("fs tier: get %v: read %s: %w", key, p, err)
	}
	t.hits.Add(1)
	t.bytesRead.Add(uint64(size))
	return int(size), nil
}

// Put implements tier.Tier: write a temporary file, fsync, publish it
// under the object's name with link(2), which never replaces another
// writer's file (rename where the file system has no hard links), fsync
// the directory.
func (t *Tier) Put(ctx context.Context, key chunk.Key, data []byte) error {
	if t.closed.Load() {
		return tier.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.cfg.Capacity > 0 && int64(len(data)) > t.cfg.Capacity {
		return fmt.Errorf("fs tier: put %v: %d bytes: %w", key, len(data), tier.ErrTooLarge)
	}
	p := t.path(key)
	if _, err := os.Stat(p); err == nil {
		return nil // already stored, by this node or another
	}
	created, err := t.writeAtomic(p, data)
	if created {
		// Counted even when the directory's sync failed after the link:
		// the file is there, and a retry would stop at the Stat above
		// without counting it.
		t.puts.Add(1)
		t.bytesWritten.Add(uint64(len(data)))
		t.used.Add(int64(len(data)))
		t.objects.Add(1)
	}
	if err != nil {
		return fmt.Errorf("fs tier: put %v: %w", key, err)
	}
	return nil // created, or another writer published it since the Stat above
}

// writeAtomic publishes data as p unless another writer published p
// first, so that readers see no file or a whole one, and whatever p holds
// survives a crash once this returns. created reports whether this call
// made p.
func (t *Tier) writeAtomic(p string, data []byte) (created bool, err error) {
	dir := filepath.Dir(p)
	f, tmp, err := createTemp(dir, filepath.Base(p))
	if errors.Is(err, fs.ErrNotExist) {
		if err = mkdirSynced(dir); err == nil {
			f, tmp, err = createTemp(dir, filepath.Base(p))
		}
	}
	if err != nil {
		return false, err
	}
	if err = writeSyncClose(f, data); err == nil {
		if t.beforePublish != nil {
			t.beforePublish()
		}
		created, err = t.publish(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return false, err
	}
	sync := syncDir
	if t.dirSync != nil {
		sync = t.dirSync
	}
	return created, sync(dir)
}

// publish gives the written temporary file tmp the name p, and reports
// whether it did: false when p exists already. The temporary name is
// removed either way (a removal that fails leaves it to the sweeper).
func (t *Tier) publish(tmp, p string) (bool, error) {
	link := os.Link
	if t.link != nil {
		link = t.link
	}
	err := link(tmp, p)
	switch {
	case err == nil:
		os.Remove(tmp)
		return true, nil
	case errors.Is(err, fs.ErrExist):
		// Over NFSv3 a LINK retransmitted after a lost reply finds the
		// link the first transmission made: EEXIST for our own file.
		ours := sameFile(tmp, p)
		os.Remove(tmp)
		return ours, nil
	case !noHardLinks(err):
		return false, err
	}
	_, statErr := os.Lstat(p)
	if err := os.Rename(tmp, p); err != nil {
		return false, err
	}
	return statErr != nil, nil
}

// sameFile reports whether the names a and b are links to one file.
func sameFile(a, b string) bool {
	ai, err := os.Lstat(a)
	if err != nil {
		return false
	}
	bi, err := os.Lstat(b)
	return err == nil && os.SameFile(ai, bi)
}

// noHardLinks reports whether a failed link(2) says the file system has
// no hard links (vfat, some FUSE and object-store mounts).
func noHardLinks(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.ENOSYS)
}

func writeSyncClose(f *os.File, data []byte) error {
	_, err := f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// tempMarker separates an object's name from the random suffix in
// temporary file names: ".<name>.tmp-<16 hex>".
const tempMarker = ".tmp-"

// isTemp reports whether name is a temporary file this package creates, so
// that a sweep of a shared directory never touches other programs' files.
func isTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	base, _, ok := strings.Cut(rest, tempMarker)
	return ok && (base == pingName || isObjectName(base))
}

// pingName is the base of Ping's temporary files.
const pingName = "ping"

// createTemp creates a new, unique temporary file for base in dir. Unlike
// os.CreateTemp it leaves the mode to the umask (0644 typically), so other
// nodes' users can read what this one wrote.
func createTemp(dir, base string) (*os.File, string, error) {
	for range 10 {
		name := filepath.Join(dir, "."+base+tempMarker+strconv.FormatUint(rand.Uint64(), 16))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if !errors.Is(err, fs.ErrExist) {
			return f, name, err
		}
	}
	return nil, "", fmt.Errorf("create temporary file in %s: too many name collisions", dir)
}

// mkdirSynced creates dir and its missing parents and fsyncs the parents, so
// that new fan-out directories survive a crash along with their files.
func mkdirSynced(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	parent := filepath.Dir(dir)
	if err := syncDir(parent); err != nil {
		return err
	}
	return syncDir(filepath.Dir(parent))
}

// syncDir fsyncs a directory so a link, rename or create in it is durable.
// Filesystems that cannot sync directories (EINVAL) are fine: their
// metadata is durable by other means or not at all.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		return nil
	}
	return err
}

// Remove implements tier.Remover.
func (t *Tier) Remove(key chunk.Key) bool {
	if t.closed.Load() {
		return false
	}
	p := t.path(key)
	fi, err := os.Stat(p)
	if err != nil || os.Remove(p) != nil {
		return false
	}
	t.removes.Add(1)
	t.used.Add(-fi.Size())
	t.objects.Add(-1)
	return true
}

// Ping checks that the directory is writable by creating, syncing and
// removing a temporary file. It implements the probe remote.Guard uses.
func (t *Tier) Ping(ctx context.Context) error {
	if t.closed.Load() {
		return tier.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f, name, err := createTemp(t.dir, pingName)
	if err == nil {
		err = writeSyncClose(f, []byte("ping"))
		if rerr := os.Remove(name); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("fs tier: %s not writable: %w", t.dir, err)
	}
	return nil
}

// Stats implements tier.StatsReporter. Used and Objects are as of the last sweep
// plus this process's writes and removes since; other nodes' writes show up
// at the next sweep.
func (t *Tier) Stats() tier.Stats {
	return tier.Stats{
		Name:         "fs",
		Capacity:     t.cfg.Capacity,
		Used:         t.used.Load(),
		Objects:      t.objects.Load(),
		Hits:         t.hits.Load(),
		Misses:       t.misses.Load(),
		Puts:         t.puts.Load(),
		Evictions:    t.evictions.Load(),
		Removes:      t.removes.Load(),
		BytesRead:    t.bytesRead.Load(),
		BytesWritten: t.bytesWritten.Load(),
	}
}

// Close stops the sweeper. Files stay: they are the cache.
func (t *Tier) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	t.stop()
	<-t.done
	return nil
}

const hexDigits = "0123456789abcdef"

// nameLen is the length of an object's file name: scope and hash in hex.
const nameLen = 16 + 32

// path returns the object file of key: dir/h0/h1/<scope><hash>.
func (t *Tier) path(key chunk.Key) string {
	var b strings.Builder
	b.Grow(len(t.dir) + 6 + nameLen)
	b.WriteString(t.dir)
	writeHex(&b, key.Hash[0])
	b.WriteByte(filepath.Separator)
	writeHex(&b, key.Hash[1])
	b.WriteByte(filepath.Separator)
	for shift := 60; shift >= 0; shift -= 4 {
		b.WriteByte(hexDigits[key.Scope>>shift&0xf])
	}
	for _, c := range key.Hash {
		writeHex(&b, c)
	}
	return b.String()
}

func writeHex(b *strings.Builder, c byte) {
	b.WriteByte(hexDigits[c>>4])
	b.WriteByte(hexDigits[c&0xf])
}

// isObjectName reports whether a file name is one path would produce.
func isObjectName(name string) bool {
	if len(name) != nameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if strings.IndexByte(hexDigits, name[i]) < 0 {
			return false
		}
	}
	return true
}
