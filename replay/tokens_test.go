package replay

import (
	"hash/fnv"
	"slices"
	"testing"
)

// SplitMix64's published outputs, so the mapping can be checked against
// any other implementation.
func TestSplitMix64Vectors(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		want []uint64
	}{
		{0, []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}},
		{1234567, []uint64{6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821}},
	} {
		s := splitMix64(tc.seed)
		for i, want := range tc.want {
			if got := s.next(); got != want {
				t.Errorf("seed %d output %d = %#x, want %#x", tc.seed, i, got, want)
			}
		}
	}
}

func TestBlockTokensGolden(t *testing.T) {
	toks := BlockTokens(0, BlockSize, nil)
	if len(toks) != BlockSize {
		t.Fatalf("%d tokens, want %d", len(toks), BlockSize)
	}
	// Changing these breaks every recorded replay: the mapping is part of
	// the trace format.
	want := []uint32{78760, 61959, 43751, 82530, 40620, 72017, 118881, 111288}
	if !slices.Equal(toks[:len(want)], want) {
		t.Errorf("first tokens of id 0 = %v, want %v", toks[:len(want)], want)
	}
	h := fnv.New64a()
	for _, tok := range toks {
		h.Write([]byte{byte(tok), byte(tok >> 8), byte(tok >> 16), byte(tok >> 24)})
	}
	if got := h.Sum64(); got != 0x459226ef1f33b39d {
		t.Errorf("FNV-1a of id 0's 512 tokens = %#x, want 0x459226ef1f33b39d", got)
	}
}

func TestBlockTokensProperties(t *testing.T) {
	for _, id := range []uint64{0, 1, 2, 182789, 1 << 63, ^uint64(0)} {
		full := BlockTokens(id, BlockSize, nil)
		if !slices.Equal(full, BlockTokens(id, BlockSize, nil)) {
			t.Errorf("id %d: two calls differ", id)
		}
		for _, tok := range full {
			if tok >= Vocab {
				t.Fatalf("id %d: token %d outside [0, %d)", id, tok, Vocab)
			}
		}
		if part := BlockTokens(id, 100, nil); !slices.Equal(part, full[:100]) {
			t.Errorf("id %d: a partial block is not a prefix of the full one", id)
		}
		other := BlockTokens(id+1, BlockSize, nil)
		same := 0
		for i := range full {
			if full[i] == other[i] {
				same++
			}
		}
		if same > 5 { // chance agreement is about 512/128000
			t.Errorf("ids %d and %d agree on %d of 512 tokens", id, id+1, same)
		}
	}
	dst := []uint32{42}
	dst = BlockTokens(3, 2, dst)
	if len(dst) != 3 || dst[0] != 42 || !slices.Equal(dst[1:], BlockTokens(3, 2, nil)) {
		t.Errorf("BlockTokens does not append: %v", dst)
	}
}

func TestBlockTokensRejectsBadLength(t *testing.T) {
	for _, n := range []int{-1, BlockSize + 1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("BlockTokens(0, %d) did not panic", n)
				}
			}()
			BlockTokens(0, n, nil)
		}()
	}
}

func BenchmarkBlockTokens(b *testing.B) {
	buf := make([]uint32, 0, BlockSize)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = BlockTokens(uint64(i), BlockSize, buf[:0])
	}
}
