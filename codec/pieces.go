package codec

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"kvtier/kvformat"
)

// Pieced objects, format version 2: a raw chunk with a checksum per piece,
// so that a reader can fetch any range of the chunk (a layer, for
// layerwise loading: docs/layerwise.md) and verify it without the rest.
//
//	offset size field
//	     0   64 the header of version 1 (HeaderSize), with version 2 and the
//	            raw codec; payload length = PieceTableSize + raw length;
//	            bytes 48..55 hold the xxh3-64 of the piece table
//	    64 2112 piece table: u32 piece shift s (12 ≤ s ≤ 40: pieces are 1<<s
//	            bytes), u32 piece count m = ceil(raw length / 1<<s) (≤ 256),
//	            m × xxh3-64 of each piece, zero to the end of the table
//	  2176    . the chunk's bytes, unchanged
//
// The piece size is the smallest power of two of at least 4096 bytes that
// cuts the chunk into at most 256 pieces (128 KiB for a 32 MiB chunk), as
// in the disk tier's records. The table has a fixed size so that the
// chunk's bytes start at PiecedHeaderSize whatever its length. Version 1
// readers reject version 2 objects as foreign (a miss, never wrong bytes).
const (
	PieceTableSize   = 2112
	PiecedHeaderSize = HeaderSize + PieceTableSize
	MaxPieces        = 256
	piecedVersion    = 2
	minPieceShift    = 12
	maxPieceShift    = 40
)

// PieceShift returns the piece shift of a raw chunk of n bytes.
func PieceShift(n int) uint8 {
	s := uint8(minPieceShift)
	for s < maxPieceShift && int64(n) > int64(MaxPieces)<<s {
		s++
	}
	return s
}

// SealPieced appends a pieced object (version 2, raw) holding chunk to dst.
// spec is as for Seal: the zero Spec for an opaque chunk.
func SealPieced(dst []byte, spec kvformat.Spec, chunk []byte) ([]byte, error) {
	if spec != (kvformat.Spec{}) {
		if _, err := spec.TokensIn(len(chunk)); err != nil {
			return dst, fmt.Errorf("codec: seal: %w", err)
		}
	}
	if len(chunk) > MaxRawLen {
		return dst, fmt.Errorf("%w: chunk of %d bytes exceeds MaxRawLen %d", ErrUnsupported, len(chunk), MaxRawLen)
	}
	shift := PieceShift(len(chunk))
	p := 1 << shift
	var sums [MaxPieces]uint64
	m := (len(chunk) + p - 1) / p
	for i := range m {
		sums[i] = xxh3.Hash(chunk[i*p : min((i+1)*p, len(chunk))])
	}
	start := len(dst)
	dst, err := AppendPiecedHeader(dst, spec, len(chunk), sums[:m])
	if err != nil {
		return dst[:start], err
	}
	return append(dst, chunk...), nil
}

// Pieces is what a pieced object's header and piece table say.
type Pieces struct {
	Info  Info
	Shift uint8
	Count int
	Sums  [MaxPieces]uint64
}

// PieceLen is the length of every piece but the last.
func (p *Pieces) PieceLen() int { return 1 << p.Shift }

// Check reports whether piece i of the chunk has its checksum; piece must
// be exactly that piece's bytes.
func (p *Pieces) Check(i int, piece []byte) bool {
	if i < 0 || i >= p.Count {
		return false
	}
	want := min(p.PieceLen(), p.Info.RawLen-i*p.PieceLen())
	return len(piece) == want && xxh3.Hash(piece) == p.Sums[i]
}

// PeekPieces checks the header and piece table of a pieced object, which
// head must hold (its first PiecedHeaderSize bytes at least). An object
// of version 1 gives ErrForeign with its Info: read it whole.
func PeekPieces(head []byte, out *Pieces) error {
	info, err := PeekInfo(head)
	if err != nil {
		return err
	}
	if !info.Pieced {
		out.Info = info
		return fmt.Errorf("%w: format version 1 has no piece checksums", ErrForeign)
	}
	if len(head) < PiecedHeaderSize {
		return fmt.Errorf("%w: %d bytes, shorter than the pieced header", ErrCorrupt, len(head))
	}
	table := head[HeaderSize:PiecedHeaderSize]
	if got, want := binary.LittleEndian.Uint64(head[payloadSumOff:]), xxh3.Hash(table); got != want {
		return fmt.Errorf("%w: piece table checksum %016x, computed %016x", ErrCorrupt, got, want)
	}
	shift, m := binary.LittleEndian.Uint32(table[0:]), int(binary.LittleEndian.Uint32(table[4:]))
	if shift != uint32(PieceShift(info.RawLen)) || m != (info.RawLen+(1<<shift)-1)>>shift {
		return fmt.Errorf("%w: piece table of %d pieces of 1<<%d for %d bytes", ErrCorrupt, m, shift, info.RawLen)
	}
	for _, b := range table[8+8*m:] {
		if b != 0 {
			return fmt.Errorf("%w: piece table padding is not zero", ErrCorrupt)
		}
	}
	out.Info, out.Shift, out.Count = info, uint8(shift), m
	for i := range m {
		out.Sums[i] = binary.LittleEndian.Uint64(table[8+8*i:])
	}
	return nil
}

// unsealPieced is Unseal for a whole pieced object whose header PeekInfo
// accepted: every piece is checked before the chunk is appended.
func unsealPieced(dst, obj []byte, info Info) ([]byte, Info, error) {
	var p Pieces
	if err := PeekPieces(obj, &p); err != nil {
		return dst, Info{}, err
	}
	data := obj[PiecedHeaderSize:]
	for i := range p.Count {
		if !p.Check(i, data[i*p.PieceLen():min((i+1)*p.PieceLen(), len(data))]) {
			return dst, Info{}, fmt.Errorf("%w: piece %d checksum", ErrCorrupt, i)
		}
	}
	return append(dst, data...), info, nil
}
