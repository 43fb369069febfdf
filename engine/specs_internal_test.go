package engine

import (
	"fmt"
	"testing"

	"kvtier/chunk"
	"kvtier/kvformat"
)

// TestScopeSpecsStayBounded: scopes arrive with requests (a namespace per
// cache salt), so the parsed format tags are bounded: requests of more
// scopes than they hold leave at most maxSpecScopes tags (was: one per
// scope ever seen, for good), and
// the tags of the scopes in use still answer: a registered one, whose
// chunker is cached; the same once its tag was cleared, parsed again from
// the scope book; one with a tag that names no layout.
func TestScopeSpecsStayBounded(t *testing.T) {
	e, err := Open(Options{ChunkSize: 16, RAMBytes: 8 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	spec := kvformat.Spec{Layers: 4, KVHeads: 2, HeadDim: 64, DType: kvformat.Float16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}
	scopeOf := func(i int) chunk.Scope {
		return chunk.Scope{Model: "m", WorldSize: 1, Namespace: fmt.Sprintf("salt-%d", i), Format: spec.Tag()}
	}
	most := 0
	var id uint64
	for i := range maxSpecScopes + 2*maxCachedScopes {
		if _, err := e.Chunker(scopeOf(i)); err != nil {
			t.Fatal(err)
		}
		most = max(most, e.specs.len())
	}
	if id, err = e.RegisterScope(scopeOf(0)); err != nil {
		t.Fatal(err)
	}
	if most > maxSpecScopes {
		t.Fatalf("%d format tags held, want at most %d", most, maxSpecScopes)
	}
	check := func(what string, id uint64) {
		t.Helper()
		geo, ok := e.geometry([]chunk.Key{{Scope: id}})
		if !ok || geo.Layers != 4 || geo.Parts != 2 {
			t.Fatalf("%s: geometry %+v, %v", what, geo, ok)
		}
		if got := e.specs.get(id); got != spec {
			t.Fatalf("%s: spec %+v, want %+v", what, got, spec)
		}
	}
	check("a registered scope", id)

	e.specs.clear()
	check("a registered scope whose tag was cleared", id)
	if n := e.specs.len(); n != 1 {
		t.Fatalf("%d tags held after one was parsed again, want 1", n)
	}

	plain, err := e.RegisterScope(chunk.Scope{Model: "m", WorldSize: 1, Format: "opaque"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.specs.tag(plain); ok {
		t.Fatal("a tag that names no layout has a geometry")
	}
	if _, ok := e.specs.tag(12345); ok {
		t.Fatal("an unknown scope has a tag")
	}
}
