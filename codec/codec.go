package codec

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"kvtier/kvformat"
)

// MaxRawLen bounds the decoded size of one object. Decoders never produce
// (or allocate for) more, whatever a header claims. Real chunks are tens of
// MiB; a 256-token chunk of a 405B model is about 130 MiB.
const MaxRawLen = 1 << 30

// Errors returned by this package, always wrapped with details; match them
// with errors.Is.
var (
	// ErrCorrupt means bytes that claim to be ours do not check out:
	// a checksum, a length or a payload is wrong.
	ErrCorrupt = errors.New("codec: corrupt object")
	// ErrForeign means bytes that are not a kvtier object, or one written
	// in a format version or with a codec this build does not know.
	ErrForeign = errors.New("codec: foreign object")
	// ErrUnsupported means a codec cannot encode this input, such as a
	// lossy codec given a dtype other than float16 or bfloat16.
	ErrUnsupported = errors.New("codec: unsupported input")
	// ErrUnknownCodec means no codec has the requested name.
	ErrUnknownCodec = errors.New("codec: unknown codec")
)

// ID identifies a codec inside an object header. The values are part of the
// stored format: never renumber them. Zero is invalid.
type ID uint8

// Codec IDs.
const (
	IDRaw  ID = 1
	IDZstd ID = 2
	IDLZ4  ID = 3
	IDFP8  ID = 4
	IDInt8 ID = 5
)

// Codec encodes and decodes the bytes of one chunk. Implementations are
// safe for concurrent use.
//
// Both methods append to dst and return the extended slice, like
// strconv.AppendInt; when dst has room for the result they do not allocate.
type Codec interface {
	// Name is the name Lookup accepts ("zstd").
	Name() string
	// ID is the byte that names the codec in an object header.
	ID() ID
	// Lossless reports whether Decode returns exactly the encoded bytes.
	Lossless() bool
	// Encode appends the encoding of chunk, a chunk of spec, to dst.
	Encode(dst []byte, spec kvformat.Spec, chunk []byte) ([]byte, error)
	// Decode appends the rawLen bytes that payload encodes to dst. It
	// never writes more than rawLen bytes past len(dst), fails with an
	// error wrapping ErrCorrupt unless payload decodes to exactly rawLen
	// bytes, and refuses rawLen above MaxRawLen.
	Decode(dst []byte, spec kvformat.Spec, payload []byte, rawLen int) ([]byte, error)
}

// codecs is the registry, indexed by ID. It is fixed at compile time
// because an ID written into a stored object must mean the same codec in
// every build that reads it.
var codecs = [...]Codec{
	IDRaw:  raw{},
	IDZstd: zstdCodec{},
	IDLZ4:  lz4Codec{},
	IDFP8:  quantizer{id: IDFP8, name: "fp8", scheme: e4m3Scheme},
	IDInt8: quantizer{id: IDInt8, name: "int8", scheme: int8Scheme},
}

// Lookup returns the codec with the given name, ignoring case.
func Lookup(name string) (Codec, error) {
	for _, c := range codecs {
		if c != nil && strings.EqualFold(c.Name(), name) {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w %q (have %s)", ErrUnknownCodec, name, strings.Join(Names(), ", "))
}

// ByID returns the codec with the given header ID. An unknown ID is
// ErrForeign: the object was written by a build that knows more codecs.
func ByID(id ID) (Codec, error) {
	if int(id) < len(codecs) && codecs[id] != nil {
		return codecs[id], nil
	}
	return nil, fmt.Errorf("%w: codec id %d", ErrForeign, id)
}

// Names lists every codec name in ID order.
func Names() []string {
	var names []string
	for _, c := range codecs {
		if c != nil {
			names = append(names, c.Name())
		}
	}
	return names
}

// checkRawLen is the first thing every Decode does, so that no decoder
// sizes anything from an unchecked length.
func checkRawLen(rawLen int) error {
	if rawLen < 0 || rawLen > MaxRawLen {
		return fmt.Errorf("%w: raw length %d outside [0, %d]", ErrCorrupt, rawLen, MaxRawLen)
	}
	return nil
}

// grow returns dst with room for n more bytes and the n-byte window after
// len(dst), capped so that a decoder writing through it can never reach
// memory past the window.
func grow(dst []byte, n int) (out, window []byte) {
	out = slices.Grow(dst, n)[:len(dst)+n]
	return out, out[len(dst):len(out):len(out)]
}
