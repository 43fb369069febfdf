package fs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"

	"kvtier/chunk"
	"kvtier/tier/remote"
)

var _ remote.DamageRemover = (*Tier)(nil)

// RemoveDamaged implements remote.DamageRemover: it removes key's file only
// if it still holds the damaged bytes a reader found, and is the very file
// it compared (same device and inode on an Lstat just before the unlink).
// Another reader may have removed the damaged file already and a writer
// published a good one under the same name (link(2) never replaces a
// file, so a name changes content only through an unlink): that file
// stays.
func (t *Tier) RemoveDamaged(key chunk.Key, d remote.Damage) remote.Removal {
	if t.closed.Load() || len(d.Head) == 0 {
		return remote.DamageKept
	}
	p := t.path(key)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return remote.DamageGone
	}
	if err != nil {
		return remote.DamageKept
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return remote.DamageKept
	}
	if !holds(f, fi.Size(), d) {
		return remote.DamageGone
	}
	if t.beforeUnlinkDamaged != nil {
		t.beforeUnlinkDamaged()
	}
	if now, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) || (err == nil && !os.SameFile(fi, now)) {
		return remote.DamageGone
	} else if err != nil {
		return remote.DamageKept
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return remote.DamageGone
		}
		return remote.DamageKept
	}
	t.removes.Add(1)
	t.used.Add(-fi.Size())
	t.objects.Add(-1)
	return remote.DamageRemoved
}

// compareBlock is how much of a file holds reads at a time.
const compareBlock = 64 << 10

// holds reports whether f, size bytes long, holds what d describes. It
// reads the file a block at a time into one buffer, whatever d holds.
func holds(f *os.File, size int64, d remote.Damage) bool {
	if d.Size >= 0 && size != int64(d.Size) {
		return false
	}
	buf := make([]byte, min(compareBlock, max(len(d.Head), len(d.Part))))
	if !readsAs(f, 0, d.Head, buf) {
		return false
	}
	return len(d.Part) == 0 || readsAs(f, int64(d.Off), d.Part, buf)
}

// readsAs reports whether f's bytes at off are want, read through buf.
func readsAs(f *os.File, off int64, want, buf []byte) bool {
	for len(want) > 0 {
		b := buf[:min(len(buf), len(want))]
		n, err := f.ReadAt(b, off)
		if n != len(b) || (err != nil && err != io.EOF) || !bytes.Equal(b, want[:n]) {
			return false
		}
		want, off = want[n:], off+int64(n)
	}
	return true
}
