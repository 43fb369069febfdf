package codec

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"kvtier/kvformat"
)

// raw stores the chunk unchanged: the envelope still adds checksums and
// the spec.
type raw struct{}

func (raw) Name() string   { return "raw" }
func (raw) ID() ID         { return IDRaw }
func (raw) Lossless() bool { return true }

func (raw) Encode(dst []byte, _ kvformat.Spec, chunk []byte) ([]byte, error) {
	return append(dst, chunk...), nil
}

func (raw) Decode(dst []byte, _ kvformat.Spec, payload []byte, rawLen int) ([]byte, error) {
	if err := checkRawLen(rawLen); err != nil {
		return dst, err
	}
	if len(payload) != rawLen {
		return dst, fmt.Errorf("%w: raw payload is %d bytes, want %d", ErrCorrupt, len(payload), rawLen)
	}
	return append(dst, payload...), nil
}

// zstdCodec uses one shared encoder and decoder: klauspost's EncodeAll and
// DecodeAll are safe for concurrent use and keep a pool of per-goroutine
// state inside, so no call builds a coder.
type zstdCodec struct{}

type zstdCoders struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

var sharedZstd = sync.OnceValues(func() (zstdCoders, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderCRC(false), // the envelope checksums the payload
		zstd.WithZeroFrames(true),  // an empty chunk still makes a frame
	)
	if err != nil {
		return zstdCoders{}, fmt.Errorf("codec: zstd encoder: %w", err)
	}
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0), // GOMAXPROCS concurrent DecodeAll calls
		zstd.WithDecoderMaxMemory(MaxRawLen),
		// Never decode past cap(dst): Decode sets cap to rawLen, so a
		// hostile frame cannot make the decoder allocate.
		zstd.WithDecodeAllCapLimit(true),
		zstd.IgnoreChecksum(true),
	)
	if err != nil {
		return zstdCoders{}, fmt.Errorf("codec: zstd decoder: %w", err)
	}
	return zstdCoders{enc: enc, dec: dec}, nil
})

func (zstdCodec) Name() string   { return "zstd" }
func (zstdCodec) ID() ID         { return IDZstd }
func (zstdCodec) Lossless() bool { return true }

func (zstdCodec) Encode(dst []byte, spec kvformat.Spec, chunk []byte) ([]byte, error) {
	z, err := sharedZstd()
	if err != nil {
		return dst, err
	}
	if planeWidth(spec, len(chunk)) == 0 {
		return z.enc.EncodeAll(chunk, dst), nil
	}
	// Split payload: u32 length of the zstd frame of the high plane, the
	// frame, then the low plane as it is (it looks random: compressing it
	// would cost time and save nothing).
	bp := planeBuf(len(chunk))
	defer putPlaneBuf(bp)
	split(*bp, chunk)
	half := len(chunk) / 2
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = z.enc.EncodeAll((*bp)[half:], dst)
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return append(dst, (*bp)[:half]...), nil
}

func (zstdCodec) Decode(dst []byte, spec kvformat.Spec, payload []byte, rawLen int) ([]byte, error) {
	if err := checkRawLen(rawLen); err != nil {
		return dst, err
	}
	z, err := sharedZstd()
	if err != nil {
		return dst, err
	}
	out, window := grow(dst, rawLen)
	if planeWidth(spec, rawLen) == 0 {
		got, err := z.dec.DecodeAll(payload, window[:0])
		if err != nil {
			return dst, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
		}
		if len(got) != rawLen {
			return dst, fmt.Errorf("%w: zstd payload decodes to %d bytes, want %d", ErrCorrupt, len(got), rawLen)
		}
		return out, nil
	}
	half := rawLen / 2
	if len(payload) < 4 {
		return dst, fmt.Errorf("%w: split zstd payload of %d bytes", ErrCorrupt, len(payload))
	}
	frame := int(binary.LittleEndian.Uint32(payload))
	if frame > len(payload)-4 || len(payload)-4-frame != half {
		return dst, fmt.Errorf("%w: split zstd payload: frame of %d bytes and %d raw bytes for a %d-byte chunk", ErrCorrupt, frame, len(payload)-4-frame, rawLen)
	}
	bp := planeBuf(rawLen)
	defer putPlaneBuf(bp)
	planes := *bp
	got, err := z.dec.DecodeAll(payload[4:4+frame], planes[half:half])
	if err != nil {
		return dst, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
	}
	if len(got) != half {
		return dst, fmt.Errorf("%w: zstd high plane decodes to %d bytes, want %d", ErrCorrupt, len(got), half)
	}
	copy(planes[:half], payload[4+frame:])
	join(window, planes)
	return out, nil
}

// lz4Codec uses the LZ4 block format (no frame: the envelope already
// carries lengths and a checksum). A Compressor holds a hash table and is
// not safe for concurrent use, so idle ones wait in a pool.
type lz4Codec struct{}

var lz4Compressors = sync.Pool{New: func() any { return new(lz4.Compressor) }}

func (lz4Codec) Name() string   { return "lz4" }
func (lz4Codec) ID() ID         { return IDLZ4 }
func (lz4Codec) Lossless() bool { return true }

func (lz4Codec) Encode(dst []byte, _ kvformat.Spec, chunk []byte) ([]byte, error) {
	if len(chunk) == 0 {
		return dst, nil
	}
	out, window := grow(dst, lz4.CompressBlockBound(len(chunk)))
	c := lz4Compressors.Get().(*lz4.Compressor)
	n, err := c.CompressBlock(chunk, window)
	lz4Compressors.Put(c)
	// Neither can happen with a CompressBlockBound-sized window.
	if err != nil {
		return dst, fmt.Errorf("codec: lz4 compress %d bytes: %w", len(chunk), err)
	}
	if n == 0 {
		return dst, fmt.Errorf("codec: lz4 compress %d bytes: no output", len(chunk))
	}
	return out[:len(dst)+n], nil
}

func (lz4Codec) Decode(dst []byte, _ kvformat.Spec, payload []byte, rawLen int) ([]byte, error) {
	if err := checkRawLen(rawLen); err != nil {
		return dst, err
	}
	if rawLen == 0 || len(payload) == 0 {
		if rawLen == 0 && len(payload) == 0 {
			return dst, nil
		}
		return dst, fmt.Errorf("%w: lz4 payload of %d bytes for %d raw bytes", ErrCorrupt, len(payload), rawLen)
	}
	out, window := grow(dst, rawLen)
	n, err := lz4.UncompressBlock(payload, window)
	if err != nil {
		return dst, fmt.Errorf("%w: lz4: %w", ErrCorrupt, err)
	}
	if n != rawLen {
		return dst, fmt.Errorf("%w: lz4 payload decodes to %d bytes, want %d", ErrCorrupt, n, rawLen)
	}
	return out, nil
}
