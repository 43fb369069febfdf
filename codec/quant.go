package codec

import (
	"encoding/binary"
	"fmt"
	"math"

	"kvtier/kvformat"
)

// Quantized payload format (codecs fp8 and int8).
//
// A chunk of a float16 or bfloat16 spec is, in every layout, a sequence of
// rows of kv_heads*head_dim elements, each row head-major. So it is also a
// sequence of N = len(chunk)/(2*head_dim) head vectors of head_dim
// elements, in chunk order. For each head vector the encoder takes its
// largest magnitude m, stores scale = m/qmax and the elements as 8-bit codes
// of x/scale:
//
//	offset  size          field
//	     0  4*N           scale of head vector i at 4*i, float32 little-endian
//	   4*N  N*head_dim    code of element j of head vector i at 4*N + i*head_dim + j
//
// int8 codes are two's complement integers in [-127, 127] (qmax 127; -128
// is never written, so the code range is symmetric). fp8 codes are
// float8_e4m3fn (qmax 448). Decoding multiplies code by scale in float32
// and rounds to the original dtype. A decoder rejects scales that are
// negative, not finite, or so large that a code could decode past the
// dtype's largest finite value, and fp8 NaN codes: the encoder writes none
// of these, so seeing one means the payload is corrupt.
type quantizer struct {
	id     ID
	name   string
	scheme scheme
}

// scheme is one 8-bit code: its largest magnitude and its code values.
type scheme struct {
	qmax  float64
	fp8   bool         // e4m3 codes rather than int8
	value [256]float32 // value of each code
}

var (
	int8Scheme = scheme{qmax: 127, value: func() (t [256]float32) {
		for c := range t {
			t[c] = float32(int8(c))
		}
		return t
	}()}
	e4m3Scheme = scheme{qmax: maxE4M3, fp8: true, value: e4m3Table}
)

func (q quantizer) Name() string   { return q.name }
func (q quantizer) ID() ID         { return q.id }
func (q quantizer) Lossless() bool { return false }

// headScratch is how many float32s of a head vector live on the stack
// while it is quantized; wider heads (none exist today) take one
// allocation per Encode.
const headScratch = 1024

func (q quantizer) Encode(dst []byte, spec kvformat.Spec, chunk []byte) ([]byte, error) {
	heads, err := q.headVectors(spec, len(chunk))
	if err != nil {
		return dst, err
	}
	dim := spec.HeadDim
	out, window := grow(dst, heads*(4+dim))
	scales, codes := window[:4*heads], window[4*heads:]

	var stack [headScratch]float32
	vals := stack[:]
	if dim > len(vals) {
		vals = make([]float32, dim)
	}
	vals = vals[:dim]
	var f16 *[1 << 16]float32
	if spec.DType == kvformat.Float16 {
		f16 = f16Table()
	}
	for i := range heads {
		src := chunk[i*2*dim : (i+1)*2*dim]
		var mBits uint16
		var m float32
		if f16 != nil {
			mBits = loadF16(vals, src, f16)
			m = f16[mBits]
		} else {
			mBits = loadBF16(vals, src)
			m = bf16ToF32(mBits)
		}
		if !(m <= math.MaxFloat32) { // infinity or NaN
			return dst, fmt.Errorf("%w: %s cannot encode non-finite values (head vector %d of %s chunk)",
				ErrUnsupported, q.name, i, spec.DType)
		}
		var inv float64
		if m > 0 {
			inv = q.scheme.qmax / float64(m)
		}
		binary.LittleEndian.PutUint32(scales[4*i:], math.Float32bits(float32(float64(m)/q.scheme.qmax)))
		if q.scheme.fp8 {
			quantizeE4M3(codes[i*dim:(i+1)*dim], vals, inv)
		} else {
			quantizeInt8(codes[i*dim:(i+1)*dim], vals, inv)
		}
	}
	return out, nil
}

func (q quantizer) Decode(dst []byte, spec kvformat.Spec, payload []byte, rawLen int) ([]byte, error) {
	if err := checkRawLen(rawLen); err != nil {
		return dst, err
	}
	heads, err := q.headVectors(spec, rawLen)
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	dim := spec.HeadDim
	if want := heads * (4 + dim); len(payload) != want {
		return dst, fmt.Errorf("%w: %s payload is %d bytes, want %d for %d raw bytes",
			ErrCorrupt, q.name, len(payload), want, rawLen)
	}
	scales, codes := payload[:4*heads], payload[4*heads:]
	maxOut := float64(maxF16)
	if spec.DType == kvformat.BFloat16 {
		maxOut = maxBF16
	}
	// A little slack over maxOut/qmax: the encoder rounds m/qmax to float32.
	maxScale := float32(maxOut / q.scheme.qmax * (1 + 0x1p-20))

	out, window := grow(dst, rawLen)
	for i := range heads {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*i:]))
		if !(scale >= 0 && scale <= maxScale) {
			return dst, fmt.Errorf("%w: %s scale %g of head vector %d", ErrCorrupt, q.name, scale, i)
		}
		hc, hw := codes[i*dim:(i+1)*dim], window[i*2*dim:(i+1)*2*dim]
		if q.scheme.fp8 && hasE4M3NaN(hc) {
			return dst, fmt.Errorf("%w: fp8 NaN code in head vector %d", ErrCorrupt, i)
		}
		if spec.DType == kvformat.Float16 {
			dequantF16(hw, hc, &q.scheme.value, scale)
		} else {
			dequantBF16(hw, hc, &q.scheme.value, scale)
		}
	}
	return out, nil
}

