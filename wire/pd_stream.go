package wire

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/zeebo/xxh3"
)

// hashStep is how much of a chunk ReadSummed reads before hashing it:
// small enough to hash it while it is still in the CPU's last-level
// cache, large enough that the reads stay few (see the producer's step in
// kvtier/client, the same size).
const hashStep = 4 << 20

// ReadSummed reads a RECEIVE data frame: the chunk's bytes into dst,
// hashing them with hs as they arrive, then the checksum trailer. It
// returns the XXH3-64 of the bytes read and the trailer's value, for the
// caller to compare.
func (r *Reader) ReadSummed(h Header, dst []byte, hs *xxh3.Hasher) (got, want uint64, err error) {
	if int64(h.Len) != int64(len(dst))+ChecksumSize {
		return 0, 0, fmt.Errorf("%w: data frame of %d bytes for a chunk of %d and its checksum", ErrFrame, h.Len, len(dst))
	}
	hs.Reset()
	for off := 0; off < len(dst); {
		n := min(hashStep, len(dst)-off)
		if _, err := io.ReadFull(r.r, dst[off:off+n]); err != nil {
			return 0, 0, unexpected(err)
		}
		hs.Write(dst[off : off+n])
		off += n
	}
	if _, err := io.ReadFull(r.r, r.hdr[:ChecksumSize]); err != nil {
		return 0, 0, unexpected(err)
	}
	return hs.Sum64(), binary.LittleEndian.Uint64(r.hdr[:ChecksumSize]), nil
}
