package codec

import (
	"math"
	"sync"

	"github.com/x448/float16"
)

// Conversions between the 16- and 8-bit float formats and float32. The
// 16-bit ones take little-endian bit patterns, the byte order of every
// chunk (see kvformat).

// f16Table maps every float16 bit pattern to its float32 value: one load
// instead of a dozen bit operations per element on the encode path.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = float16.Frombits(uint16(i)).Float32()
	}
	return &t
})

// f32ToF16 rounds to the nearest float16, ties to even; too large values
// become infinity and NaN stays NaN. It does what float16.Fromfloat32 does
// (the tests check that) with one well-predicted branch for the common
// normal case, because the lossy decoders call it for every element.
func f32ToF16(f float32) uint16 {
	x := math.Float32bits(f)
	sign := x >> 16 & 0x8000
	x &^= 0x80000000
	switch {
	case x >= 0x47800000: // 2^16 and up: infinity, or NaN stays NaN
		if x > 0x7f800000 {
			return uint16(sign | 0x7e00)
		}
		return uint16(sign | 0x7c00)
	case x < 0x38800000: // below 2^-14: float16 subnormal or zero
		// Adding 0.5 lines the float16 subnormal step up with float32's
		// last mantissa bit, so the FPU does the rounding.
		const half = 126 << 23
		y := math.Float32bits(math.Float32frombits(x)+math.Float32frombits(half)) - half
		return uint16(sign | y)
	default:
		// Rebias the exponent and round the 13 dropped bits to nearest
		// even; a carry into the exponent is the right answer, up to
		// infinity for values from 65520.
		odd := x >> 13 & 1
		x = x - (127-15)<<23 + 0xfff + odd
		return uint16(sign | x>>13)
	}
}

func bf16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// f32ToBF16 rounds a finite float32 to the nearest bfloat16, ties to even.
// (NaN needs care this function does not take; decoders never produce it.)
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Largest finite values of the 16-bit formats.
const (
	maxF16  = 65504
	maxBF16 = 0x1.fep127
)

// float8 e4m3 (torch.float8_e4m3fn): 1 sign bit, 4 exponent bits with bias
// 7, 3 mantissa bits, no infinities, and NaN only at S.1111.111. Its codes
// are ordered like its magnitudes, and a subnormal's code is its value in
// units of 2^-9, which the encoder below relies on.
const (
	maxE4M3    = 448
	e4m3MinNrm = 0x1p-6 // smallest normal
)

// e4m3Table maps every code to its value; the two NaN codes map to NaN.
var e4m3Table = func() (t [256]float32) {
	for c := range t {
		exp, man := c>>3&0xf, c&7
		var v float64
		switch {
		case exp == 0xf && man == 7:
			v = math.NaN()
		case exp == 0:
			v = math.Ldexp(float64(man), -9)
		default:
			v = math.Ldexp(float64(8+man), exp-10)
		}
		if c&0x80 != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}()

// isE4M3NaN reports whether code is one of the two NaN codes.
func isE4M3NaN(code byte) bool { return code&0x7f == 0x7f }

// toE4M3 rounds v to the nearest e4m3 value, ties to even, saturating at
// ±448 instead of overflowing to NaN. v must not be NaN.
func toE4M3(v float64) byte {
	// The sign is a coin toss for KV values: keep it out of the branches.
	sign := byte(math.Float64bits(v)>>56) & 0x80
	v = math.Abs(v)
	if v >= maxE4M3 {
		return sign | 0x7e
	}
	if v < e4m3MinNrm {
		// Subnormal: the code is v/2^-9 rounded; 8 is the smallest
		// normal, which is exactly where rounding up should land.
		return sign | byte(roundEven(v*512))
	}
	// Normal: keep the top 3 of float64's 52 mantissa bits, rounding the
	// rest to nearest even; a carry moves into the exponent, as it must.
	b := math.Float64bits(v)
	r := (b + (1<<48 - 1) + (b>>49)&1) >> 49
	return sign | byte(r-(1023-7)<<3)
}

// roundEven rounds a float64 of magnitude below 2^51 to the nearest
// integer, ties to even. Adding 1.5*2^52 pushes the fraction out of the
// mantissa, and the FPU rounds it the way we want.
func roundEven(v float64) int64 {
	const magic = 0x1.8p52
	return int64(math.Float64bits(v+magic) - math.Float64bits(magic))
}
