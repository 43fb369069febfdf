package codec

import (
	"bytes"
	"errors"
	"testing"

	"github.com/zeebo/xxh3"

	"kvtier/kvformat"
)

// TestAppendPiecedHeaderMatchesSeal builds the header from piece sums
// taken one piece at a time, as a writer that sends pieces separately
// does, and checks it is byte for byte SealPieced's, and that a reader
// accepts the object it heads and rejects a wrong piece.
func TestAppendPiecedHeaderMatchesSeal(t *testing.T) {
	spec := kvformat.Spec{Layout: kvformat.Layout2LTD, DType: kvformat.Float16, Layers: 2, KVHeads: 2, HeadDim: 64, ChunkTokens: 256}
	for _, n := range []int{spec.BytesPerToken(), 100 * spec.BytesPerToken(), 256 * spec.BytesPerToken()} {
		chunk := make([]byte, n)
		for i := range chunk {
			chunk[i] = byte(i * 7)
		}
		want, err := SealPieced(nil, spec, chunk)
		if err != nil {
			t.Fatal(err)
		}
		p := 1 << PieceShift(n)
		var sums []uint64
		for lo := 0; lo < n; lo += p {
			sums = append(sums, xxh3.Hash(chunk[lo:min(lo+p, n)]))
		}
		head, err := AppendPiecedHeader(nil, spec, n, sums)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(head, want[:PiecedHeaderSize]) {
			t.Fatalf("%d bytes: header differs from SealPieced's", n)
		}
		obj := append(head, chunk...)
		if out, _, err := Unseal(nil, obj); err != nil || !bytes.Equal(out, chunk) {
			t.Fatalf("%d bytes: unseal: %v", n, err)
		}
		obj[PiecedHeaderSize+n-1] ^= 1
		if _, _, err := Unseal(nil, obj); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d bytes: damaged last piece: %v", n, err)
		}
		if _, err := AppendPiecedHeader(nil, spec, n, sums[1:]); err == nil {
			t.Fatalf("%d bytes: header with a sum missing accepted", n)
		}
	}
}
