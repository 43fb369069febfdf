package chunk

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// sequentialTokens returns n token ids that cover all four byte positions,
// so a wrong byte order changes the hashes.
func sequentialTokens(n int) []uint32 {
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = uint32(i)*2654435761 + 7
	}
	return tokens
}

func mustChunker(t testing.TB, s Scope, size int, saveUnfull bool) *Chunker {
	t.Helper()
	c, err := NewChunker(s, size, saveUnfull)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// referenceKeys computes keys the way the package documents them, with
// nothing shared with the implementation but xxh3.
func referenceKeys(s Scope, size int, saveUnfull bool, tokens []uint32) []Key {
	var keys []Key
	parent := s.Seed()
	for start := 0; start < len(tokens); start += size {
		end := start + size
		if end > len(tokens) {
			if !saveUnfull {
				break
			}
			end = len(tokens)
		}
		input := append([]byte(nil), parent[:]...)
		for _, tok := range tokens[start:end] {
			input = binary.LittleEndian.AppendUint32(input, tok)
		}
		parent = xxh3.Hash128(input).Bytes()
		keys = append(keys, Key{Scope: s.ID(), Hash: parent})
	}
	return keys
}

func TestNewChunkerRejectsBadSize(t *testing.T) {
	for _, size := range []int{0, -1, -256} {
		if _, err := NewChunker(goldenScope, size, false); !errors.Is(err, ErrChunkSize) {
			t.Errorf("size %d: err = %v, want ErrChunkSize", size, err)
		}
	}
	c := mustChunker(t, goldenScope, DefaultSize, true)
	if c.Size() != 256 || !c.SaveUnfull() || c.Scope() != goldenScope.ID() {
		t.Fatalf("accessors: size %d, saveUnfull %v, scope %016x", c.Size(), c.SaveUnfull(), c.Scope())
	}
}

func TestKeysFollowDocumentedHash(t *testing.T) {
	tokens := sequentialTokens(1000)
	for _, size := range []int{1, 7, 16, 256, 300, 1000, 4096} {
		for _, saveUnfull := range []bool{false, true} {
			c := mustChunker(t, goldenScope, size, saveUnfull)
			got := c.Keys(nil, tokens)
			want := referenceKeys(goldenScope, size, saveUnfull, tokens)
			if !slices.Equal(got, want) {
				t.Errorf("size %d saveUnfull %v: keys differ from the reference", size, saveUnfull)
			}
			if len(got) != c.NumChunks(len(tokens)) {
				t.Errorf("size %d saveUnfull %v: %d keys, NumChunks says %d", size, saveUnfull, len(got), c.NumChunks(len(tokens)))
			}
		}
	}
}

// TestKeysGolden pins the hash: if it fails, keys written by earlier builds
// can no longer be found.
func TestKeysGolden(t *testing.T) {
	c := mustChunker(t, goldenScope, 4, true)
	keys := c.Keys(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 100000, 4294967295})
	want := []string{
		"7234fffa7231f5fd/10f0701095f7186511b233d6c8458d5d",
		"7234fffa7231f5fd/c87a67636045666d356cf37678cb75aa",
		"7234fffa7231f5fd/b71bb8a5460ea40abe642bc20c04bc44",
	}
	if len(keys) != len(want) {
		t.Fatalf("%d keys, want %d", len(keys), len(want))
	}
	for i, k := range keys {
		if k.String() != want[i] {
			t.Errorf("key %d = %s, want %s", i, k, want[i])
		}
	}
}

func TestKeysAppendToDst(t *testing.T) {
	c := mustChunker(t, goldenScope, 16, false)
	tokens := sequentialTokens(64)
	sentinel := Key{Scope: 42}
	got := c.Keys([]Key{sentinel}, tokens)
	if len(got) != 5 || got[0] != sentinel || !slices.Equal(got[1:], c.Keys(nil, tokens)) {
		t.Fatalf("Keys did not append after the existing element: %v", got)
	}
}

