package disk

import (
	"bytes"
	"encoding/binary"
	"errors"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
)

// FORMAT
//
// A tier directory holds:
//
//	LOCK                   empty; flock'ed exclusively by the process that has the tier open
//	<16 hex digits>.seg    segment files, named by a segment number that only grows
//	CHECKPOINT             a copy of the index, so that Open need not read every
//	                       header block (CHECKPOINT FORMAT in checkpoint.go);
//	                       optional: without it Open scans every segment
//	CHECKPOINT.tmp         a checkpoint being written; deleted by Open
//
// A segment is a run of records, each starting at a multiple of 4096 bytes:
//
//	+---------------------+----------------------+----------------------+
//	| header block (4096) | payload (n bytes)    | zeros up to 4096 mod |
//	+---------------------+----------------------+----------------------+
//
// so a record takes 4096 + roundup(n, 4096) bytes on disk, and every part of
// it can be moved with O_DIRECT. The header block is little-endian. Version 2,
// which every Put writes, checksums the payload in pieces so that any range
// of it can be read and verified on its own (a layer of a chunk, see
// docs/layerwise.md):
//
//	offset size field
//	     0    4 magic "KVTD"
//	     4    2 format version (2)
//	     6    2 reserved, zero
//	     8    8 number of the segment the record was written to
//	    16    8 byte offset of the record within that segment
//	    24    8 key scope (chunk.Key.Scope)
//	    32   16 key hash (chunk.Key.Hash)
//	    48    8 payload length n
//	    56    4 piece shift s: pieces are P = 1<<s bytes, 12 <= s <= 40
//	    60    4 piece count m = ceil(n / P), at most 256
//	    64    8 xxh3-64 of bytes 0..63 followed by bytes 72..72+8m
//	    72   8m xxh3-64 of each piece: bytes [i*P, min((i+1)*P, n)) of the payload
//	 72+8m    . zero up to 4096
//
// P is the smallest power of two of at least 4096 bytes that cuts the payload
// into at most 256 pieces: a 32 MiB chunk has 256 pieces of 128 KiB. Pieces
// are block aligned, so a range read is one O_DIRECT transfer of the pieces
// it covers; a power of two makes each layer of a KV_2LTD chunk whose size
// is a power of two start on a piece boundary.
//
// Version 3 is version 2 for a record whose parent in its prefix chain is
// known (PutAfter, a range write committed with a parent): the parent's key
// hash follows the piece checksums, and the header checksum covers it too.
// The parent has the record's key scope. Recovery hands it to a prefix-aware
// eviction policy, so that after a restart chains are not all roots:
//
//	 72+8m   16 the parent's key hash (version 3 only)
//	 88+8m    . zero up to 4096
//
// A record without a known parent is written as version 2, so a directory
// holds both. Builds older than version 3 take such a header for a damaged
// block and skip its record: going back to one loses those records.
//
// Version 1 records, written before pieces existed, stay readable: they have
// one checksum for the whole payload and are verified (and range-read) as a
// single piece.
//
//	offset size field (version 1)
//	     0   56 as in version 2, version 1
//	    56    8 xxh3-64 of the payload
//	    64    8 xxh3-64 of bytes 0..63
//	    72 4024 zero
//
// The segment number and offset make a header valid in exactly one place, so
// the image of a record that sits inside another record's payload, or a block
// written to the wrong place, is never taken for a record.
//
// A record's payload is written first and its header block after it, so
// after a process crash a valid header always has its payload behind it (a
// power failure may reorder unsynced writes: the payload checksum catches
// that), and a crash in between leaves a hole where the header belongs.
//
// Removed and evicted records are never rewritten: their byte range is
// punched out (fallocate PUNCH_HOLE), which gives the space back to the file
// system and makes the range read as zeros. A scan that meets an all-zero
// header block skips ahead with lseek(SEEK_DATA); one that meets any other
// invalid block looks for the next valid header block by block. There are no
// tombstones: every punch is fsync'ed, and a Remove waits for the punches of
// all copies of its key, including older copies still being evicted.

