package codec

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"kvtier/kvformat"
)

// Report is what Measure found for one codec on one chunk.
type Report struct {
	Codec       string
	RawBytes    int     // bytes of the chunk
	SealedBytes int     // bytes of the sealed object, header included
	Ratio       float64 // RawBytes / SealedBytes
	EncodeGBps  float64 // Seal throughput in raw bytes, 1e9 bytes/s, one goroutine
	DecodeGBps  float64 // Unseal throughput in raw bytes, likewise
	Rounds      int     // Seal and Unseal calls timed, each

	// Error of the decoded elements, all zero for a lossless codec. Each
	// element's error is taken relative to the largest magnitude in its
	// head vector, the quantity per-head scales are built from.
	MaxRelErr  float64 // largest |decoded-x| / headAbsMax
	MeanRelErr float64 // mean of |decoded-x| / headAbsMax (heads of all zeros count as exact)
	RMSRelErr  float64 // sqrt(Σ(decoded-x)² / Σx²) over the chunk
}

func (r Report) String() string {
	return fmt.Sprintf("%-5s ratio %.3f  encode %.2f GB/s  decode %.2f GB/s  max err %.3g  mean err %.3g  rms err %.3g",
		r.Codec, r.Ratio, r.EncodeGBps, r.DecodeGBps, r.MaxRelErr, r.MeanRelErr, r.RMSRelErr)
}

// measureTime is how long Measure keeps repeating each of Seal and Unseal.
const measureTime = 100 * time.Millisecond

// Measure seals data (a chunk of spec) with c and unseals it again,
// repeatedly, on the calling goroutine, and reports the ratio, throughput
// and, for a lossy codec, the error of the round trip. It times whole
// Seal and Unseal calls, checksums included, because that is what a tier
// pays. Buffers are reused between rounds, so the figures exclude
// allocation. A lossless codec that does not give data back exactly is an
// error.
func Measure(c Codec, spec kvformat.Spec, data []byte) (Report, error) {
	obj, err := Seal(nil, c, spec, data)
	if err != nil {
		return Report{}, err
	}
	back, _, err := Unseal(nil, obj)
	if err != nil {
		return Report{}, err
	}
	r := Report{Codec: c.Name(), RawBytes: len(data), SealedBytes: len(obj)}
	r.Ratio = float64(len(data)) / float64(len(obj))
	if c.Lossless() {
		if !bytes.Equal(back, data) {
			return r, fmt.Errorf("codec %s: lossless round trip changed the chunk", c.Name())
		}
	} else if err := r.addErrors(spec, data, back); err != nil {
		return r, err
	}

	var encSec, decSec float64
	for r.Rounds < 2 || encSec+decSec < 2*measureTime.Seconds() {
		start := time.Now()
		obj, err = Seal(obj[:0], c, spec, data)
		mid := time.Now()
		var err2 error
		back, _, err2 = Unseal(back[:0], obj)
		end := time.Now()
		if err != nil || err2 != nil {
			return r, fmt.Errorf("codec %s: round %d: seal: %v, unseal: %v", c.Name(), r.Rounds, err, err2)
		}
		encSec += mid.Sub(start).Seconds()
		decSec += end.Sub(mid).Seconds()
		r.Rounds++
	}
	r.EncodeGBps = float64(len(data)) * float64(r.Rounds) / encSec / 1e9
	r.DecodeGBps = float64(len(data)) * float64(r.Rounds) / decSec / 1e9
	return r, nil
}

// addErrors fills in the error fields from a float16 or bfloat16 chunk
// and its lossy round trip.
func (r *Report) addErrors(spec kvformat.Spec, want, got []byte) error {
	load := bf16ToF32
	switch spec.DType {
	case kvformat.Float16:
		t := f16Table()
		load = func(b uint16) float32 { return t[b] }
	case kvformat.BFloat16:
	default:
		return fmt.Errorf("%w: error statistics need float16 or bfloat16, not %s", ErrUnsupported, spec.DType)
	}
	if len(got) != len(want) {
		return fmt.Errorf("codec %s: round trip gave %d bytes, want %d", r.Codec, len(got), len(want))
	}
	dim := spec.HeadDim
	var sumRel, sumErr2, sumX2 float64
	n := len(want) / 2
	for h := 0; h < n; h += dim {
		var absMax float64
		for j := h; j < h+dim; j++ {
			absMax = max(absMax, math.Abs(float64(load(binary.LittleEndian.Uint16(want[2*j:])))))
		}
		for j := h; j < h+dim; j++ {
			x := float64(load(binary.LittleEndian.Uint16(want[2*j:])))
			e := math.Abs(float64(load(binary.LittleEndian.Uint16(got[2*j:]))) - x)
			sumErr2 += e * e
			sumX2 += x * x
			if absMax > 0 {
				r.MaxRelErr = max(r.MaxRelErr, e/absMax)
				sumRel += e / absMax
			}
		}
	}
	if n > 0 {
		r.MeanRelErr = sumRel / float64(n)
	}
	if sumX2 > 0 {
		r.RMSRelErr = math.Sqrt(sumErr2 / sumX2)
	}
	return nil
}

// SyntheticKV returns a made-up chunk of spec holding the given number of
// tokens, the same for the same seed. It is NOT model output: no real KV is
// available where kvtier is built and tested, so it imitates the statistics
// that matter to codecs, as reported for real models (KIVI, KVQuant):
//
//   - every channel (head, dim) of every layer's K and V is Gaussian with
//     its own mean and a log-normally spread standard deviation;
//   - about one K channel in 32 is an outlier, with 10x the spread and a
//     large mean, as rotary-embedded keys have;
//   - V varies more by token than by channel: each token's V row gets its
//     own log-normal gain.
//
// Values are rounded to the spec's dtype for float16, bfloat16, float32
// and float64; for the other dtypes the bytes are uniformly random. It
// returns nil if spec is invalid or tokens is not in [1, ChunkTokens].
// Generation costs a Gaussian sample per element: benchmarks should build
// data once, outside the timed loop.
func SyntheticKV(spec kvformat.Spec, tokens int, seed uint64) []byte {
	if spec.Validate() != nil || tokens < 1 || tokens > spec.ChunkTokens {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x6b76746965722d6b)) // "kvtier-k"
	chunk := make([]byte, spec.ChunkBytes(tokens))
	put := elementWriter(spec.DType)
	if put == nil {
		for i := range chunk {
			chunk[i] = byte(rng.Uint32())
		}
		return chunk
	}
	width, size, rowBytes := spec.KVHeads*spec.HeadDim, spec.DType.Size(), spec.RowBytes()
	mean, std := make([]float64, width), make([]float64, width)
	parts := 2
	if spec.Layout == kvformat.LayoutMLA {
		parts = 1
	}
	for l := range spec.Layers {
		for p := range parts {
			isK := p == 0
			for c := range width {
				mean[c] = 0.2 * rng.NormFloat64()
				std[c] = math.Exp(0.5 * rng.NormFloat64())
				if isK && rng.IntN(32) == 0 {
					std[c] *= 10
					mean[c] = 8 * rng.NormFloat64()
				}
			}
			for t := range tokens {
				gain := 1.0
				if !isK {
					gain = math.Exp(0.3 * rng.NormFloat64())
				}
				row := chunk[rowIndex(spec, tokens, l, p, t)*rowBytes:][:rowBytes]
				for c := range width {
					put(row[c*size:], mean[c]+gain*std[c]*rng.NormFloat64())
				}
			}
		}
	}
	return chunk
}

// elementWriter returns a function storing a value as one element of
// dtype d, little-endian, or nil for dtypes SyntheticKV fills at random.
func elementWriter(d kvformat.DType) func([]byte, float64) {
	switch d {
	case kvformat.Float16:
		return func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, f32ToF16(float32(v))) }
	case kvformat.BFloat16:
		return func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, f32ToBF16(float32(v))) }
	case kvformat.Float32:
		return func(b []byte, v float64) { binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v))) }
	case kvformat.Float64:
		return func(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) }
	}
	return nil
}

// rowIndex is the position, in rows, of token t's K (p=0) or V (p=1) row
// of layer l in a chunk of the given number of tokens, following the
// layouts in kvformat's package doc.
func rowIndex(spec kvformat.Spec, tokens, l, p, t int) int {
	switch spec.Layout {
	case kvformat.Layout2LTD:
		return (p*spec.Layers+l)*tokens + t
	case kvformat.Layout2TD:
		return (l*2+p)*tokens + t
	case kvformat.LayoutT2D:
		return (l*tokens+t)*2 + p
	default: // LayoutMLA: one latent row per token
		return l*tokens + t
	}
}
