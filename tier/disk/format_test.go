package disk

import (
	"bytes"
	"errors"
	"testing"
)

func sampleHeader() header {
	h := header{seg: 7, off: 3 * blockSize, key: testKey(99), size: 123457}
	for i := range h.pieces() {
		h.sums[i] = 0xfeedface + uint64(i)
	}
	return h
}

// sampleHeaderV3 is sampleHeader naming a parent: a version 3 header.
func sampleHeaderV3() header {
	h := sampleHeader()
	h.setParent(parent{key: testKey(98), ok: true})
	return h
}

// sampleHeaderV1 is a header as the version 1 encoder wrote it.
func sampleHeaderV1() header {
	return header{seg: 7, off: 3 * blockSize, key: testKey(99), size: 123457, version: version1, sum: 0xfeedface}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{sampleHeader(), sampleHeaderV1(), sampleHeaderV3(), {size: 0}, {size: 32 << 20}, {size: maxPayload}} {
		block := make([]byte, blockSize)
		h.encode(block)
		got, err := decodeHeader(block)
		if err != nil || got != h {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", h, got, err)
		}
	}
}

// TestPieceGeometry pins the piece sizes FORMAT promises: powers of two of
// at least one block, at most 256 pieces, 128 KiB for a 32 MiB chunk.
func TestPieceGeometry(t *testing.T) {
	for _, n := range []int64{0, 1, 4096, 4097, 256 * 4096, 256*4096 + 1, 32 << 20, 33 << 20, maxPayload} {
		h := header{size: n}
		p, m := h.pieceLen(), h.pieces()
		if p < blockSize || p&(p-1) != 0 || m > maxPieces || int64(m)*p < n || (m > 0 && int64(m-1)*p >= n) {
			t.Fatalf("%d bytes: pieces of %d, %d of them", n, p, m)
		}
		if p > blockSize && n <= int64(maxPieces)*(p/2) {
			t.Fatalf("%d bytes: pieces of %d where %d would do", n, p, p/2)
		}
	}
	if h := (header{size: 32 << 20}); h.pieceLen() != 128<<10 {
		t.Fatalf("32 MiB chunk: pieces of %d", h.pieceLen())
	}
}

// TestHeaderRejectsEveryByteFlip flips each header byte (and one byte of the
// padding) and expects the block to be rejected.
func TestHeaderRejectsEveryByteFlip(t *testing.T) {
	for _, h := range []header{sampleHeader(), sampleHeaderV1(), sampleHeaderV3()} {
		testHeaderFlips(t, h)
	}
}

func testHeaderFlips(t *testing.T, h header) {
	clean := make([]byte, blockSize)
	h.encode(clean)
	end := headerLen + 8*h.pieces()
	switch {
	case h.version == version1:
		end = headerLen
	case h.hasUp:
		end += len(h.up)
	}
	for i := range end + 1 {
		block := bytes.Clone(clean)
		block[i] ^= 0x01
		if _, err := decodeHeader(block); err == nil {
			t.Fatalf("a flip at byte %d went unnoticed", i)
		}
	}
	block := bytes.Clone(clean)
	block[blockSize-1] = 1
	if _, err := decodeHeader(block); !errors.Is(err, errHeaderField) {
		t.Fatalf("non-zero padding: %v", err)
	}
	if _, err := decodeHeader(clean[:blockSize-1]); !errors.Is(err, errShortHeader) {
		t.Fatalf("short block: %v", err)
	}
	if _, err := decodeHeader(make([]byte, blockSize)); !errors.Is(err, errMagic) {
		t.Fatalf("zero block: %v", err)
	}
}

func TestHeaderRejectsOutOfRangeFields(t *testing.T) {
	for _, h := range []header{
		{off: 100},             // not block aligned
		{off: -blockSize},      // negative
		{size: -1},             // negative length
		{size: maxPayload + 1}, // absurd length
	} {
		block := make([]byte, blockSize)
		h.encode(block)
		if _, err := decodeHeader(block); !errors.Is(err, errHeaderField) {
			t.Fatalf("header %+v: %v", h, err)
		}
	}
}

// FuzzDecodeHeader feeds decodeHeader whole blocks built from a fuzzed
// head (the part with fields) and one fuzzed padding byte, and the head
// alone as a short read. Fuzzing whole 4 KiB inputs directly is needlessly
// slow: past the piece checksums only "all zero or not" matters.
func FuzzDecodeHeader(f *testing.F) {
	h := sampleHeader()
	block := make([]byte, blockSize)
	h.encode(block)
	f.Add(block[:headerLen+8*h.pieces()], uint16(0), byte(0))
	f.Add(block[:headerLen], uint16(17), byte(1))
	v1 := sampleHeaderV1()
	v1.encode(block)
	f.Add(block[:headerLen], uint16(0), byte(0))
	v3 := sampleHeaderV3()
	v3.encode(block)
	f.Add(block[:headerLen+8*v3.pieces()+len(v3.up)], uint16(0), byte(0))
	f.Add([]byte{}, uint16(0), byte(0))
	f.Fuzz(func(t *testing.T, head []byte, padAt uint16, padByte byte) {
		if _, err := decodeHeader(head); err == nil && len(head) < blockSize {
			t.Fatalf("decoded a %d-byte block", len(head))
		}
		b := make([]byte, blockSize)
		copy(b, head)
		b[headerLen+int(padAt)%(blockSize-headerLen)] |= padByte
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		// Whatever decodes must be exactly what encode writes.
		again := make([]byte, blockSize)
		h.encode(again)
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v from a block encode would not produce", h)
		}
		if h.off%blockSize != 0 || h.off < 0 || h.size < 0 || h.size > maxPayload {
			t.Fatalf("decoded out-of-range header %+v", h)
		}
	})
}
