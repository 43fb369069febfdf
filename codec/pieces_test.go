package codec

import (
	"bytes"
	"errors"
	"testing"

	"kvtier/kvformat"
)

func piecedSample(t testing.TB, n int) ([]byte, []byte) {
	t.Helper()
	chunk := make([]byte, n)
	for i := range chunk {
		chunk[i] = byte(i*7 + i>>9)
	}
	obj, err := SealPieced(nil, kvformat.Spec{}, chunk)
	if err != nil {
		t.Fatal(err)
	}
	return chunk, obj
}

// TestPiecedRoundTrip: a pieced object unseals to its chunk, and every
// piece checks against the table alone.
func TestPiecedRoundTrip(t *testing.T) {
	for _, n := range []int{1, 4096, 4097, 300000, 1 << 20, 1<<20 + 5} {
		chunk, obj := piecedSample(t, n)
		out, info, err := Unseal(nil, obj)
		if err != nil || !bytes.Equal(out, chunk) || !info.Pieced || info.RawLen != n {
			t.Fatalf("%d bytes: Unseal = %d bytes, %+v, %v", n, len(out), info, err)
		}
		var p Pieces
		if err := PeekPieces(obj[:PiecedHeaderSize], &p); err != nil {
			t.Fatalf("%d bytes: PeekPieces: %v", n, err)
		}
		if p.Count > MaxPieces || p.Count*p.PieceLen() < n {
			t.Fatalf("%d bytes: %d pieces of %d", n, p.Count, p.PieceLen())
		}
		for i := range p.Count {
			piece := chunk[i*p.PieceLen() : min((i+1)*p.PieceLen(), n)]
			if !p.Check(i, piece) {
				t.Fatalf("%d bytes: piece %d fails its own checksum", n, i)
			}
			bad := bytes.Clone(piece)
			bad[len(bad)/2] ^= 1
			if p.Check(i, bad) {
				t.Fatalf("%d bytes: a damaged piece %d passed", n, i)
			}
		}
	}
	if s := PieceShift(32 << 20); 1<<s != 128<<10 {
		t.Fatalf("32 MiB chunk: pieces of %d", 1<<s)
	}
}

// TestPiecedCorruptAnyByte: a flipped byte anywhere in a pieced object is
// refused by Unseal, and in its header or table by PeekPieces.
func TestPiecedCorruptAnyByte(t *testing.T) {
	_, obj := piecedSample(t, 20000)
	for i := range obj {
		b := bytes.Clone(obj)
		b[i] ^= 0x10
		if _, _, err := Unseal(nil, b); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrForeign) {
			t.Fatalf("byte %d: Unseal error %v", i, err)
		}
		if i < PiecedHeaderSize {
			var p Pieces
			if err := PeekPieces(b, &p); err == nil {
				t.Fatalf("byte %d of the header or table: PeekPieces accepted it", i)
			}
		}
	}
	if _, _, err := Unseal(nil, obj[:len(obj)-1]); err == nil {
		t.Fatal("a truncated pieced object unsealed")
	}
}

// TestPeekPiecesOfVersion1 says a version 1 object has no pieces.
func TestPeekPiecesOfVersion1(t *testing.T) {
	raw, _ := Lookup("raw")
	_, _, obj := sealedSample(t, raw)
	var p Pieces
	if err := PeekPieces(obj, &p); !errors.Is(err, ErrForeign) || p.Info.RawLen == 0 {
		t.Fatalf("PeekPieces of version 1: %v, %+v", err, p.Info)
	}
}

// FuzzPeekPieces: no head panics PeekPieces, and what it accepts has a
// consistent geometry.
func FuzzPeekPieces(f *testing.F) {
	_, obj := piecedSample(f, 300000)
	f.Add(obj[:PiecedHeaderSize])
	f.Add(obj[:HeaderSize])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, head []byte) {
		var p Pieces
		if PeekPieces(head, &p) != nil {
			return
		}
		if p.Count > MaxPieces || p.Count*p.PieceLen() < p.Info.RawLen || p.Info.PayloadLen != PieceTableSize+p.Info.RawLen {
			t.Fatalf("accepted %+v", p.Info)
		}
	})
}

// FuzzUnsealPieced: no bytes panic Unseal starting from a pieced object,
// and what it accepts holds exactly RawLen bytes.
func FuzzUnsealPieced(f *testing.F) {
	_, obj := piecedSample(f, 9000)
	f.Add(obj)
	f.Add(obj[:PiecedHeaderSize])
	f.Fuzz(func(t *testing.T, b []byte) {
		out, info, err := Unseal(nil, b)
		if err == nil && len(out) != info.RawLen {
			t.Fatalf("unsealed %d bytes for a raw length of %d", len(out), info.RawLen)
		}
	})
}
