package codec

import "kvtier/kvformat"

// Lossless codecs see a chunk of 16-bit floats as bytes, where the high
// byte of each element (sign, exponent, top of the mantissa) repeats a lot
// and the low byte looks random. Interleaved, the two defeat a fast
// compressor; split into two planes — every element's low byte, then every
// high byte — the high plane compresses well. zstd applies this split to
// chunks whose spec has 2-byte elements; opaque objects are left as they are.

// planeWidth is the element size zstd splits by, or 0 for no split.
func planeWidth(spec kvformat.Spec, n int) int {
	if spec == (kvformat.Spec{}) || spec.DType.Size() != 2 || n%2 != 0 {
		return 0
	}
	return 2
}

// split writes src's bytes into dst in planes of width (len(dst) == len(src)).
func split(dst, src []byte) {
	half := len(src) / 2
	lo, hi := dst[:half], dst[half:]
	for i := range half {
		lo[i] = src[2*i]
		hi[i] = src[2*i+1]
	}
}

// join is split's inverse.
func join(dst, src []byte) {
	half := len(src) / 2
	lo, hi := src[:half], src[half:]
	for i := range half {
		dst[2*i] = lo[i]
		dst[2*i+1] = hi[i]
	}
}

// planeBufs keeps a few scratch buffers for the split planes. A channel
// rather than a sync.Pool: a pool may drop what it holds at any GC (and
// under the race detector at random), and a dropped 32 MiB buffer is a
// 32 MiB allocation on the next call.
var planeBufs = make(chan *[]byte, 4)

func planeBuf(n int) *[]byte {
	var bp *[]byte
	select {
	case bp = <-planeBufs:
	default:
		bp = new([]byte)
	}
	if cap(*bp) < n {
		*bp = make([]byte, n)
	}
	*bp = (*bp)[:n]
	return bp
}

// putPlaneBuf returns a buffer for reuse (or lets it go when enough wait).
func putPlaneBuf(bp *[]byte) {
	select {
	case planeBufs <- bp:
	default:
	}
}