func TestChangingATokenChangesItsChunkAndEveryLaterOne(t *testing.T) {
	const size = 16
	c := mustChunker(t, goldenScope, size, true)
	tokens := sequentialTokens(100)
	base := c.Keys(nil, tokens)
	for _, j := range []int{0, 1, 15, 16, 47, 63, 64, 95, 96, 99} {
		changed := slices.Clone(tokens)
		changed[j]++
		keys := c.Keys(nil, changed)
		for i := range keys {
			same := keys[i] == base[i]
			if i < j/size && !same {
				t.Errorf("token %d changed key %d, which ends before it", j, i)
			}
			if i >= j/size && same {
				t.Errorf("token %d did not change key %d", j, i)
			}
		}
	}
}

func TestKeysOfAPrefixArePrefixOfKeys(t *testing.T) {
	c := mustChunker(t, goldenScope, 16, false)
	tokens := sequentialTokens(200)
	all := c.Keys(nil, tokens)
	for n := 0; n <= len(tokens); n += 13 {
		prefix := c.Keys(nil, tokens[:n])
		if !slices.Equal(prefix, all[:len(prefix)]) {
			t.Fatalf("keys of the first %d tokens are not a prefix of the full keys", n)
		}
	}
}

func TestSameTokensInOtherScopesGetOtherKeys(t *testing.T) {
	tokens := sequentialTokens(64)
	seen := make(map[Hash]Scope)
	for _, s := range []Scope{goldenScope, {}, {Model: goldenScope.Model}, {Model: goldenScope.Model, Namespace: "b"}} {
		for _, k := range mustChunker(t, s, 16, false).Keys(nil, tokens) {
			if k.Scope != s.ID() {
				t.Errorf("key scope %016x, want %016x", k.Scope, s.ID())
			}
			if prev, dup := seen[k.Hash]; dup {
				t.Errorf("hash %s in scopes %+v and %+v", k.Hash, prev, s)
			}
			seen[k.Hash] = s
		}
	}
}

func TestPartialChunk(t *testing.T) {
	tokens := sequentialTokens(600)
	full := mustChunker(t, goldenScope, 256, false)
	unfull := mustChunker(t, goldenScope, 256, true)

	fullKeys, unfullKeys := full.Keys(nil, tokens), unfull.Keys(nil, tokens)
	if len(fullKeys) != 2 || len(unfullKeys) != 3 {
		t.Fatalf("got %d and %d keys, want 2 without and 3 with the partial chunk", len(fullKeys), len(unfullKeys))
	}
	if !slices.Equal(fullKeys, unfullKeys[:2]) {
		t.Fatal("the full chunks' keys depend on saveUnfull")
	}
	if start, end := unfull.Bounds(2, len(tokens)); start != 512 || end != 600 {
		t.Fatalf("Bounds(2) = [%d, %d), want [512, 600)", start, end)
	}
	// The partial chunk's key names exactly its 88 tokens: one more token
	// makes it a different chunk.
	longer := unfull.Keys(nil, sequentialTokens(601))
	if longer[2] == unfullKeys[2] {
		t.Fatal("a partial chunk of 88 and one of 89 tokens share a key")
	}
}

func TestNumChunksAndBounds(t *testing.T) {
	cases := []struct {
		tokens            int
		without, withPart int
	}{{0, 0, 0}, {1, 0, 1}, {255, 0, 1}, {256, 1, 1}, {257, 1, 2}, {512, 2, 2}, {32768, 128, 128}, {-5, 0, 0}}
	full := mustChunker(t, goldenScope, 256, false)
	unfull := mustChunker(t, goldenScope, 256, true)
	for _, tc := range cases {
		if got := full.NumChunks(tc.tokens); got != tc.without {
			t.Errorf("NumChunks(%d) without partial = %d, want %d", tc.tokens, got, tc.without)
		}
		if got := unfull.NumChunks(tc.tokens); got != tc.withPart {
			t.Errorf("NumChunks(%d) with partial = %d, want %d", tc.tokens, got, tc.withPart)
		}
		// The bounds of all chunks tile [0, covered) with no gap or overlap.
		next := 0
		for i := range unfull.NumChunks(tc.tokens) {
			start, end := unfull.Bounds(i, tc.tokens)
			if start != next || end <= start || end-start > 256 {
				t.Errorf("%d tokens: Bounds(%d) = [%d, %d) after %d", tc.tokens, i, start, end, next)
			}
			next = end
		}
		if tc.tokens > 0 && next != tc.tokens {
			t.Errorf("%d tokens: chunks cover [0, %d)", tc.tokens, next)
		}
	}
}

