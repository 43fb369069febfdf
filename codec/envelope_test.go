package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/zeebo/xxh3"

	"kvtier/kvformat"
)

func sealedSample(t testing.TB, c Codec) (kvformat.Spec, []byte, []byte) {
	spec := kvformat.Spec{Layers: 2, KVHeads: 2, HeadDim: 8, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 4}
	chunk := SyntheticKV(spec, 3, 42)
	obj, err := Seal(nil, c, spec, chunk)
	if err != nil {
		t.Fatal(err)
	}
	return spec, chunk, obj
}

// TestCorruptAnyByte flips bits in every byte of a sealed object, and
// truncates and extends it: Unseal must refuse each one.
func TestCorruptAnyByte(t *testing.T) {
	for _, c := range allCodecs(t) {
		_, _, obj := sealedSample(t, c)
		bad := make([]byte, len(obj))
		for i := range obj {
			for _, mask := range []byte{0x01, 0x80, 0xff} {
				copy(bad, obj)
				bad[i] ^= mask
				out, _, err := Unseal(nil, bad)
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrForeign) {
					t.Fatalf("%s: byte %d ^ %#x: Unseal error %v, want ErrCorrupt or ErrForeign", c.Name(), i, mask, err)
				}
				if out != nil {
					t.Fatalf("%s: byte %d ^ %#x: Unseal returned bytes with its error", c.Name(), i, mask)
				}
			}
		}
		for n := range len(obj) {
			if _, _, err := Unseal(nil, obj[:n]); err == nil {
				t.Fatalf("%s: object truncated to %d bytes accepted", c.Name(), n)
			}
		}
		if _, _, err := Unseal(nil, append(obj[:len(obj):len(obj)], 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: object with a trailing byte: error %v, want ErrCorrupt", c.Name(), err)
		}
	}
}

// reseal rewrites the header checksum after a test edits the header, to
// reach the checks that come after it.
func reseal(obj []byte) {
	binary.LittleEndian.PutUint64(obj[headerSumOffset:], xxh3.Hash(obj[:headerSumOffset]))
}

func TestForeign(t *testing.T) {
	raw, _ := Lookup("raw")
	_, _, obj := sealedSample(t, raw)
	cases := map[string]func(b []byte){
		"magic":    func(b []byte) { copy(b, "KVTX") },
		"version":  func(b []byte) { b[4] = 3; reseal(b) },
		"codec":    func(b []byte) { b[5] = 99; reseal(b) },
		"reserved": func(b []byte) { b[7] = 1; reseal(b) },
		"spec":     func(b []byte) { b[specOffset+4] = 9; reseal(b) }, // kvformat header version 9
	}
	for name, edit := range cases {
		b := bytes.Clone(obj)
		edit(b)
		if _, _, err := Unseal(nil, b); !errors.Is(err, ErrForeign) {
			t.Errorf("%s: Unseal error %v, want ErrForeign", name, err)
		}
	}
	if _, err := PeekInfo([]byte("{\"json\": true}")); !errors.Is(err, ErrForeign) {
		t.Errorf("PeekInfo of JSON: error %v, want ErrForeign", err)
	}
}

func TestCorruptLengths(t *testing.T) {
	zstdC, _ := Lookup("zstd")
	spec, _, obj := sealedSample(t, zstdC)
	cases := map[string]uint32{
		"raw length not whole tokens": uint32(spec.BytesPerToken()*2 + 1),
		"raw length over ChunkTokens": uint32(spec.ChunkBytes(spec.ChunkTokens + 1)),
		"raw length zero":             0,
		"raw length huge":             MaxRawLen + 1,
	}
	for name, rawLen := range cases {
		b := bytes.Clone(obj)
		binary.LittleEndian.PutUint32(b[rawLenOffset:], rawLen)
		reseal(b)
		if _, _, err := Unseal(nil, b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: error %v, want ErrCorrupt", name, err)
		}
	}
	// A raw length that is valid for the spec but not what the payload
	// holds gets past the header and must be caught by the decoder.
	b := bytes.Clone(obj)
	binary.LittleEndian.PutUint32(b[rawLenOffset:], uint32(spec.BytesPerToken()))
	reseal(b)
	if _, _, err := Unseal(nil, b); !errors.Is(err, ErrCorrupt) {
		t.Errorf("wrong but valid raw length: error %v, want ErrCorrupt", err)
	}
}

