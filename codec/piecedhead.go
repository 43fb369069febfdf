package codec

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"

	"kvtier/kvformat"
)

// AppendPiecedHeader appends the PiecedHeaderSize bytes that start a
// pieced object (format version 2, pieces.go) of a raw chunk of rawLen
// bytes whose pieces have the checksums sums (xxh3-64 of each piece, in
// order). A writer that sends the chunk's pieces to the store one at a
// time (per-layer saves into Redis) builds the header from the sums it
// took as they went, and writes it last. spec is as for SealPieced; the
// caller has checked that rawLen suits it.
func AppendPiecedHeader(dst []byte, spec kvformat.Spec, rawLen int, sums []uint64) ([]byte, error) {
	if rawLen < 0 || rawLen > MaxRawLen {
		return dst, fmt.Errorf("%w: pieced chunk of %d bytes (0 to MaxRawLen %d)", ErrUnsupported, rawLen, MaxRawLen)
	}
	shift := PieceShift(rawLen)
	m := (rawLen + 1<<shift - 1) >> shift
	if len(sums) != m {
		return dst, fmt.Errorf("%w: %d piece checksums for %d pieces", ErrUnsupported, len(sums), m)
	}
	start := len(dst)
	dst = append(dst, make([]byte, PiecedHeaderSize)...)
	h, table := dst[start:start+HeaderSize], dst[start+HeaderSize:start+PiecedHeaderSize]
	copy(h, magic)
	h[4], h[5] = piecedVersion, byte(IDRaw)
	if spec != (kvformat.Spec{}) {
		if _, err := spec.AppendBinary(h[specOffset:specOffset]); err != nil {
			return dst[:start], fmt.Errorf("codec: seal: %w", err)
		}
	}
	binary.LittleEndian.PutUint32(table[0:], uint32(shift))
	binary.LittleEndian.PutUint32(table[4:], uint32(m))
	for i, sum := range sums {
		binary.LittleEndian.PutUint64(table[8+8*i:], sum)
	}
	binary.LittleEndian.PutUint32(h[rawLenOffset:], uint32(rawLen))
	binary.LittleEndian.PutUint32(h[payloadLenOff:], uint32(PieceTableSize+rawLen))
	binary.LittleEndian.PutUint64(h[payloadSumOff:], xxh3.Hash(table))
	binary.LittleEndian.PutUint64(h[headerSumOffset:], xxh3.Hash(h[:headerSumOffset]))
	return dst, nil
}
