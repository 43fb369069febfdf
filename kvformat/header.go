package kvformat

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// HeaderSize is the size of a marshaled Spec.
//
// Header format, version 1, all integers little-endian:
//
//	offset size field
//	     0    4 magic "KVFM"
//	     4    1 version (1)
//	     5    1 DType (its numeric value)
//	     6    1 Layout (LMCache's MemoryFormat value)
//	     7    1 reserved, zero
//	     8    4 Layers       uint32
//	    12    4 KVHeads      uint32
//	    16    4 HeadDim      uint32
//	    20    4 ChunkTokens  uint32
//	    24    4 reserved, zero
//	    28    4 CRC-32C (Castagnoli) of bytes 0..27
//
// The header describes the format, not one object: an object's token count
// is its length divided by Spec.BytesPerToken (see Spec.TokensIn). Readers
// reject versions they do not know, and reserved bytes that are not zero,
// so a later version can give those bytes a meaning.
const HeaderSize = 32

const (
	headerMagic   = "KVFM"
	headerVersion = 1
	crcOffset     = HeaderSize - 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendBinary implements encoding.BinaryAppender: it appends the
// HeaderSize-byte header of a valid spec to b.
func (s Spec) AppendBinary(b []byte) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return b, err
	}
	var h [HeaderSize]byte
	copy(h[0:4], headerMagic)
	h[4] = headerVersion
	h[5] = byte(s.DType)
	h[6] = byte(s.Layout)
	binary.LittleEndian.PutUint32(h[8:], uint32(s.Layers))
	binary.LittleEndian.PutUint32(h[12:], uint32(s.KVHeads))
	binary.LittleEndian.PutUint32(h[16:], uint32(s.HeadDim))
	binary.LittleEndian.PutUint32(h[20:], uint32(s.ChunkTokens))
	binary.LittleEndian.PutUint32(h[crcOffset:], crc32.Checksum(h[:crcOffset], castagnoli))
	return append(b, h[:]...), nil
}

// MarshalBinary implements encoding.BinaryMarshaler.
func (s Spec) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, HeaderSize))
}

// UnmarshalBinary implements encoding.BinaryUnmarshaler. data must be
// exactly one header; the decoded spec must pass Validate. On error s is
// left unchanged.
func (s *Spec) UnmarshalBinary(data []byte) error {
	if len(data) != HeaderSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrHeader, len(data), HeaderSize)
	}
	if !bytes.Equal(data[0:4], []byte(headerMagic)) {
		return fmt.Errorf("%w: magic %q, want %q", ErrHeader, data[0:4], headerMagic)
	}
	if data[4] != headerVersion {
		return fmt.Errorf("%w: version %d, this build reads %d", ErrHeader, data[4], headerVersion)
	}
	if want, got := crc32.Checksum(data[:crcOffset], castagnoli), binary.LittleEndian.Uint32(data[crcOffset:]); got != want {
		return fmt.Errorf("%w: checksum %08x, computed %08x", ErrHeader, got, want)
	}
	if data[7] != 0 || binary.LittleEndian.Uint32(data[24:]) != 0 {
		return fmt.Errorf("%w: reserved bytes are not zero", ErrHeader)
	}
	spec := Spec{
		DType:       DType(data[5]),
		Layout:      Layout(data[6]),
		Layers:      int(binary.LittleEndian.Uint32(data[8:])),
		KVHeads:     int(binary.LittleEndian.Uint32(data[12:])),
		HeadDim:     int(binary.LittleEndian.Uint32(data[16:])),
		ChunkTokens: int(binary.LittleEndian.Uint32(data[20:])),
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrHeader, err)
	}
	*s = spec
	return nil
}
