package tokenize

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Tokenizer maps text to token ids. Implementations are safe for concurrent
// use.
type Tokenizer interface {
	// Name identifies the tokenizer, e.g. "tiktoken:cl100k_base".
	Name() string
	// Encode appends the ids of text to dst and returns the extended slice.
	Encode(text string, dst []uint32) ([]uint32, error)
}

// cutter is implemented by tokenizers that know where text may be cut
// without changing its tokens: tokens(text) == tokens(text[:c]) +
// tokens(text[c:]) whenever canCut(text, c).
type cutter interface {
	cuttable() bool // false: no point of any text can be cut
	canCut(text string, c int) bool
}

// kinds are the tokenizer families a spec can name, "kind:argument" each:
// the one list Open, Names and the docs check read.
var kinds = map[string]func(arg string) (Tokenizer, error){
	"tiktoken": func(enc string) (Tokenizer, error) { return NewTiktoken(enc) }, // an embedded encoding, e.g. cl100k_base
	"hf":       func(path string) (Tokenizer, error) { return LoadHF(path) },    // a Hugging Face tokenizer.json
}

// Names lists the tokenizer kinds a spec may start with, sorted.
func Names() []string {
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Open returns the tokenizer a spec names: "tiktoken:<encoding>" (an
// embedded tiktoken encoding such as cl100k_base or o200k_base) or
// "hf:<path to tokenizer.json>".
func Open(spec string) (Tokenizer, error) {
	kind, arg, _ := strings.Cut(spec, ":")
	if open, ok := kinds[kind]; ok {
		return open(arg)
	}
	return nil, fmt.Errorf("tokenize: unknown tokenizer %q (want %s)", spec, strings.Join(Names(), ":… or ")+":…")
}

// newlineCut says where a tokenizer's text can be cut: right after a line
// feed and before a printable ASCII character that is not in notBefore.
//
// Why that is safe for the supported split patterns: letter and number
// pieces never take a '\n'; punctuation pieces may end with line breaks but
// stop at the next printable character; and Unicode normalization composes
// nothing with '\n' or with an ASCII character that follows it. What remains
// is the whitespace run ending at the cut. cl100k-style patterns end it with
// `\s*[\r\n]+`, which stops at its last line break whether or not text
// follows, so any run may precede the cut (afterAnyRun). GPT-2-style patterns
// end it with `\s+(?!\S)|\s+`, which splits "\n\n" differently at the end
// of the text than before a word, so the line feed must stand alone.
type newlineCut struct {
	afterAnyRun bool
	notBefore   string
}

func (r newlineCut) ok(text string, c int) bool {
	if c < 1 || c >= len(text) || text[c-1] != '\n' {
		return false
	}
	if b := text[c]; b <= ' ' || b >= utf8.RuneSelf || strings.IndexByte(r.notBefore, b) >= 0 {
		return false
	}
	if r.afterAnyRun {
		return true
	}
	before, _ := utf8.DecodeLastRuneInString(text[:c-1])
	return c >= 2 && !unicode.IsSpace(before)
}
