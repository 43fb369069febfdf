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
// it can be moved with O_DIRECT. The header block is little-endian:
//
//	offset size field
//	     0    4 magic "KVTD"
//	     4    2 format version (1)
//	     6    2 reserved, zero
//	     8    8 number of the segment the record was written to
//	    16    8 byte offset of the record within that segment
//	    24    8 key scope (chunk.Key.Scope)
//	    32   16 key hash (chunk.Key.Hash)
//	    48    8 payload length n
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
	headerLen  = 72
	version    = 1
	maxPayload = 1 << 40 // far above any chunk; keeps offset arithmetic from overflowing
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

// header describes one record.
type header struct {
	seg  uint64    // segment number the record lives in
	off  int64     // offset of the header block within the segment
	key  chunk.Key // the record's key
	size int64     // payload length in bytes
	sum  uint64    // xxh3-64 of the payload
}

// recordSize is the number of bytes a record with an n-byte payload takes on disk.
func recordSize(n int64) int64 { return blockSize + alignUp(n) }

func alignUp(n int64) int64 { return (n + blockSize - 1) &^ (blockSize - 1) }

// encode writes h into block, which must be blockSize long.
func (h *header) encode(block []byte) {
	_ = block[blockSize-1]
	copy(block[0:4], magic[:])
	binary.LittleEndian.PutUint16(block[4:], version)
	binary.LittleEndian.PutUint16(block[6:], 0)
	binary.LittleEndian.PutUint64(block[8:], h.seg)
	binary.LittleEndian.PutUint64(block[16:], uint64(h.off))
	binary.LittleEndian.PutUint64(block[24:], h.key.Scope)
	copy(block[32:48], h.key.Hash[:])
	binary.LittleEndian.PutUint64(block[48:], uint64(h.size))
	binary.LittleEndian.PutUint64(block[56:], h.sum)
	binary.LittleEndian.PutUint64(block[64:], xxh3.Hash(block[:64]))
	clear(block[headerLen:blockSize])
}

// decodeHeader parses a header block. It checks everything the block alone
// can tell: magic, version, both reserved areas, the header checksum and the
// ranges of offset and length. It never panics on any input.
func decodeHeader(block []byte) (header, error) {
	if len(block) < blockSize {
		return header{}, errShortHeader
	}
	if !bytes.Equal(block[0:4], magic[:]) {
		return header{}, errMagic
	}
	if binary.LittleEndian.Uint16(block[4:]) != version {
		return header{}, errVersion
	}
	if binary.LittleEndian.Uint64(block[64:]) != xxh3.Hash(block[:64]) {
		return header{}, errHeaderSum
	}
	if binary.LittleEndian.Uint16(block[6:]) != 0 || !isZero(block[headerLen:blockSize]) {
		return header{}, errHeaderField
	}
	h := header{
		seg:  binary.LittleEndian.Uint64(block[8:]),
		off:  int64(binary.LittleEndian.Uint64(block[16:])),
		size: int64(binary.LittleEndian.Uint64(block[48:])),
		sum:  binary.LittleEndian.Uint64(block[56:]),
	}
	h.key.Scope = binary.LittleEndian.Uint64(block[24:])
	copy(h.key.Hash[:], block[32:48])
	if h.off < 0 || h.off%blockSize != 0 || h.off > maxPayload || h.size < 0 || h.size > maxPayload {
		return header{}, errHeaderField
	}
	return h, nil
}

// isZero reports whether b (at most one block) is all zero bytes.
func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }
