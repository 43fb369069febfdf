package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"

	"kvtier/kvformat"
)

var (
	allLayouts = []kvformat.Layout{kvformat.Layout2LTD, kvformat.LayoutT2D, kvformat.Layout2TD, kvformat.LayoutMLA}
	allDTypes  = []kvformat.DType{kvformat.Float16, kvformat.BFloat16, kvformat.Float32, kvformat.Float8E4M3, kvformat.Int8}
)

// smallSpec is a chunk geometry small enough to test exhaustively; MLA
// gets one wide head, as real MLA models have.
func smallSpec(d kvformat.DType, l kvformat.Layout) kvformat.Spec {
	s := kvformat.Spec{Layers: 3, KVHeads: 2, HeadDim: 16, DType: d, Layout: l, ChunkTokens: 8}
	if l == kvformat.LayoutMLA {
		s.KVHeads, s.HeadDim = 1, 40
	}
	return s
}

func allCodecs(t testing.TB) []Codec {
	var cs []Codec
	for _, name := range Names() {
		c, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

func TestRegistry(t *testing.T) {
	if got, want := fmt.Sprint(Names()), "[raw zstd lz4 fp8 int8]"; got != want {
		t.Fatalf("Names() = %s, want %s", got, want)
	}
	for _, c := range allCodecs(t) {
		byID, err := ByID(c.ID())
		if err != nil || byID.Name() != c.Name() {
			t.Errorf("ByID(%d) = %v, %v; want %s", c.ID(), byID, err, c.Name())
		}
		wantLossless := c.Name() == "raw" || c.Name() == "zstd" || c.Name() == "lz4"
		if c.Lossless() != wantLossless {
			t.Errorf("%s: Lossless() = %v", c.Name(), c.Lossless())
		}
	}
	if c, err := Lookup("ZSTD"); err != nil || c.ID() != IDZstd {
		t.Errorf("Lookup(ZSTD) = %v, %v", c, err)
	}
	if _, err := Lookup("brotli"); !errors.Is(err, ErrUnknownCodec) {
		t.Errorf("Lookup(brotli) error %v, want ErrUnknownCodec", err)
	}
	for _, id := range []ID{0, 6, 255} {
		if _, err := ByID(id); !errors.Is(err, ErrForeign) {
			t.Errorf("ByID(%d) error %v, want ErrForeign", id, err)
		}
	}
}

// TestRoundTrip seals and unseals a chunk for every codec, dtype, layout
// and a partial, an odd and a full token count.
func TestRoundTrip(t *testing.T) {
	for _, c := range allCodecs(t) {
		for _, d := range allDTypes {
			for _, l := range allLayouts {
				spec := smallSpec(d, l)
				for _, tokens := range []int{1, 5, spec.ChunkTokens} {
					t.Run(fmt.Sprintf("%s/%s/%s/%d", c.Name(), d, l, tokens), func(t *testing.T) {
						roundTrip(t, c, spec, tokens)
					})
				}
			}
		}
	}
}

func roundTrip(t *testing.T, c Codec, spec kvformat.Spec, tokens int) {
	chunk := SyntheticKV(spec, tokens, uint64(tokens))
	obj, err := Seal(nil, c, spec, chunk)
	lossyOnly16 := !c.Lossless() && spec.DType != kvformat.Float16 && spec.DType != kvformat.BFloat16
	if lossyOnly16 {
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("Seal of %s with %s: error %v, want ErrUnsupported", spec.DType, c.Name(), err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte("keep")
	out, info, err := Unseal(append([]byte(nil), prefix...), obj)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[:len(prefix)], prefix) {
		t.Fatalf("Unseal overwrote dst's prefix")
	}
	back := out[len(prefix):]
	if info.Spec != spec || info.RawLen != len(chunk) || info.Tokens() != tokens ||
		info.ObjectLen() != len(obj) || info.Codec.ID() != c.ID() {
		t.Fatalf("info %+v does not describe the sealed chunk (%d bytes, %d tokens)", info, len(chunk), tokens)
	}
	if len(back) != len(chunk) {
		t.Fatalf("decoded %d bytes, want %d", len(back), len(chunk))
	}
	if c.Lossless() {
		if !bytes.Equal(back, chunk) {
			t.Fatalf("lossless round trip changed the chunk")
		}
		return
	}
	checkLossyBound(t, c, spec, chunk, back)
}

// checkLossyBound asserts the error bound each quantizer promises, per
// element, relative to m, the largest magnitude in its head vector:
//
//	int8: scale/2 = m/254 from quantizing, plus rounding the result
//	      back to the dtype (unit roundoff u: 2^-11 float16, 2^-8 bfloat16).
//	fp8:  |x|/16 (e4m3 has 4 significant bits), plus half the subnormal
//	      step, (m/448)*2^-10, plus rounding back to the dtype.
//
// Tiny allows for float16's own subnormals and float32 arithmetic.
func checkLossyBound(t *testing.T, c Codec, spec kvformat.Spec, want, got []byte) {
	t.Helper()
	load, u, tiny := loader(spec.DType)
	dim := spec.HeadDim
	var worst float64
	for h := 0; h < len(want)/2; h += dim {
		var m float64
		for j := h; j < h+dim; j++ {
			m = max(m, math.Abs(load(want, j)))
		}
		for j := h; j < h+dim; j++ {
			x, y := load(want, j), load(got, j)
			var bound float64
			if c.ID() == IDInt8 {
				bound = m/254 + m*u
			} else {
				bound = math.Abs(x)/16 + m/448*0x1p-10 + m*u
			}
			bound = bound*1.0001 + tiny
			if e := math.Abs(y - x); e > bound {
				t.Fatalf("element %d of head vector at %d: decoded %g for %g, error %g > bound %g (head absmax %g)",
					j-h, h, y, x, e, bound, m)
			} else if m > 0 {
				worst = max(worst, e/m)
			}
		}
	}
	// The bound is not vacuous: quantization really did change values.
	if worst == 0 {
		t.Fatalf("lossy codec %s returned every value exactly", c.Name())
	}
}

// loader returns a reader of element j of a 16-bit float chunk, the
// dtype's unit roundoff and its absolute rounding slack near zero.
func loader(d kvformat.DType) (load func([]byte, int) float64, u, tiny float64) {
	if d == kvformat.Float16 {
		t := f16Table()
		return func(b []byte, j int) float64 { return float64(t[binary.LittleEndian.Uint16(b[2*j:])]) }, 0x1p-11, 0x1p-24
	}
	return func(b []byte, j int) float64 { return float64(bf16ToF32(binary.LittleEndian.Uint16(b[2*j:]))) }, 0x1p-8, 1e-37
}

// TestLossyExtremes covers heads of zeros, of the dtype's largest values
// and of subnormals, which stress the scale computation.
func TestLossyExtremes(t *testing.T) {
	for _, name := range []string{"int8", "fp8"} {
		c, _ := Lookup(name)
		for _, d := range []kvformat.DType{kvformat.Float16, kvformat.BFloat16} {
			spec := kvformat.Spec{Layers: 1, KVHeads: 4, HeadDim: 8, DType: d, Layout: kvformat.Layout2LTD, ChunkTokens: 1}
			chunk := make([]byte, spec.ChunkBytes(1))
			put := elementWriter(d)
			maxV := float64(maxF16)
			if d == kvformat.BFloat16 {
				maxV = maxBF16
			}
			for j := range 8 {
				put(chunk[2*(8+j):], maxV*float64(1-2*(j%2))) // head 1: ±max
				put(chunk[2*(16+j):], 0x1p-24*float64(j))     // head 2: float16 subnormals
				put(chunk[2*(24+j):], float64(j-4)*0.1)       // head 3: ordinary
			}
			obj, err := Seal(nil, c, spec, chunk)
			if err != nil {
				t.Fatalf("%s/%s: %v", name, d, err)
			}
			back, _, err := Unseal(nil, obj)
			if err != nil {
				t.Fatalf("%s/%s: %v", name, d, err)
			}
			checkLossyBound(t, c, spec, chunk, back)
			if !bytes.Equal(back[:16], chunk[:16]) || !bytes.Equal(back[16:32], chunk[16:32]) {
				t.Errorf("%s/%s: zeros or ±max did not survive exactly: %x -> %x", name, d, chunk[:32], back[:32])
			}
		}
	}
}

func TestLossyRejectsNonFinite(t *testing.T) {
	for _, name := range []string{"int8", "fp8"} {
		c, _ := Lookup(name)
		for _, bits := range []uint16{0x7c00, 0xfc00, 0x7e00} { // +inf, -inf, NaN in float16
			spec := kvformat.Spec{Layers: 1, KVHeads: 1, HeadDim: 4, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 1}
			chunk := make([]byte, spec.ChunkBytes(1))
			binary.LittleEndian.PutUint16(chunk[2:], bits)
			if _, err := c.Encode(nil, spec, chunk); !errors.Is(err, ErrUnsupported) {
				t.Errorf("%s of %#04x: error %v, want ErrUnsupported", name, bits, err)
			}
		}
	}
}

// TestQuantDecodeRejects feeds the quantizers' decoders payloads their
// encoders never write.
func TestQuantDecodeRejects(t *testing.T) {
	spec := kvformat.Spec{Layers: 1, KVHeads: 1, HeadDim: 4, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 1}
	rawLen := spec.ChunkBytes(1) // two head vectors: K and V
	payload := func(scale float32, code byte) []byte {
		p := make([]byte, 2*(4+4))
		binary.LittleEndian.PutUint32(p[0:], math.Float32bits(scale))
		binary.LittleEndian.PutUint32(p[4:], math.Float32bits(1))
		p[8] = code
		return p
	}
	for _, name := range []string{"int8", "fp8"} {
		c, _ := Lookup(name)
		if _, err := c.Decode(nil, spec, payload(1, 1), rawLen); err != nil {
			t.Fatalf("%s: valid payload rejected: %v", name, err)
		}
		for _, p := range [][]byte{
			payload(-1, 0),
			payload(float32(math.NaN()), 0),
			payload(float32(math.Inf(1)), 0),
			payload(1e6, 0), // 127e6 or 448e6 overflows float16
			payload(1, 1)[:15],
		} {
			if _, err := c.Decode(nil, spec, p, rawLen); !errors.Is(err, ErrCorrupt) {
				t.Errorf("%s: payload %x: error %v, want ErrCorrupt", name, p, err)
			}
		}
		if _, err := c.Decode(nil, spec, payload(1, 1), rawLen-2); err == nil {
			t.Errorf("%s: raw length that is not whole rows accepted", name)
		}
	}
	fp8, _ := Lookup("fp8")
	for _, code := range []byte{0x7f, 0xff} {
		if _, err := fp8.Decode(nil, spec, payload(1, code), rawLen); !errors.Is(err, ErrCorrupt) {
			t.Errorf("fp8 NaN code %#x: error %v, want ErrCorrupt", code, err)
		}
	}
}

func TestE4M3TableKnownValues(t *testing.T) {
	for code, want := range map[byte]float32{
		0x00: 0, 0x01: 0x1p-9, 0x07: 7 * 0x1p-9, 0x08: 0x1p-6, 0x38: 1, 0x39: 1.125,
		0x7e: 448, 0xfe: -448, 0xb8: -1,
	} {
		if got := e4m3Table[code]; got != want {
			t.Errorf("e4m3Table[%#x] = %g, want %g", code, got, want)
		}
	}
	if !math.IsNaN(float64(e4m3Table[0x7f])) || !math.IsNaN(float64(e4m3Table[0xff])) {
		t.Errorf("e4m3 NaN codes do not decode to NaN")
	}
}

// TestToE4M3 checks the encoder against a brute-force nearest search over
// every code, ties going to the even (low bit clear) code.
func TestToE4M3(t *testing.T) {
	nearest := func(v float64) byte {
		best, bestErr := byte(0), math.Inf(1)
		for c := range 256 {
			if isE4M3NaN(byte(c)) || math.Signbit(float64(e4m3Table[c])) != math.Signbit(v) {
				continue
			}
			e := math.Abs(float64(e4m3Table[c]) - v)
			if e < bestErr || (e == bestErr && c&1 == 0) {
				best, bestErr = byte(c), e
			}
		}
		return best
	}
	var probes []float64
	for c := range 126 { // every finite magnitude, the midpoints, and near them
		a, b := float64(e4m3Table[c]), float64(e4m3Table[c+1])
		mid := (a + b) / 2
		probes = append(probes, a, b, mid, math.Nextafter(mid, 0), math.Nextafter(mid, 1000))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		probes = append(probes, math.Ldexp(rng.Float64(), rng.IntN(20)-12))
	}
	for _, v := range probes {
		for _, s := range []float64{1, -1} {
			want := nearest(min(v, maxE4M3) * s)
			if got := toE4M3(v * s); got != want {
				t.Fatalf("toE4M3(%g) = %#x (%g), want %#x (%g)", v*s, got, e4m3Table[got], want, e4m3Table[want])
			}
		}
	}
	if got := toE4M3(1e9); got != 0x7e {
		t.Errorf("toE4M3(1e9) = %#x, want saturation at 0x7e", got)
	}
}

func TestRounding(t *testing.T) {
	for v, want := range map[float64]int64{0.5: 0, 1.5: 2, 2.5: 2, -0.5: 0, -1.5: -2, 126.6: 127, -126.4: -126, 0.49: 0} {
		if got := roundEven(v); got != want {
			t.Errorf("roundEven(%g) = %d, want %d", v, got, want)
		}
	}
	for f, want := range map[float32]uint16{
		1: 0x3f80, 1 + 0x1p-8: 0x3f80, 1 + 3*0x1p-8: 0x3f82, 1 + 0x1p-8 + 0x1p-20: 0x3f81, -2: 0xc000,
	} {
		if got := f32ToBF16(f); got != want {
			t.Errorf("f32ToBF16(%g) = %#04x, want %#04x", f, got, want)
		}
	}
	t16 := f16Table()
	for _, bits := range []uint16{0x0000, 0x0001, 0x03ff, 0x3c00, 0x7bff, 0xfbff, 0x8001} {
		if got := f32ToF16(t16[bits]); got != bits {
			t.Errorf("float16 %#04x does not survive float32 and back: %#04x", bits, got)
		}
	}
}

func TestSyntheticKV(t *testing.T) {
	spec := smallSpec(kvformat.BFloat16, kvformat.Layout2LTD)
	a, b := SyntheticKV(spec, 5, 7), SyntheticKV(spec, 5, 7)
	if len(a) != spec.ChunkBytes(5) || !bytes.Equal(a, b) {
		t.Fatalf("SyntheticKV is not a deterministic %d-byte chunk", spec.ChunkBytes(5))
	}
	if bytes.Equal(a, SyntheticKV(spec, 5, 8)) {
		t.Fatalf("SyntheticKV ignores its seed")
	}
	if SyntheticKV(spec, 0, 1) != nil || SyntheticKV(spec, 9, 1) != nil || SyntheticKV(kvformat.Spec{}, 1, 1) != nil {
		t.Fatalf("SyntheticKV accepted a bad spec or token count")
	}
	// Same values in every layout: token t's K row of layer l is the
	// same bytes wherever the layout puts it.
	base := SyntheticKV(smallSpec(kvformat.BFloat16, kvformat.Layout2LTD), 5, 3)
	for _, l := range []kvformat.Layout{kvformat.Layout2TD, kvformat.LayoutT2D} {
		s := smallSpec(kvformat.BFloat16, l)
		other := SyntheticKV(s, 5, 3)
		row := s.RowBytes()
		for layer := range s.Layers {
			for p := range 2 {
				for tok := range 5 {
					i, j := rowIndex(spec, 5, layer, p, tok), rowIndex(s, 5, layer, p, tok)
					if !bytes.Equal(base[i*row:(i+1)*row], other[j*row:(j+1)*row]) {
						t.Fatalf("%s: layer %d part %d token %d differs from KV_2LTD", l, layer, p, tok)
					}
				}
			}
		}
	}
}

func TestMeasure(t *testing.T) {
	spec := kvformat.Spec{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}
	data := SyntheticKV(spec, 16, 1)
	for _, c := range allCodecs(t) {
		r, err := Measure(c, spec, data)
		if err != nil {
			t.Fatal(err)
		}
		if r.Rounds < 2 || r.EncodeGBps <= 0 || r.DecodeGBps <= 0 || r.RawBytes != len(data) {
			t.Errorf("%s: implausible report %+v", c.Name(), r)
		}
		if c.Lossless() {
			if r.MaxRelErr != 0 || r.MeanRelErr != 0 || r.RMSRelErr != 0 {
				t.Errorf("%s: lossless codec reports error %+v", c.Name(), r)
			}
			continue
		}
		// 64 codes plus a 4-byte scale per 128 bytes of float16.
		wantRatio := float64(len(data)) / float64(len(data)/128*68+HeaderSize)
		if math.Abs(r.Ratio-wantRatio) > 1e-9 {
			t.Errorf("%s: ratio %g, want %g", c.Name(), r.Ratio, wantRatio)
		}
		maxErr := map[string]float64{"int8": 1.0/254 + 0x1p-11, "fp8": 1.0/16 + 0x1p-11 + 1e-5}[c.Name()]
		if r.MaxRelErr <= 0 || r.MaxRelErr > maxErr*1.0001 || r.MeanRelErr >= r.MaxRelErr || r.RMSRelErr <= 0 {
			t.Errorf("%s: error statistics out of bounds: %s", c.Name(), r)
		}
	}
}

// TestF32ToF16 checks the fast conversion against the float16 library on
// every float16 value, every midpoint between neighbours (ties), values
// just off the midpoints, the overflow edge and random float32s.
func TestF32ToF16(t *testing.T) {
	check := func(f float32) {
		t.Helper()
		want := float16.Fromfloat32(f).Bits()
		if got := f32ToF16(f); got != want && !(math.IsNaN(float64(f)) && got&0x7c00 == 0x7c00 && got&0x3ff != 0) {
			t.Fatalf("f32ToF16(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	t16 := f16Table()
	for b := range 0x7c00 {
		a := t16[b]
		next := t16[b+1] // 0x7c00 is infinity: the midpoint is the overflow edge
		mid := float32((float64(a) + float64(next)) / 2)
		for _, f := range []float32{a, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, math.MaxFloat32)} {
			check(f)
			check(-f)
		}
	}
	for _, f := range []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, 1e-30, 0x1p-25, 0x1p-26, 65520, math.Nextafter32(65520, 0)} {
		check(f)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1 << 20 {
		check(math.Float32frombits(rng.Uint32()))
	}
}
