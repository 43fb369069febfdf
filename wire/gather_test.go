package wire

import (
	"bytes"
	"testing"
	"unsafe"

	"kvtier/chunk"
)

func unsafePointer(p *uint32) unsafe.Pointer { return unsafe.Pointer(p) }

// assemble puts a gathered frame's pieces together as a writev sends them.
func assemble(frame []byte, g *Gather) []byte {
	var out []byte
	at := 0
	for i, cut := range g.Cuts {
		out = append(out, frame[at:cut]...)
		out = append(out, g.Tokens[i]...)
		at = cut
	}
	return append(out, frame[at:]...)
}

func TestGatherSendsWhatAppendDoes(t *testing.T) {
	long := make([]uint32, 4096)
	for i := range long {
		long[i] = uint32(i)*2654435761 + 1
	}
	lookups := []Lookup{
		{LeaseMS: 7, Keys: Keys{Scope: 1, Kind: KindTokens, Skip: 256, Tokens: long}},
		{Keys: Keys{Scope: 1, Kind: KindTokens, Tokens: long[:gatherMin-1]}}, // copied
		{Keys: Keys{Scope: 2, Kind: KindHashes, Hashes: []chunk.Hash{{1}, {2}}}},
		{Keys: Keys{Scope: 1, Kind: KindShared, Shared: SharedTokens{Offset: 64, Count: 9}}},
		{Keys: Keys{Scope: 1, Kind: KindTokens, Tokens: long[:gatherMin]}},
		{Keys: Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3}}}},
		{Keys: Keys{Scope: 1, Kind: KindTokens}},
	}
	var g Gather
	for i := range lookups {
		g.Reset()
		frame := lookups[i].AppendGather([]byte("head"), &g)
		want := lookups[i].Append([]byte("head"))
		if got := assemble(frame, &g); !bytes.Equal(got, want) {
			t.Fatalf("lookup %d: gathered frame differs from Append's", i)
		}
		if len(frame)+g.Bytes() != len(want) {
			t.Fatalf("lookup %d: %d frame bytes and %d gathered, want %d", i, len(frame), g.Bytes(), len(want))
		}
	}
	g.Reset()
	batch := LookupBatch{Lookups: lookups}
	frame := batch.AppendGather(nil, &g)
	if got := assemble(frame, &g); !bytes.Equal(got, batch.Append(nil)) {
		t.Fatal("gathered batch differs from Append's")
	}
	if len(g.Tokens) != 2 {
		t.Fatalf("%d prompts left in place, want 2", len(g.Tokens))
	}
	if &g.Tokens[0][0] != (*byte)(unsafePointer(&long[0])) {
		t.Fatal("the tokens were copied, not left in place")
	}
	g.Reset()
	if len(g.Tokens) != 0 || len(g.Cuts) != 0 || g.Bytes() != 0 {
		t.Fatal("Reset left pieces")
	}
}