func TestBoundsPanicsOutOfRange(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, false)
	for _, i := range []int{-1, 2, 3} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Bounds(%d, 600) did not panic", i)
				}
			}()
			c.Bounds(i, 600)
		}()
	}
}

func TestFirstChunk(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, true)
	valid := []struct{ skip, tokens, first int }{
		{0, 0, 0}, {0, 600, 0}, {256, 600, 1}, {512, 600, 2}, {512, 512, 2},
	}
	for _, tc := range valid {
		got, err := c.FirstChunk(tc.skip, tc.tokens)
		if err != nil || got != tc.first {
			t.Errorf("FirstChunk(%d, %d) = %d, %v; want %d", tc.skip, tc.tokens, got, err, tc.first)
		}
	}
	invalid := []struct{ skip, tokens int }{
		{-256, 600}, {-1, 600}, {1, 600}, {255, 600}, {300, 600}, {768, 600}, {256, 255},
	}
	for _, tc := range invalid {
		if _, err := c.FirstChunk(tc.skip, tc.tokens); !errors.Is(err, ErrSkip) {
			t.Errorf("FirstChunk(%d, %d): err = %v, want ErrSkip", tc.skip, tc.tokens, err)
		}
	}
}

func TestKeysDoNotAllocate(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, true)
	tokens := sequentialTokens(32768 + 100)
	dst := make([]Key, 0, c.NumChunks(len(tokens)))
	allocs := testing.AllocsPerRun(20, func() { dst = c.Keys(dst[:0], tokens) })
	if allocs != 0 {
		t.Fatalf("Keys allocated %v times per run", allocs)
	}
	if len(dst) != 129 {
		t.Fatalf("%d keys, want 129", len(dst))
	}
}

// TestPortableByteOrderPath runs every hash through the conversion used on
// big-endian machines and checks that the results do not change.
func TestPortableByteOrderPath(t *testing.T) {
	if !nativeLittleEndian {
		t.Skip("this machine already takes the portable path")
	}
	tokens := sequentialTokens(2*tokenBatch + 77)
	chunker := mustChunker(t, goldenScope, 300, true)
	vllm := mustVLLMHasher(t, "0", 16)
	compute := func() ([]Key, [][32]byte, []string, [32]byte) {
		return chunker.Keys(nil, tokens),
			vllm.BlockHashes(nil, tokens, VLLMRequest{LoRAName: "l"}),
			SGLangPageKeys(nil, tokens, 64),
			SGLangPageHash([]byte("prior"), tokens)
	}
	keys, blocks, pages, page := compute()

	nativeLittleEndian = false
	t.Cleanup(func() { nativeLittleEndian = true })
	keys2, blocks2, pages2, page2 := compute()

	if !slices.Equal(keys, keys2) || !slices.Equal(blocks, blocks2) || !slices.Equal(pages, pages2) || page != page2 {
		t.Fatal("the portable byte-order path gives different hashes")
	}

	var scratch tokenScratch
	var got []byte
	for rest := tokens; len(rest) > 0; {
		var piece []byte
		piece, rest = nextTokenBytes(rest, &scratch)
		if len(piece) > len(scratch) {
			t.Fatalf("piece of %d bytes exceeds the scratch buffer", len(piece))
		}
		got = append(got, piece...)
	}
	var want []byte
	for _, tok := range tokens {
		want = binary.LittleEndian.AppendUint32(want, tok)
	}
	if !slices.Equal(got, want) {
		t.Fatal("encodeTokenBytes pieces are not the little-endian encoding")
	}
}
