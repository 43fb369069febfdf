package kvformat

import (
	"fmt"
	"strings"
)

// Layout is the order of a chunk's bytes: one of LMCache's MemoryFormats.
// Its numeric values are LMCache's MemoryFormat enum values
// (lmcache/v1/memory_management.py), which is also what the lm:// protocol
// sends in its fmt field; they are written into headers, so never renumber.
// The package doc gives each layout's exact byte order.
type Layout uint8

// Supported layouts. LMCache's BINARY formats hold compressed bytes rather
// than KV and belong to codecs, not here.
const (
	Layout2LTD Layout = 1 // KV_2LTD [2, layers, tokens, hidden]: the main chunk format
	LayoutT2D  Layout = 2 // KV_T2D [tokens, 2, hidden] per layer
	Layout2TD  Layout = 3 // KV_2TD [2, tokens, hidden] per layer
	LayoutMLA  Layout = 6 // KV_MLA_FMT [1, layers, tokens, dim]: one latent row per token
)

var layoutNames = [...]string{
	Layout2LTD: "KV_2LTD",
	LayoutT2D:  "KV_T2D",
	Layout2TD:  "KV_2TD",
	LayoutMLA:  "KV_MLA_FMT",
}

// Valid reports whether l is one of the supported layouts.
func (l Layout) Valid() bool { return int(l) < len(layoutNames) && layoutNames[l] != "" }

// String returns the name exactly as LMCache spells it ("KV_2LTD", ...).
func (l Layout) String() string {
	if l.Valid() {
		return layoutNames[l]
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// ParseLayout accepts LMCache's names, ignoring case and an optional
// "MemoryFormat." prefix (how Python prints the enum member).
func ParseLayout(s string) (Layout, error) {
	name := strings.TrimSpace(s)
	if len(name) > len("MemoryFormat.") && strings.EqualFold(name[:len("MemoryFormat.")], "MemoryFormat.") {
		name = name[len("MemoryFormat."):]
	}
	for l, n := range layoutNames {
		if n != "" && strings.EqualFold(n, name) {
			return Layout(l), nil
		}
	}
	return 0, fmt.Errorf("kvformat: unknown layout %q", s)
}

// MarshalText implements encoding.TextMarshaler, for configuration files.
func (l Layout) MarshalText() ([]byte, error) {
	if !l.Valid() {
		return nil, fmt.Errorf("kvformat: cannot marshal invalid %v", l)
	}
	return []byte(l.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseLayout.
func (l *Layout) UnmarshalText(text []byte) error {
	v, err := ParseLayout(string(text))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// latent reports whether the layout stores one latent row per token (MLA)
// instead of separate K and V rows.
func (l Layout) latent() bool { return l == LayoutMLA }
