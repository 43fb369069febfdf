package fs

import (
	"container/heap"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// lowWater is the share of the capacity a sweep evicts down to, so that a
// cache at capacity is not swept on every tick.
const lowWater = 0.9

// sweeper removes stale temporary files and counts the stored bytes once at
// start, then, with a capacity, enforces it every SweepInterval.
func (t *Tier) sweeper(ctx context.Context) {
	defer close(t.done)
	t.sweep(ctx)
	close(t.swept)
	if t.cfg.Capacity <= 0 {
		return
	}
	tick := time.NewTicker(t.cfg.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.sweep(ctx)
		}
	}
}

// sweep walks the tree once to clean temporary files and total the
// objects, then, if over capacity, once more to evict the oldest.
func (t *Tier) sweep(ctx context.Context) {
	used, objects, err := t.scan(ctx, time.Now(), nil)
	if err != nil {
		if ctx.Err() == nil {
			t.logs.Log(t.logger, slog.LevelWarn, "fs tier: sweep failed", "dir", t.dir, "err", err)
		}
		return
	}
	t.used.Store(used)
	t.objects.Store(objects)
	if t.cfg.Capacity <= 0 || used <= t.cfg.Capacity {
		return
	}
	need := used - int64(float64(t.cfg.Capacity)*lowWater)
	victims := &oldest{need: need}
	if _, _, err := t.scan(ctx, time.Now(), victims.offer); err != nil {
		if ctx.Err() == nil {
			t.logs.Log(t.logger, slog.LevelWarn, "fs tier: eviction scan failed", "dir", t.dir, "err", err)
		}
		return
	}
	var freed int64
	var n int
	for _, v := range victims.files {
		// A reader that has the file open keeps reading it: unlinking
		// only drops the name (NFS clients rename it aside until closed).
		if err := os.Remove(v.path); err == nil {
			freed += v.size
			n++
		} else if !errors.Is(err, fs.ErrNotExist) {
			t.logs.Log(t.logger, slog.LevelWarn, "fs tier: evict", "path", v.path, "err", err)
		}
	}
	t.evictions.Add(uint64(n))
	t.used.Add(-freed)
	t.objects.Add(-int64(n))
	t.logger.Debug("fs tier: evicted", "files", n, "bytes", freed, "capacity", t.cfg.Capacity)
}

// scan walks the tree, removes temporary files older than TempMaxAge, passes
// each object to visit (if not nil) and returns the objects' total size and
// count.
func (t *Tier) scan(ctx context.Context, now time.Time, visit func(file)) (used, objects int64, err error) {
	err = filepath.WalkDir(t.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed by another node meanwhile
			}
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		name := d.Name()
		temp := isTemp(name)
		if !temp && !isObjectName(name) {
			return nil // not ours
		}
		info, err := d.Info()
		if err != nil {
			return nil // gone since the directory was read
		}
		if temp {
			if now.Sub(info.ModTime()) > t.cfg.TempMaxAge && os.Remove(p) == nil {
				t.tempsRemoved.Add(1)
			}
			return nil
		}
		used += info.Size()
		objects++
		if visit != nil {
			visit(file{path: p, size: info.Size(), mtime: info.ModTime().UnixNano()})
		}
		return nil
	})
	return used, objects, err
}

type file struct {
	path  string
	size  int64
	mtime int64
}

// oldest keeps the oldest files whose sizes add up to at least need, in a
// max-heap on mtime: a newer file is dropped as soon as the older ones
// suffice without it. Memory stays proportional to what will be evicted,
// not to the size of the tree.
type oldest struct {
	need, total int64
	files       []file
}

func (o *oldest) offer(f file) {
	heap.Push(o, f)
	o.total += f.size
	for len(o.files) > 0 && o.total-o.files[0].size >= o.need {
		o.total -= heap.Pop(o).(file).size
	}
}

func (o *oldest) Len() int           { return len(o.files) }
func (o *oldest) Less(i, j int) bool { return o.files[i].mtime > o.files[j].mtime }
func (o *oldest) Swap(i, j int)      { o.files[i], o.files[j] = o.files[j], o.files[i] }
func (o *oldest) Push(x any)         { o.files = append(o.files, x.(file)) }
func (o *oldest) Pop() any {
	f := o.files[len(o.files)-1]
	o.files = o.files[:len(o.files)-1]
	return f
}