const (
	blockSize  = 4096
	headerLen  = 72 // bytes before the piece checksums; all of a version 1 header
	version    = 2  // what encode writes unless told to write version 1, or the record names a parent
	version1   = 1
	version3   = 3       // version 2 and the parent's key hash
	maxPayload = 1 << 40 // far above any chunk; keeps offset arithmetic from overflowing
	maxPieces  = 256     // piece checksums in a version 2 header
	minShift   = 12      // smallest piece: one block
	maxShift   = 40      // maxPayload in one piece
)

var magic = [4]byte{'K', 'V', 'T', 'D'}

// zeroBlock is compared against, never written.
var zeroBlock [blockSize]byte

// Reasons a header block is rejected. They stay internal: callers turn them
// into tier.ErrCorrupt or into a skipped block during a scan.
var (
	errShortHeader = errors.New("header block shorter than 4096 bytes")
	errMagic       = errors.New("header magic mismatch")
	errVersion     = errors.New("unsupported record format version")
	errHeaderSum   = errors.New("header checksum mismatch")
	errHeaderField = errors.New("header field out of range")
	errPayloadSum  = errors.New("payload checksum mismatch")
	errMisplaced   = errors.New("header does not match the index entry")
)

// header describes one record. A version 2 header carries one checksum per
// piece; a version 1 header one checksum of the whole payload, in sum.
type header struct {
	seg     uint64            // segment number the record lives in
	off     int64             // offset of the header block within the segment
	key     chunk.Key         // the record's key
	size    int64             // payload length in bytes
	version uint16            // 0 means the current version
	sum     uint64            // version 1: xxh3-64 of the payload
	sums    [maxPieces]uint64 // version 2: xxh3-64 of each piece; pieceShift(size) sets their length
	up      chunk.Hash        // the parent's key hash when hasUp (version 3; scope: key's)
	hasUp   bool
}

// setParent records up as the record's parent, for a version 3 header.
// A parent of another scope is not recorded: it fits no header.
func (h *header) setParent(up parent) {
	h.hasUp = up.ok && up.key.Scope == h.key.Scope
	h.up = up.key.Hash
	if !h.hasUp {
		h.up = chunk.Hash{}
	}
}

// parent returns the record's parent, when its header names one.
func (h *header) parent() parent {
	return parent{key: chunk.Key{Scope: h.key.Scope, Hash: h.up}, ok: h.hasUp}
}

// pieceShift returns the piece shift version 2 uses for an n-byte payload.
func pieceShift(n int64) uint8 {
	s := uint8(minShift)
	for s < maxShift && n > int64(maxPieces)<<s {
		s++
	}
	return s
}

// pieceLen is the length of a piece: the whole payload in version 1.
func (h *header) pieceLen() int64 {
	if h.version == version1 {
		return max(h.size, 1)
	}
	return 1 << pieceShift(h.size)
}

// pieces is how many pieces the payload has.
func (h *header) pieces() int {
	return int((h.size + h.pieceLen() - 1) / h.pieceLen())
}

// pieceSum is the checksum piece i must have.
func (h *header) pieceSum(i int) uint64 {
	if h.version == version1 {
		return h.sum
	}
	return h.sums[i]
}

// setSums sets the version 2 piece checksums of payload into h.
func (h *header) setSums(payload []byte) {
	h.version = 0
	p := 1 << pieceShift(int64(len(payload)))
	for i := 0; i*p < len(payload); i++ {
		h.sums[i] = xxh3.Hash(payload[i*p : min((i+1)*p, len(payload))])
	}
}

// recordSize is the number of bytes a record with an n-byte payload takes on disk.
func recordSize(n int64) int64 { return blockSize + alignUp(n) }

func alignUp(n int64) int64 { return (n + blockSize - 1) &^ (blockSize - 1) }

