package chunk

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
)

// Vectors from /work/shared/testvectors/vllm_block_hash.md (PYTHONHASHSEED=0,
// block size 16).
const (
	vllmNoneHash0   = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
	vllmBlock0      = "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"
	vllmBlock1      = "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"
	vllmBlock0Event = uint64(12687895063098490012)
)

func mustVLLMHasher(t testing.TB, seed string, blockSize int) *VLLMHasher {
	t.Helper()
	h, err := NewVLLMHasher(seed, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func countingTokens(from, to uint32) []uint32 {
	var tokens []uint32
	for t := from; t < to; t++ {
		tokens = append(tokens, t)
	}
	return tokens
}

func TestVLLMVectors(t *testing.T) {
	h := mustVLLMHasher(t, "0", 16)
	none := h.NoneHash()
	if got := hex.EncodeToString(none[:]); got != vllmNoneHash0 {
		t.Errorf("NONE_HASH = %s, want %s", got, vllmNoneHash0)
	}

	b0 := h.BlockHash([32]byte{}, false, countingTokens(0, 16), nil)
	if got := hex.EncodeToString(b0[:]); got != vllmBlock0 {
		t.Errorf("block 0 = %s, want %s", got, vllmBlock0)
	}
	b1 := h.BlockHash(b0, true, countingTokens(16, 32), nil)
	if got := hex.EncodeToString(b1[:]); got != vllmBlock1 {
		t.Errorf("block 1 = %s, want %s", got, vllmBlock1)
	}
	if got := EventHash(b0); got != vllmBlock0Event {
		t.Errorf("block 0 event hash = %d, want %d", got, vllmBlock0Event)
	}

	all := h.BlockHashes(nil, countingTokens(0, 40), VLLMRequest{})
	if len(all) != 2 || all[0] != b0 || all[1] != b1 {
		t.Errorf("BlockHashes of 40 tokens = %x, want [block 0, block 1]", all)
	}
}

func TestVLLMCanonicalCBORVector(t *testing.T) {
	none, _ := hex.DecodeString(vllmNoneHash0)
	want := []byte{0x83, 0x58, 0x20}
	want = append(want, none...)
	want = append(want, 0x90)
	for i := range byte(16) {
		want = append(want, i)
	}
	want = append(want, 0xf6)

	parent := [32]byte(none)
	got := appendBlockInput(nil, &parent, countingTokens(0, 16), nil)
	if !bytes.Equal(got, want) {
		t.Errorf("hand-written encoding\n got %x\nwant %x", got, want)
	}
	lib, err := canonicalBlockInput(&parent, countingTokens(0, 16), nil)
	if err != nil || !bytes.Equal(lib, want) {
		t.Errorf("library encoding\n got %x (%v)\nwant %x", lib, err, want)
	}
}

func TestNewVLLMHasherRejectsBadBlockSize(t *testing.T) {
	if _, err := NewVLLMHasher("0", 0); err == nil {
		t.Fatal("block size 0 accepted")
	}
}

func TestVLLMSeedChangesEverything(t *testing.T) {
	a, b := mustVLLMHasher(t, "0", 16), mustVLLMHasher(t, "1", 16)
	if a.NoneHash() == b.NoneHash() {
		t.Fatal("seeds 0 and 1 give the same NONE_HASH")
	}
	tokens := countingTokens(0, 16)
	if a.BlockHash([32]byte{}, false, tokens, nil) == b.BlockHash([32]byte{}, false, tokens, nil) {
		t.Fatal("seeds 0 and 1 give the same first block hash")
	}
}

// randomExtraKey draws items of every kind, with lengths and values around
// each CBOR head-size boundary.
func randomExtraKey(r *rand.Rand) ExtraKey {
	switch r.IntN(5) {
	case 0:
		return TextKey(randomText(r))
	case 1:
		b := make([]byte, randomLength(r))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return BytesKey(b)
	case 2:
		return IntKey(randomInt(r))
	case 3:
		return MMKey(randomText(r), randomInt(r))
	default:
		return ExtraKey{}
	}
}

func randomLength(r *rand.Rand) int {
	return []int{0, 1, 23, 24, 31, 255, 256, 300}[r.IntN(8)]
}

func randomText(r *rand.Rand) string {
	return strings.Repeat("é", randomLength(r)/2) + strings.Repeat("a", r.IntN(3))
}

func randomInt(r *rand.Rand) int64 {
	edges := []int64{0, 23, 24, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -24, -25, -256, -257, -65536, -65537, math.MinInt64}
	if r.IntN(2) == 0 {
		return edges[r.IntN(len(edges))]
	}
	return int64(r.Uint64())
}

func randomTokens(r *rand.Rand) []uint32 {
	tokens := make([]uint32, randomLength(r)+r.IntN(2))
	for i := range tokens {
		switch r.IntN(4) {
		case 0:
			tokens[i] = uint32(r.IntN(30))
		case 1:
			tokens[i] = uint32(r.IntN(70000))
		default:
			tokens[i] = r.Uint32()
		}
	}
	return tokens
}

func extraValues(extra []ExtraKey) []any {
	var values []any
	for _, k := range extra {
		values = append(values, k.value())
	}
	return values
}

func TestVLLMHandEncodingMatchesLibrary(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	h := mustVLLMHasher(t, "42", 16)
	for i := range 2000 {
		var parent [32]byte
		for j := range parent {
			parent[j] = byte(r.Uint32())
		}
		tokens := randomTokens(r)
		var extra []ExtraKey
		for range r.IntN(4) {
			extra = append(extra, randomExtraKey(r))
		}
		checkEncodingMatchesLibrary(t, h, parent, tokens, extra)
		if t.Failed() {
			t.Fatalf("stopped at case %d", i)
		}
	}
}

func checkEncodingMatchesLibrary(t *testing.T, h *VLLMHasher, parent [32]byte, tokens []uint32, extra []ExtraKey) {
	t.Helper()
	hand := appendBlockInput(nil, &parent, tokens, extra)
	lib, err := canonicalBlockInput(&parent, tokens, extraValues(extra))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(hand, lib) {
		t.Errorf("encodings differ for %d tokens, extra %v\nhand %x\nlib  %x", len(tokens), extra, hand, lib)
	}
	viaLib, err := h.BlockHashAny(parent, true, tokens, extraValues(extra))
	if err != nil {
		t.Fatal(err)
	}
	if h.BlockHash(parent, true, tokens, extra) != viaLib {
		t.Error("BlockHash and BlockHashAny disagree")
	}
}

// FuzzVLLMHandEncoding checks the hand-written encoder against the library
// on inputs derived from arbitrary bytes.
func FuzzVLLMHandEncoding(f *testing.F) {
	f.Add([]byte{}, "", int64(0), false)
	f.Add([]byte{0, 0, 0, 24, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, "lora", int64(-1), true)
	h := mustVLLMHasher(f, "0", 16)
	f.Fuzz(func(t *testing.T, raw []byte, text string, n int64, withExtra bool) {
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24
		}
		var parent [32]byte
		copy(parent[:], raw)
		var extra []ExtraKey
		if withExtra {
			extra = []ExtraKey{TextKey(text), IntKey(n), MMKey(text, n), BytesKey(raw)}
		}
		checkEncodingMatchesLibrary(t, h, parent, tokens, extra)
	})
}

func TestVLLMLargeBlockSpillsButStaysCorrect(t *testing.T) {
	h := mustVLLMHasher(t, "0", 1024)
	r := rand.New(rand.NewPCG(3, 4))
	tokens := make([]uint32, 2048)
	for i := range tokens {
		tokens[i] = r.Uint32()
	}
	got := h.BlockHashes(nil, tokens, VLLMRequest{LoRAName: "adapter"})
	b0, err := h.BlockHashAny([32]byte{}, false, tokens[:1024], []any{"adapter"})
	if err != nil {
		t.Fatal(err)
	}
	b1, err := h.BlockHashAny(b0, true, tokens[1024:], []any{"adapter"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != b0 || got[1] != b1 {
		t.Fatal("large blocks hash differently from the library encoding")
	}
}

func TestVLLMRequestExtraKeys(t *testing.T) {
	h := mustVLLMHasher(t, "0", 16)
	tokens := countingTokens(0, 48)
	plain := h.BlockHashes(nil, tokens, VLLMRequest{})
	salted := h.BlockHashes(nil, tokens, VLLMRequest{CacheSalt: "salt"})
	lora := h.BlockHashes(nil, tokens, VLLMRequest{LoRAName: "sql-lora"})
	both := h.BlockHashes(nil, tokens, VLLMRequest{LoRAName: "sql-lora", CacheSalt: "salt"})

	// The salt enters block 0 only; later blocks differ through the chain.
	wantSalted0 := h.BlockHash([32]byte{}, false, tokens[:16], []ExtraKey{TextKey("salt")})
	wantSalted1 := h.BlockHash(wantSalted0, true, tokens[16:32], nil)
	if salted[0] != wantSalted0 || salted[1] != wantSalted1 {
		t.Error("cache_salt is not applied to the first block only")
	}
	// The LoRA name enters every block, before the salt.
	lora1 := h.BlockHash(lora[0], true, tokens[16:32], []ExtraKey{TextKey("sql-lora")})
	if lora[1] != lora1 {
		t.Error("the LoRA name is missing from a later block")
	}
	both0 := h.BlockHash([32]byte{}, false, tokens[:16], []ExtraKey{TextKey("sql-lora"), TextKey("salt")})
	if both[0] != both0 {
		t.Error("LoRA name and salt are not combined as (lora, salt)")
	}
	for i := range plain {
		if plain[i] == salted[i] || plain[i] == lora[i] || salted[i] == both[i] || lora[i] == both[i] {
			t.Errorf("block %d: different requests share a hash", i)
		}
	}
}

func TestVLLMBlockHashesSkipsPartialBlock(t *testing.T) {
	h := mustVLLMHasher(t, "0", 16)
	for n, want := range map[int]int{0: 0, 15: 0, 16: 1, 31: 1, 32: 2, 33: 2} {
		if got := len(h.BlockHashes(nil, countingTokens(0, uint32(n)), VLLMRequest{})); got != want {
			t.Errorf("%d tokens: %d hashes, want %d", n, got, want)
		}
	}
	sentinel := [32]byte{1}
	if got := h.BlockHashes([][32]byte{sentinel}, countingTokens(0, 32), VLLMRequest{}); len(got) != 3 || got[0] != sentinel {
		t.Error("BlockHashes did not append to dst")
	}
}

func TestEventHashIsLastEightBytesBigEndian(t *testing.T) {
	var h [32]byte
	for i := range h {
		h[i] = byte(i)
	}
	if got, want := EventHash(h), uint64(0x18191a1b1c1d1e1f); got != want {
		t.Fatalf("EventHash = %#x, want %#x", got, want)
	}
}

func TestVLLMDoesNotAllocate(t *testing.T) {
	h := mustVLLMHasher(t, "0", 16)
	tokens := sequentialTokens(2048 + 5)
	dst := make([][32]byte, 0, 128)
	req := VLLMRequest{LoRAName: "sql-lora", CacheSalt: "salt"}
	if allocs := testing.AllocsPerRun(20, func() { dst = h.BlockHashes(dst[:0], tokens, req) }); allocs != 0 {
		t.Errorf("BlockHashes allocated %v times per run", allocs)
	}
	extra := []ExtraKey{TextKey("lora"), MMKey("mm-hash", -3), BytesKey(make([]byte, 32)), TextKey("salt")}
	var sink [32]byte
	if allocs := testing.AllocsPerRun(20, func() { sink = h.BlockHash(sink, true, tokens[:16], extra) }); allocs != 0 {
		t.Errorf("BlockHash with extra keys allocated %v times per run", allocs)
	}
	if !slices.ContainsFunc(dst, func(b [32]byte) bool { return b != [32]byte{} }) {
		t.Error("no hashes computed")
	}
}

// TestVLLMExtraKeyVectorsMatchPython checks the Go hasher against the
// Python harness's implementation of the same formula
// (python/kvtier/harness/vllm_hash.py), for one block with each kind of
// extra key: both read their expected values from the same file.
func TestVLLMExtraKeyVectorsMatchPython(t *testing.T) {
	data, err := os.ReadFile("../python/tests/testdata/vllm_extra_keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]string
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	h := mustVLLMHasher(t, "0", 16)
	tokens := countingTokens(0, 16)
	cases := map[string][]ExtraKey{
		"lora": {TextKey("lora-a")},
		"salt": {TextKey("salt-1")},
		"mm":   {MMKey("img", 4)},
	}
	for name, extra := range cases {
		got := h.BlockHash([32]byte{}, false, tokens, extra)
		if hex.EncodeToString(got[:]) != want[name] {
			t.Errorf("%s: Go %x, Python %s", name, got, want[name])
		}
	}
	if len(want) != len(cases) {
		t.Errorf("vector file has %d cases, test covers %d", len(want), len(cases))
	}
}