func TestPeekInfoFromHeaderOnly(t *testing.T) {
	for _, c := range allCodecs(t) {
		spec, chunk, obj := sealedSample(t, c)
		info, err := PeekInfo(obj[:HeaderSize])
		if err != nil {
			t.Fatal(err)
		}
		if info.Codec.ID() != c.ID() || info.Spec != spec || info.RawLen != len(chunk) || info.ObjectLen() != len(obj) || info.Tokens() != 3 {
			t.Errorf("%s: PeekInfo = %+v", c.Name(), info)
		}
		if _, err := PeekInfo(obj[:HeaderSize-1]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: short header: error %v, want ErrCorrupt", c.Name(), err)
		}
	}
}

func TestSealRejects(t *testing.T) {
	raw, _ := Lookup("raw")
	spec, chunk, _ := sealedSample(t, raw)
	dst := []byte("prefix")
	for name, bad := range map[string][]byte{
		"empty":          nil,
		"partial token":  chunk[:len(chunk)-1],
		"too many":       make([]byte, spec.ChunkBytes(spec.ChunkTokens+1)),
		"not whole rows": chunk[:spec.BytesPerToken()+2],
	} {
		out, err := Seal(dst, raw, spec, bad)
		if err == nil || string(out) != "prefix" {
			t.Errorf("%s: Seal = %q, %v; want an error and dst unchanged", name, out, err)
		}
	}
	half := spec
	half.HeadDim = 0 // neither a valid spec nor the zero (opaque) one
	if _, err := Seal(nil, raw, half, chunk); !errors.Is(err, kvformat.ErrSpec) {
		t.Errorf("invalid spec: error %v, want kvformat.ErrSpec", err)
	}
}

// TestNoAllocations checks the hot path promise: with buffers that have
// room, Unseal allocates nothing and Seal only what kvformat's
// Spec.AppendBinary does (32 bytes today: its header array escapes through
// crc32.Checksum), once per chunk, never per element or in a codec.
func TestNoAllocations(t *testing.T) {
	specHeaderAllocs := testing.AllocsPerRun(20, func() {
		var h [kvformat.HeaderSize]byte
		_, _ = kvformat.Spec{Layers: 1, KVHeads: 1, HeadDim: 1, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 1}.AppendBinary(h[:0])
	})
	if testing.Short() {
		t.Skip("allocation counts need a settled heap")
	}
	spec := kvformat.Spec{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvformat.BFloat16, Layout: kvformat.Layout2LTD, ChunkTokens: 32}
	chunk := SyntheticKV(spec, 32, 5)
	for _, c := range allCodecs(t) {
		obj, err := Seal(nil, c, spec, chunk)
		if err != nil {
			t.Fatal(err)
		}
		objBuf := make([]byte, 0, 2*len(chunk)+HeaderSize)
		back := make([]byte, 0, len(chunk))
		Seal(objBuf, c, spec, chunk) // warm pools
		Unseal(back, obj)
		if n := testing.AllocsPerRun(20, func() { _, _ = Seal(objBuf, c, spec, chunk) }); n > specHeaderAllocs {
			t.Errorf("%s: Seal allocates %v times per call", c.Name(), n)
		}
		if n := testing.AllocsPerRun(20, func() { _, _, _ = Unseal(back, obj) }); n != 0 {
			t.Errorf("%s: Unseal allocates %v times per call", c.Name(), n)
		}
	}
}
