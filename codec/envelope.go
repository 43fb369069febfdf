package codec

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/zeebo/xxh3"

	"kvtier/kvformat"
)

// HeaderSize is the size of the header that starts every sealed object.
//
// Object format, version 1, all integers little-endian:
//
//	offset size field
//	     0    4 magic "KVTC"
//	     4    1 version (1)
//	     5    1 codec ID
//	     6    2 reserved, zero
//	     8   32 kvformat spec header (kvformat.HeaderSize bytes, own CRC),
//	            or 32 zero bytes for an opaque object (see below)
//	    40    4 raw length: bytes of the decoded chunk, uint32
//	    44    4 payload length: bytes after the header, uint32
//	    48    8 xxh3-64 of the payload
//	    56    8 xxh3-64 of header bytes 0..55
//	    64    - payload, as the codec encoded it
//
// The header is 64 bytes so that a payload read into aligned memory stays
// aligned. Lengths are 32-bit because MaxRawLen is 1 GiB; a format that
// needs more is a new version. A reader learns everything, including how
// many bytes to fetch and to allocate, from the first HeaderSize bytes
// (PeekInfo). Readers reject versions, codec IDs and reserved bytes they do
// not know as foreign, so a later version can give them a meaning; they
// check the header checksum before believing any length, and the payload
// checksum before decoding.
//
// An opaque object carries no spec: its spec bytes are zero and its codec
// is lossless. Stores use it for chunks whose layout the writer does not
// know (a scope registered without a full format tag, or a chunk relayed
// by another daemon); the bytes still get the codec, lengths and
// checksums, only not the description.
const HeaderSize = 64

const (
	magic           = "KVTC"
	formatVersion   = 1
	specOffset      = 8
	rawLenOffset    = specOffset + kvformat.HeaderSize
	payloadLenOff   = rawLenOffset + 4
	payloadSumOff   = payloadLenOff + 4
	headerSumOffset = payloadSumOff + 8
)

// The layout above assumes a 32-byte kvformat header; this fails to
// compile if that ever changes.
var _ = [1]struct{}{}[kvformat.HeaderSize-32]

// Info is what an object header says.
type Info struct {
	Codec      Codec
	Spec       kvformat.Spec
	RawLen     int  // bytes of the decoded chunk
	PayloadLen int  // bytes of encoded payload after the header
	Pieced     bool // format version 2: raw, with a checksum per piece (pieces.go)
}

// ObjectLen is the length of the whole sealed object.
func (i Info) ObjectLen() int { return HeaderSize + i.PayloadLen }

// Opaque reports whether the object carries no spec.
func (i Info) Opaque() bool { return i.Spec == kvformat.Spec{} }

// Tokens is the number of tokens in the decoded chunk, 0 for an opaque
// object.
func (i Info) Tokens() int {
	if i.Opaque() {
		return 0
	}
	return i.RawLen / i.Spec.BytesPerToken()
}