// headVectors checks that the codec can handle spec and an n-byte chunk,
// and returns how many head vectors the chunk holds.
func (q quantizer) headVectors(spec kvformat.Spec, n int) (int, error) {
	if err := spec.Validate(); err != nil {
		return 0, fmt.Errorf("codec %s: %w", q.name, err)
	}
	if spec.DType != kvformat.Float16 && spec.DType != kvformat.BFloat16 {
		return 0, fmt.Errorf("%w: %s quantizes float16 and bfloat16 KV, not %s", ErrUnsupported, q.name, spec.DType)
	}
	if row := spec.RowBytes(); n%row != 0 {
		return 0, fmt.Errorf("%w: %s chunk of %d bytes is not a whole number of %d-byte rows", ErrUnsupported, q.name, n, row)
	}
	return n / (2 * spec.HeadDim), nil
}

// loadF16 and loadBF16 convert a head vector to float32 and return the
// largest sign-less bit pattern in it. Float16 and bfloat16 magnitudes
// order like those patterns, so that is the pattern of the largest
// magnitude (or of infinity or NaN, if there is one), found on integers in
// the same pass. Both read four elements per 8-byte load and keep two
// maxima, because Go does not vectorize loops and this one is hot.
func loadF16(vals []float32, src []byte, table *[1 << 16]float32) uint16 {
	src = src[:2*len(vals)]
	var m0, m1 uint64
	j := 0
	for ; j+4 <= len(vals); j += 4 {
		w := binary.LittleEndian.Uint64(src[2*j:])
		a, b, c, d := w&0xffff, w>>16&0xffff, w>>32&0xffff, w>>48
		v := vals[j : j+4 : j+4]
		v[0], v[1], v[2], v[3] = table[a], table[b], table[c], table[d]
		m0 = max(m0, a&0x7fff, b&0x7fff)
		m1 = max(m1, c&0x7fff, d&0x7fff)
	}
	for ; j < len(vals); j++ {
		u := binary.LittleEndian.Uint16(src[2*j:])
		vals[j] = table[u]
		m0 = max(m0, uint64(u&0x7fff))
	}
	return uint16(max(m0, m1))
}

func loadBF16(vals []float32, src []byte) uint16 {
	src = src[:2*len(vals)]
	var m0, m1 uint64
	j := 0
	for ; j+4 <= len(vals); j += 4 {
		w := binary.LittleEndian.Uint64(src[2*j:])
		v := vals[j : j+4 : j+4]
		v[0] = math.Float32frombits(uint32(w) << 16)
		v[1] = math.Float32frombits(uint32(w) & 0xffff0000)
		v[2] = math.Float32frombits(uint32(w>>32) << 16)
		v[3] = math.Float32frombits(uint32(w>>32) & 0xffff0000)
		m0 = max(m0, w&0x7fff, w>>16&0x7fff)
		m1 = max(m1, w>>32&0x7fff, w>>48&0x7fff)
	}
	for ; j < len(vals); j++ {
		u := binary.LittleEndian.Uint16(src[2*j:])
		vals[j] = bf16ToF32(u)
		m0 = max(m0, uint64(u&0x7fff))
	}
	return uint16(max(m0, m1))
}

func quantizeInt8(codes []byte, vals []float32, inv float64) {
	codes = codes[:len(vals)]
	for j, v := range vals {
		// |v*inv| <= 127 up to rounding; the clamp covers the rounding.
		codes[j] = byte(int8(min(max(roundEven(float64(v)*inv), -127), 127)))
	}
}

func quantizeE4M3(codes []byte, vals []float32, inv float64) {
	codes = codes[:len(vals)]
	for j, v := range vals {
		codes[j] = toE4M3(float64(v) * inv)
	}
}

func hasE4M3NaN(codes []byte) bool {
	for _, c := range codes {
		if isE4M3NaN(c) {
			return true
		}
	}
	return false
}

func dequantF16(dst, codes []byte, value *[256]float32, scale float32) {
	dst = dst[:2*len(codes)]
	for j, c := range codes {
		binary.LittleEndian.PutUint16(dst[2*j:], f32ToF16(value[c]*scale))
	}
}

func dequantBF16(dst, codes []byte, value *[256]float32, scale float32) {
	dst = dst[:2*len(codes)]
	for j, c := range codes {
		binary.LittleEndian.PutUint16(dst[2*j:], f32ToBF16(value[c]*scale))
	}
}
