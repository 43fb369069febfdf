package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

var _ remote.RangeGetter = (*Tier)(nil)

// GetRange implements remote.RangeGetter with one ReadAt on the chunk's
// file. It returns how many bytes the file has from off, up to len(dst):
// fewer where the file ends, 0 when off is at or past its end or the file
// is missing. With it the codec layer above seals raw chunks as pieced
// objects and layerwise loads read a chunk a layer at a time
// (docs/layerwise.md). Files are published whole (link(2), or rename)
// and never written in place, so an open file never changes under a
// read.
func (t *Tier) GetRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("fs tier: get range %v: %w", key, tier.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(dst) == 0 {
		return 0, nil
	}
	if off < 0 {
		return 0, fmt.Errorf("fs tier: get range %v: negative offset %d", key, off)
	}
	p := t.path(key)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			t.misses.Add(1)
			return 0, nil
		}
		return 0, fmt.Errorf("fs tier: get range %v: %w", key, err)
	}
	defer f.Close()
	n, err := f.ReadAt(dst, int64(off))
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("fs tier: get range %v: read %s at %d: %w", key, p, off, err)
	}
	t.bytesRead.Add(uint64(n))
	return n, nil
}
