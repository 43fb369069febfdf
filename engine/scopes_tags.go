package engine

import (
	"strings"

	"kvtier/kvformat"
)

// scopeTag is what a scope's format tag says of its chunks' layers,
// parsed once when the scope's chunker is made (scopeSpecs.note), so that
// checking a geometry against it costs a map load: the layout the tag
// names, and for a complete tag (dtype/layout/LxHxD) its spec, with the
// layer count. A short tag (dtype/layout) has the layout and a zero spec.
type scopeTag struct {
	spec   kvformat.Spec
	layout kvformat.Layout
}

// parseScopeTag reads format; false when it names no layout (no tag, or
// one kvtier does not read), which leaves nothing to hold a geometry
// against.
func parseScopeTag(format string, chunkTokens int) (scopeTag, bool) {
	_, rest, ok := strings.Cut(format, "/")
	if !ok {
		return scopeTag{}, false
	}
	name, _, _ := strings.Cut(rest, "/")
	layout, err := kvformat.ParseLayout(name)
	if err != nil {
		return scopeTag{}, false
	}
	t := scopeTag{layout: layout}
	if spec, err := kvformat.ParseTag(format, chunkTokens); err == nil {
		t.spec = spec
	}
	return t, true
}

// parts returns how many spans a layer of the tag's layout is (2 for
// KV_2LTD, 1 for KV_MLA_FMT), 0 for a layout that interleaves layers
// with tokens (KV_T2D, KV_2TD), where no layer is a span.
func (t scopeTag) parts() int {
	switch t.layout {
	case kvformat.Layout2LTD:
		return 2
	case kvformat.LayoutMLA:
		return 1
	}
	return 0
}

// tag returns what scope id's format tag says, and false when its tag
// names no layout or the scope is not known: neither held (its chunker
// made since the tags were last cleared) nor registered by a connection
// (the scope book). It allocates nothing for a held scope.
func (s *scopeSpecs) tag(id uint64) (scopeTag, bool) {
	if v, ok := s.m.Load(id); ok {
		e := v.(specEntry)
		return e.t, e.ok
	}
	if s.book == nil {
		return scopeTag{}, false
	}
	scope, ok := s.book.lookup(id)
	if !ok {
		return scopeTag{}, false
	}
	t, ok := parseScopeTag(scope.Format, s.chunkTokens)
	s.remember(id, t, ok)
	return t, ok
}