// encode writes h into block, which must be blockSize long: version 1 when
// h.version says so, else version 2.
func (h *header) encode(block []byte) {
	_ = block[blockSize-1]
	v := uint16(version)
	switch {
	case h.version == version1:
		v = version1
	case h.hasUp:
		v = version3
	}
	copy(block[0:4], magic[:])
	binary.LittleEndian.PutUint16(block[4:], v)
	binary.LittleEndian.PutUint16(block[6:], 0)
	binary.LittleEndian.PutUint64(block[8:], h.seg)
	binary.LittleEndian.PutUint64(block[16:], uint64(h.off))
	binary.LittleEndian.PutUint64(block[24:], h.key.Scope)
	copy(block[32:48], h.key.Hash[:])
	binary.LittleEndian.PutUint64(block[48:], uint64(h.size))
	end := headerLen
	if v == version1 {
		binary.LittleEndian.PutUint64(block[56:], h.sum)
	} else {
		m := h.pieces()
		binary.LittleEndian.PutUint32(block[56:], uint32(pieceShift(h.size)))
		binary.LittleEndian.PutUint32(block[60:], uint32(m))
		for i := range m {
			binary.LittleEndian.PutUint64(block[headerLen+8*i:], h.sums[i])
		}
		end += 8 * m
		if v == version3 {
			end += copy(block[end:], h.up[:])
		}
	}
	clear(block[end:blockSize])
	binary.LittleEndian.PutUint64(block[64:], headerSum(block, v, end))
}

// headerSum is the header checksum: of bytes 0..63, and in version 2 also
// of the piece checksums, bytes 72..end.
func headerSum(block []byte, v uint16, end int) uint64 {
	if v == version1 {
		return xxh3.Hash(block[:64])
	}
	var d xxh3.Hasher
	d.Write(block[:64])
	d.Write(block[headerLen:end])
	return d.Sum64()
}

// decodeHeader parses a header block of either version. It checks
// everything the block alone can tell: magic, version, the reserved areas,
// the header checksum and the ranges of offset, length and pieces. It never
// panics on any input.
func decodeHeader(block []byte) (header, error) {
	if len(block) < blockSize {
		return header{}, errShortHeader
	}
	if !bytes.Equal(block[0:4], magic[:]) {
		return header{}, errMagic
	}
	v := binary.LittleEndian.Uint16(block[4:])
	if v != version && v != version1 && v != version3 {
		return header{}, errVersion
	}
	h := header{
		seg:     binary.LittleEndian.Uint64(block[8:]),
		off:     int64(binary.LittleEndian.Uint64(block[16:])),
		size:    int64(binary.LittleEndian.Uint64(block[48:])),
		version: v,
	}
	end := headerLen
	if v == version1 {
		h.sum = binary.LittleEndian.Uint64(block[56:])
	} else {
		shift := binary.LittleEndian.Uint32(block[56:])
		m := binary.LittleEndian.Uint32(block[60:])
		if shift < minShift || shift > maxShift || m > maxPieces {
			return header{}, errHeaderField
		}
		end += 8 * int(m)
		for i := range int(m) {
			h.sums[i] = binary.LittleEndian.Uint64(block[headerLen+8*i:])
		}
		if v == version3 {
			end += copy(h.up[:], block[end:])
			h.hasUp = true
		}
		if h.size < 0 || h.size > maxPayload || shift != uint32(pieceShift(h.size)) || int(m) != h.pieces() {
			return header{}, errHeaderField
		}
	}
	if binary.LittleEndian.Uint64(block[64:]) != headerSum(block, v, end) {
		return header{}, errHeaderSum
	}
	if binary.LittleEndian.Uint16(block[6:]) != 0 || !isZero(block[end:blockSize]) {
		return header{}, errHeaderField
	}
	h.key.Scope = binary.LittleEndian.Uint64(block[24:])
	copy(h.key.Hash[:], block[32:48])
	if h.off < 0 || h.off%blockSize != 0 || h.off > maxPayload || h.size < 0 || h.size > maxPayload {
		return header{}, errHeaderField
	}
	if v == version || v == version3 {
		h.version = 0 // the current versions read as the zero value, as encode takes it
	}
	return h, nil
}

// isZero reports whether b (at most one block) is all zero bytes.
func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }
