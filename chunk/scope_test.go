package chunk

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/zeebo/xxh3"
)

var goldenScope = Scope{
	Model:     "meta-llama/Llama-3.1-8B-Instruct",
	WorldSize: 2,
	Rank:      1,
	Format:    "bfloat16/KV_2LTD",
	Namespace: "tenant-a",
}

// referenceScopeEncoding writes the documented canonical encoding field by
// field, independently of appendCanonical.
func referenceScopeEncoding(s Scope, purpose byte) []byte {
	var b []byte
	b = append(b, 1, purpose)
	str := func(v string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(v)))
		b = append(b, n[:]...)
		b = append(b, []byte(v)...)
	}
	num := func(v int) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(int64(v)))
		b = append(b, n[:]...)
	}
	str(s.Model)
	num(s.WorldSize)
	num(s.Rank)
	str(s.Format)
	str(s.Namespace)
	return b
}

func TestScopeFollowsDocumentedEncoding(t *testing.T) {
	for _, s := range []Scope{goldenScope, {}, {Model: "x", WorldSize: -1, Rank: 1 << 40}} {
		if got, want := s.ID(), xxh3.Hash(referenceScopeEncoding(s, 'I')); got != want {
			t.Errorf("%+v: ID = %016x, want %016x", s, got, want)
		}
		if got, want := s.Seed(), Hash(xxh3.Hash128(referenceScopeEncoding(s, 'S')).Bytes()); got != want {
			t.Errorf("%+v: Seed = %s, want %s", s, got, want)
		}
	}
}

// TestScopeGolden pins the values: if this fails, every stored key in every
// deployment changes meaning. Bump scopeEncodingVersion instead of editing.
func TestScopeGolden(t *testing.T) {
	if got, want := fmt.Sprintf("%016x", goldenScope.ID()), "7234fffa7231f5fd"; got != want {
		t.Errorf("ID = %s, want %s", got, want)
	}
	if got, want := goldenScope.Seed().String(), "f94406d7af57b9074654436a31db312c"; got != want {
		t.Errorf("Seed = %s, want %s", got, want)
	}
}

func TestScopesDoNotCollide(t *testing.T) {
	scopes := []Scope{
		{},
		goldenScope,
		{Model: "ab", Format: "c"},
		{Model: "a", Format: "bc"},
		{Model: "a", Namespace: "bc"},
		{Format: "a", Namespace: "bc"},
		{Format: "ab", Namespace: "c"},
		{Model: "m", WorldSize: 1, Rank: 2},
		{Model: "m", WorldSize: 2, Rank: 1},
		{Model: "m", WorldSize: 2, Rank: 0},
		{Model: "m", WorldSize: 1},
		{Model: "m", Namespace: " "},
		{Model: "m\x00"},
		{Model: "m"},
	}
	for _, model := range []string{"llama", "qwen", "mistral"} {
		for ws := 1; ws <= 8; ws *= 2 {
			for rank := range ws {
				for _, format := range []string{"bfloat16/KV_2LTD", "float16/KV_2LTD", "bfloat16/KV_MLA_FMT"} {
					for _, ns := range []string{"", "salt1", "salt2"} {
						scopes = append(scopes, Scope{model, ws, rank, format, ns})
					}
				}
			}
		}
	}
	ids := make(map[uint64]Scope)
	seeds := make(map[Hash]Scope)
	for _, s := range scopes {
		if prev, dup := ids[s.ID()]; dup {
			t.Errorf("ID collision between %+v and %+v", prev, s)
		}
		if prev, dup := seeds[s.Seed()]; dup {
			t.Errorf("Seed collision between %+v and %+v", prev, s)
		}
		ids[s.ID()] = s
		seeds[s.Seed()] = s
	}
	if len(ids) != len(scopes) {
		t.Fatalf("%d distinct IDs for %d scopes", len(ids), len(scopes))
	}
}

func TestScopeIDAndSeedAreIndependent(t *testing.T) {
	seed := goldenScope.Seed()
	id := goldenScope.ID()
	if binary.BigEndian.Uint64(seed[:8]) == id || binary.BigEndian.Uint64(seed[8:]) == id {
		t.Fatalf("ID %016x is a half of Seed %s", id, seed)
	}
}

func TestKeyIndexStable(t *testing.T) {
	k := Key{Scope: 7, Hash: Hash{0: 1, 7: 2, 15: 3}}
	// The value is part of the cluster's wire format: daemons and the
	// controller of different builds must agree on it.
	if got, want := k.Index(), uint64(0x0100000000000002)^mixScope(7); got != want {
		t.Fatalf("Index = %#x, want %#x", got, want)
	}
	other := k
	other.Scope = 8
	if other.Index() == k.Index() {
		t.Fatal("scopes do not change the index key")
	}
}
