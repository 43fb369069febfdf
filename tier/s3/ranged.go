package s3

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/minio/minio-go/v7"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

var (
	_ remote.RangeGetter    = (*Tier)(nil)
	_ remote.RangePreferrer = (*Tier)(nil)
)

// PrefersRanges implements remote.RangePreferrer: the URL's layer_ranges.
// Objects are pieced either way, so the choice can change without
// rewriting them; whole reads are the default because a Range GET per
// layer cost more than it saved against a local server
// (docs/layerwise.md).
func (t *Tier) PrefersRanges() bool { return t.cfg.LayerRanges }

// GetRange implements remote.RangeGetter with one GET carrying an HTTP
// Range header, its body read straight into dst. It returns how many bytes
// the object has from off, up to len(dst): fewer where the object ends, 0
// when off is at or past its end (the server answers 416) or the object is
// missing. With it the codec layer above seals raw chunks as pieced
// objects and layerwise loads read a chunk a layer at a time
// (docs/layerwise.md).
func (t *Tier) GetRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("s3: get range %v: %w", key, tier.ErrClosed)
	}
	if len(dst) == 0 {
		return 0, nil
	}
	if off < 0 {
		return 0, fmt.Errorf("s3: get range %v: negative offset %d", key, off)
	}
	ctx, cancel := t.bound(ctx, len(dst))
	defer cancel()
	name := objectName(t.cfg.Prefix, key)
	var opts minio.GetObjectOptions
	if err := opts.SetRange(int64(off), int64(off+len(dst)-1)); err != nil {
		return 0, fmt.Errorf("s3: get range %s: %w", name, err)
	}
	body, info, _, err := t.core.GetObject(ctx, t.cfg.Bucket, name, opts)
	if err != nil {
		if isNotFound(err) {
			t.known.forget(key)
			t.misses.Add(1)
			return 0, nil
		}
		if minio.ToErrorResponse(err).StatusCode == http.StatusRequestedRangeNotSatisfiable {
			return 0, nil // off is past the object's end
		}
		return 0, fmt.Errorf("s3: get range %s [%d, %d): %w", name, off, off+len(dst), err)
	}
	defer body.Close()
	if info.Size < 0 || info.Size > int64(len(dst)) {
		// No Content-Length, or a server that ignored the Range header
		// and sent the whole object: nothing here says which bytes these
		// are. (A whole object no longer than the range cannot be told
		// from the range here; the piece checksums above refuse it.)
		return 0, fmt.Errorf("s3: get range %s [%d, %d): answer of %d bytes", name, off, off+len(dst), info.Size)
	}
	n, err := io.ReadFull(body, dst[:info.Size])
	if err != nil {
		return 0, fmt.Errorf("s3: get range %s: read %d of %d bytes: %w", name, n, info.Size, err)
	}
	t.bytesRead.Add(uint64(n))
	return n, nil
}