// Seal appends a sealed object holding chunk, encoded with c, to dst and
// returns the extended slice. chunk must be a whole chunk of spec: between
// 1 and spec.ChunkTokens tokens. On error dst is returned unchanged (its
// spare capacity may have been written).
func Seal(dst []byte, c Codec, spec kvformat.Spec, chunk []byte) ([]byte, error) {
	opaque := spec == kvformat.Spec{}
	switch {
	case opaque && !c.Lossless():
		return dst, fmt.Errorf("%w: %s needs the chunk's spec; an opaque object takes a lossless codec", ErrUnsupported, c.Name())
	case !opaque:
		if _, err := spec.TokensIn(len(chunk)); err != nil {
			return dst, fmt.Errorf("codec: seal: %w", err)
		}
	}
	if len(chunk) > MaxRawLen {
		return dst, fmt.Errorf("%w: chunk of %d bytes exceeds MaxRawLen %d", ErrUnsupported, len(chunk), MaxRawLen)
	}
	var h [HeaderSize]byte
	copy(h[:], magic)
	h[4] = formatVersion
	h[5] = byte(c.ID())
	if !opaque {
		if _, err := spec.AppendBinary(h[specOffset:specOffset]); err != nil {
			return dst, fmt.Errorf("codec: seal: %w", err)
		}
	}

	start := len(dst)
	out, err := c.Encode(append(dst, h[:]...), spec, chunk)
	if err != nil {
		return dst, fmt.Errorf("codec: seal with %s: %w", c.Name(), err)
	}
	payload := out[start+HeaderSize:]
	if uint64(len(payload)) > math.MaxUint32 {
		return dst, fmt.Errorf("%w: %s payload of %d bytes does not fit the header", ErrUnsupported, c.Name(), len(payload))
	}
	hdr := out[start : start+HeaderSize]
	binary.LittleEndian.PutUint32(hdr[rawLenOffset:], uint32(len(chunk)))
	binary.LittleEndian.PutUint32(hdr[payloadLenOff:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(hdr[payloadSumOff:], xxh3.Hash(payload))
	binary.LittleEndian.PutUint64(hdr[headerSumOffset:], xxh3.Hash(hdr[:headerSumOffset]))
	return out, nil
}

// PeekInfo parses and checks the header at the start of obj, which needs
// to hold only the first HeaderSize bytes of an object. It does not look at
// the payload.
func PeekInfo(obj []byte) (Info, error) {
	if len(obj) < len(magic) || !bytes.Equal(obj[:len(magic)], []byte(magic)) {
		return Info{}, fmt.Errorf("%w: no %q magic", ErrForeign, magic)
	}
	if len(obj) < HeaderSize {
		return Info{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrCorrupt, len(obj), HeaderSize)
	}
	h := obj[:HeaderSize]
	if h[4] != formatVersion && h[4] != piecedVersion {
		return Info{}, fmt.Errorf("%w: format version %d, this build reads %d and %d", ErrForeign, h[4], formatVersion, piecedVersion)
	}
	if got, want := binary.LittleEndian.Uint64(h[headerSumOffset:]), xxh3.Hash(h[:headerSumOffset]); got != want {
		return Info{}, fmt.Errorf("%w: header checksum %016x, computed %016x", ErrCorrupt, got, want)
	}
	c, err := ByID(ID(h[5]))
	if err != nil {
		return Info{}, err
	}
	if h[6] != 0 || h[7] != 0 {
		return Info{}, fmt.Errorf("%w: reserved header bytes %#x %#x are not zero", ErrForeign, h[6], h[7])
	}
	var spec kvformat.Spec
	opaque := bytes.Count(h[specOffset:rawLenOffset], []byte{0}) == kvformat.HeaderSize
	if opaque && !c.Lossless() {
		return Info{}, fmt.Errorf("%w: opaque object with lossy codec %s", ErrCorrupt, c.Name())
	}
	if !opaque {
		if err := spec.UnmarshalBinary(h[specOffset:rawLenOffset]); err != nil {
			// The header checksum held, so the writer meant these bytes:
			// a spec we cannot read comes from another kvformat version.
			return Info{}, fmt.Errorf("%w: %w", ErrForeign, err)
		}
	}
	info := Info{
		Codec:      c,
		Spec:       spec,
		RawLen:     int(binary.LittleEndian.Uint32(h[rawLenOffset:])),
		PayloadLen: int(binary.LittleEndian.Uint32(h[payloadLenOff:])),
		Pieced:     h[4] == piecedVersion,
	}
	if info.Pieced && (c.ID() != IDRaw || info.PayloadLen != PieceTableSize+info.RawLen) {
		return Info{}, fmt.Errorf("%w: pieced object with codec %s, payload %d for %d raw bytes", ErrCorrupt, c.Name(), info.PayloadLen, info.RawLen)
	}
	if info.RawLen > MaxRawLen {
		return Info{}, fmt.Errorf("%w: raw length %d exceeds MaxRawLen %d", ErrCorrupt, info.RawLen, MaxRawLen)
	}
	if !opaque {
		if _, err := spec.TokensIn(info.RawLen); err != nil {
			return Info{}, fmt.Errorf("%w: raw length: %w", ErrCorrupt, err)
		}
	}
	return info, nil
}

// Unseal checks obj, a whole sealed object, and appends the chunk it holds
// to dst. dst need not be pre-sized: pass buf[:0] to reuse buf, and when
// cap(dst)-len(dst) >= Info.RawLen nothing is allocated (decoding straight
// into a preallocated slot works the same way). Otherwise dst grows by
// exactly RawLen, which PeekInfo bounds by MaxRawLen before any allocation.
//
// Every failure wraps ErrCorrupt or ErrForeign and returns dst unchanged
// (its spare capacity may have been written); the chunk is appended only if
// every check passed.
func Unseal(dst []byte, obj []byte) ([]byte, Info, error) {
	info, err := PeekInfo(obj)
	if err != nil {
		return dst, Info{}, err
	}
	if len(obj) != info.ObjectLen() {
		return dst, Info{}, fmt.Errorf("%w: object is %d bytes, header says %d", ErrCorrupt, len(obj), info.ObjectLen())
	}
	if info.Pieced {
		return unsealPieced(dst, obj, info)
	}
	payload := obj[HeaderSize:]
	if got, want := binary.LittleEndian.Uint64(obj[payloadSumOff:]), xxh3.Hash(payload); got != want {
		return dst, Info{}, fmt.Errorf("%w: payload checksum %016x, computed %016x", ErrCorrupt, got, want)
	}
	out, err := info.Codec.Decode(dst, info.Spec, payload, info.RawLen)
	if err != nil {
		return dst, Info{}, fmt.Errorf("%w: %s payload: %w", ErrCorrupt, info.Codec.Name(), err)
	}
	return out, info, nil
}
