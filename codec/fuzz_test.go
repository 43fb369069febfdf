package codec

import (
	"bytes"
	"errors"
	"testing"

	"kvtier/kvformat"
)

// FuzzUnseal feeds arbitrary bytes to Unseal: it must fail with one of the
// package's sentinels or return exactly as many bytes as the header says,
// and a lossless object must seal back to the same bytes.
func FuzzUnseal(f *testing.F) {
	for _, c := range allCodecs(f) {
		_, _, obj := sealedSample(f, c)
		f.Add(obj)
		f.Add(obj[:HeaderSize])
	}
	f.Add([]byte("KVTC"))
	f.Fuzz(func(t *testing.T, obj []byte) {
		out, info, err := Unseal([]byte("x"), obj)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrForeign) {
				t.Fatalf("Unseal error %v wraps neither ErrCorrupt nor ErrForeign", err)
			}
			if string(out) != "x" {
				t.Fatalf("failed Unseal changed dst to %q", out)
			}
			return
		}
		if len(out) != 1+info.RawLen || info.ObjectLen() != len(obj) {
			t.Fatalf("Unseal gave %d bytes for raw length %d", len(out)-1, info.RawLen)
		}
		if info.Codec.Lossless() {
			again, err := Seal(nil, info.Codec, info.Spec, out[1:])
			if err != nil {
				t.Fatalf("decoded chunk does not seal: %v", err)
			}
			back, _, err := Unseal(nil, again)
			if err != nil || !bytes.Equal(back, out[1:]) {
				t.Fatalf("decoded chunk does not round-trip: %v", err)
			}
		}
	})
}

// fuzzDecoder feeds arbitrary payloads and raw lengths straight to one
// codec's decoder, skipping the envelope's checksums. Raw lengths are kept
// below 1 MiB so the fuzzer spends its time decoding, not allocating; the
// MaxRawLen bound itself is tested in TestDecodeBounds.
func fuzzDecoder(f *testing.F, name string) {
	c, err := Lookup(name)
	if err != nil {
		f.Fatal(err)
	}
	for _, d := range []kvformat.DType{kvformat.Float16, kvformat.BFloat16} {
		spec := fuzzSpec(byte(d))
		chunk := SyntheticKV(spec, 2, 1)
		payload, err := c.Encode(nil, spec, chunk)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(d), uint32(len(chunk)), payload)
		f.Add(byte(d), uint32(len(chunk)/2), payload)
	}
	f.Fuzz(func(t *testing.T, dtype byte, rawLen uint32, payload []byte) {
		spec := fuzzSpec(dtype)
		n := int(rawLen % (1 << 20))
		dst := make([]byte, 3, 3+n)
		out, err := c.Decode(dst, spec, payload, n)
		if err != nil {
			if len(out) != 3 {
				t.Fatalf("failed Decode returned %d bytes, want dst's 3", len(out))
			}
			return
		}
		if len(out) != 3+n || &out[0] != &dst[0] {
			t.Fatalf("Decode gave %d bytes for raw length %d, or reallocated a buffer with room", len(out)-3, n)
		}
		if c.Lossless() {
			again, err := c.Encode(nil, spec, out[3:])
			if err != nil {
				t.Fatal(err)
			}
			back, err := c.Decode(nil, spec, again, n)
			if err != nil || !bytes.Equal(back, out[3:]) {
				t.Fatalf("decoded bytes do not round-trip: %v", err)
			}
		}
	})
}

// fuzzSpec is a small float16 or bfloat16 spec, chosen by one fuzzed byte.
func fuzzSpec(b byte) kvformat.Spec {
	d := kvformat.Float16
	if b&1 == 0 {
		d = kvformat.BFloat16
	}
	return kvformat.Spec{Layers: 2, KVHeads: 2, HeadDim: 8, DType: d, Layout: kvformat.Layout2LTD, ChunkTokens: 4}
}

func FuzzDecodeRaw(f *testing.F)  { fuzzDecoder(f, "raw") }
func FuzzDecodeZstd(f *testing.F) { fuzzDecoder(f, "zstd") }
func FuzzDecodeLZ4(f *testing.F)  { fuzzDecoder(f, "lz4") }
func FuzzDecodeFP8(f *testing.F)  { fuzzDecoder(f, "fp8") }
func FuzzDecodeInt8(f *testing.F) { fuzzDecoder(f, "int8") }

// TestDecodeBounds checks that no decoder accepts a raw length above
// MaxRawLen or a negative one, before allocating for it.
func TestDecodeBounds(t *testing.T) {
	spec := fuzzSpec(1)
	for _, c := range allCodecs(t) {
		for _, n := range []int{-1, MaxRawLen + 1, 1 << 40} {
			if _, err := c.Decode(nil, spec, []byte{1, 2, 3}, n); !errors.Is(err, ErrCorrupt) {
				t.Errorf("%s: raw length %d: error %v, want ErrCorrupt", c.Name(), n, err)
			}
		}
	}
}
