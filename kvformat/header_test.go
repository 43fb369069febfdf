package kvformat

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"testing"
)

// The version 1 header of llama3_8B, pinned so that a change to the format
// cannot go unnoticed: objects already in remote stores carry these bytes.
const llamaHeaderHex = "4b56464d" + "01" + "02" + "01" + "00" + // magic, version, bfloat16, KV_2LTD, reserved
	"20000000" + "08000000" + "80000000" + "00010000" + // 32 layers, 8 heads, dim 128, 256 tokens
	"00000000" // reserved; the CRC follows

func TestHeaderGolden(t *testing.T) {
	got, err := llama3_8B.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != HeaderSize {
		t.Fatalf("header is %d bytes, want %d", len(got), HeaderSize)
	}
	if prefix := hex.EncodeToString(got[:crcOffset]); prefix != llamaHeaderHex {
		t.Errorf("header = %s\nwant     %s", prefix, llamaHeaderHex)
	}
	if crc := binary.LittleEndian.Uint32(got[crcOffset:]); crc != crc32.Checksum(got[:crcOffset], crc32.MakeTable(crc32.Castagnoli)) {
		t.Errorf("CRC field %08x is not the CRC-32C of the first 28 bytes", crc)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	specs := []Spec{
		llama3_8B,
		{Layers: 61, KVHeads: 1, HeadDim: 576, DType: Float8E4M3, Layout: LayoutMLA, ChunkTokens: 64},
		{Layers: 1, KVHeads: 1, HeadDim: 1, DType: Int8, Layout: LayoutT2D, ChunkTokens: 1},
		{Layers: 80, KVHeads: 1, HeadDim: 128, DType: Float32, Layout: Layout2TD, ChunkTokens: 512},
	}
	for _, s := range specs {
		prefix := []byte("object:")
		b, err := s.AppendBinary(prefix)
		if err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		if !bytes.HasPrefix(b, prefix) || len(b) != len(prefix)+HeaderSize {
			t.Fatalf("%v: AppendBinary did not append exactly one header", s)
		}
		var back Spec
		if err := back.UnmarshalBinary(b[len(prefix):]); err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		if back != s {
			t.Errorf("round trip gave %v, want %v", back, s)
		}
	}
	if _, err := (Spec{}).MarshalBinary(); !errors.Is(err, ErrSpec) {
		t.Errorf("MarshalBinary of zero Spec = %v, want ErrSpec", err)
	}
}

func TestHeaderRejects(t *testing.T) {
	good, _ := llama3_8B.MarshalBinary()
	// reseal recomputes the CRC so a test reaches the check after it.
	reseal := func(b []byte) []byte {
		binary.LittleEndian.PutUint32(b[crcOffset:], crc32.Checksum(b[:crcOffset], castagnoli))
		return b
	}
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":        nil,
		"short":        good[:HeaderSize-1],
		"long":         append(bytes.Clone(good), 0),
		"magic":        edit(func(b []byte) []byte { b[0] = 'X'; return reseal(b) }),
		"version 2":    edit(func(b []byte) []byte { b[4] = 2; return reseal(b) }),
		"bit flip":     edit(func(b []byte) []byte { b[9] ^= 1; return b }),
		"crc":          edit(func(b []byte) []byte { b[crcOffset] ^= 0xff; return b }),
		"reserved 7":   edit(func(b []byte) []byte { b[7] = 1; return reseal(b) }),
		"reserved 24":  edit(func(b []byte) []byte { b[26] = 1; return reseal(b) }),
		"bad dtype":    edit(func(b []byte) []byte { b[5] = 0; return reseal(b) }),
		"bad layout":   edit(func(b []byte) []byte { b[6] = 4; return reseal(b) }),
		"zero layers":  edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[8:], 0); return reseal(b) }),
		"huge chunk":   edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 1<<31); return reseal(b) }),
		"MLA, 8 heads": edit(func(b []byte) []byte { b[6] = byte(LayoutMLA); return reseal(b) }),
	}
	for name, data := range cases {
		s := Spec{Layers: 7}
		if err := s.UnmarshalBinary(data); !errors.Is(err, ErrHeader) {
			t.Errorf("%s: UnmarshalBinary = %v, want ErrHeader", name, err)
		}
		if s != (Spec{Layers: 7}) {
			t.Errorf("%s: a failed UnmarshalBinary changed the spec to %v", name, s)
		}
	}
}

func FuzzUnmarshalBinary(f *testing.F) {
	for _, s := range []Spec{llama3_8B, {Layers: 2, KVHeads: 1, HeadDim: 576, DType: BFloat16, Layout: LayoutMLA, ChunkTokens: 16}} {
		b, _ := s.MarshalBinary()
		f.Add(b)
	}
	f.Add(make([]byte, HeaderSize))
	f.Add([]byte("KVFM"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s Spec
		if err := s.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrHeader) {
				t.Fatalf("error %v does not wrap ErrHeader", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded an invalid spec %v: %v", s, err)
		}
		again, err := s.MarshalBinary()
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("re-marshaling %v gave %x, %v; decoded from %x", s, again, err, data)
		}
	})
}
