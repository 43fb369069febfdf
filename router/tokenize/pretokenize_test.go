package tokenize

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

func pieces(s splitter, text string) []string {
	var out []string
	for i := 0; i < len(text); {
		j := s.next(text, i)
		if j <= i {
			panic("splitter made no progress")
		}
		out = append(out, text[i:j])
		i = j
	}
	return out
}

// TestSplitterLookahead pins the `\s+(?!\S)` behaviour Go's regexp cannot
// express: a whitespace run gives its last character to the next piece,
// except at the end of the text or when the run is one character long.
func TestSplitterLookahead(t *testing.T) {
	cl100k, gpt2 := knownPatterns[cl100kPattern], knownPatterns[gpt2Pattern]
	tests := []struct {
		s    splitter
		text string
		want []string
	}{
		{cl100k, "a   b", []string{"a", "  ", " b"}},
		{cl100k, "a \tb", []string{"a", " ", "\tb"}},
		{cl100k, "a   ", []string{"a", "   "}},
		{cl100k, "a \n  b", []string{"a", " \n", " ", " b"}},
		{cl100k, "a\n\n b", []string{"a", "\n\n", " b"}},
		{cl100k, "a  1", []string{"a", " ", " ", "1"}},
		{cl100k, "a  !", []string{"a", " ", " !"}},
		{cl100k, "x.\n\ny", []string{"x", ".\n\n", "y"}},
		{cl100k, "12345", []string{"123", "45"}},
		{cl100k, "it'S ſ'ſ", []string{"it", "'S", " ſ", "'ſ"}},
		{knownPatterns[qwen2Pattern], "123", []string{"1", "2", "3"}},
		{gpt2, "a   b", []string{"a", "  ", " b"}},
		{gpt2, "a\n\nb", []string{"a", "\n", "\n", "b"}},
		{gpt2, "a\n\n", []string{"a", "\n\n"}},
		{gpt2, "it'S 12345", []string{"it", "'", "S", " 12345"}},
	}
	for _, tt := range tests {
		if got := pieces(tt.s, tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("%T %q = %q, want %q", tt.s, tt.text, got, tt.want)
		}
	}
}

// TestSplittersMatchRegex checks every hand-written splitter against a
// backtracking regex engine that supports the lookahead, on random text
// mixing all character classes.
func TestSplittersMatchRegex(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	texts := append([]string(nil), corpus...)
	for range scaled(3000) {
		texts = append(texts, randomText(rng, 1+rng.IntN(25)))
	}
	for pattern, s := range knownPatterns {
		re := regexp2.MustCompile(pattern, regexp2.None)
		for _, text := range texts {
			if got, want := pieces(s, text), regexPieces(t, re, text); !slices.Equal(got, want) {
				t.Fatalf("pattern %q text %q:\n got  %q\n want %q", pattern, text, got, want)
			}
		}
	}
}

// regexPieces lists the matches of re in text; regexp2 reports rune offsets.
func regexPieces(t *testing.T, re *regexp2.Regexp, text string) []string {
	runes := []rune(text)
	var out []string
	m, err := re.FindStringMatch(text)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		out = append(out, string(runes[m.Index:m.Index+m.Length]))
	}
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(out, "") != text {
		t.Fatalf("regex matches of %q leave gaps: %q", text, out)
	}
	return out
}

// TestSafeCuts checks the property the prefix cache rests on: at every point
// canCut accepts, tokens(text) = tokens(text[:c]) + tokens(text[c:]).
func TestSafeCuts(t *testing.T) {
	toks := []Tokenizer{cl100kHF(t), r50kHF(t), tiktokenOf(t, "cl100k_base"), tiktokenOf(t, "o200k_base"), tiktokenOf(t, "r50k_base")}
	rng := rand.New(rand.NewPCG(5, 6))
	lineParts := append(slices.Clone(alphabet), "\n", "\n", "\nx", "\n/", "\n.", "\n1", "\n\nx", " \nx", "\n \nx")
	cuts := 0
	for range scaled(150) {
		var b strings.Builder
		for range 1 + rng.IntN(40) {
			b.WriteString(lineParts[rng.IntN(len(lineParts))])
		}
		text := b.String()
		for _, tok := range toks {
			whole := mustEncode(t, tok, text)
			for c := 0; c <= len(text); c++ {
				if !tok.(cutter).canCut(text, c) {
					continue
				}
				cuts++
				parts := append(mustEncode(t, tok, text[:c]), mustEncode(t, tok, text[c:])...)
				if !equalIDs(whole, parts) {
					t.Fatalf("%s: cut %d of %q changes tokens:\n whole %v\n parts %v", tok.Name(), c, text, whole, parts)
				}
			}
		}
	}
	if cuts < scaled(200) {
		t.Fatalf("only %d cuts exercised", cuts)
	}
}
