package tokenize

import (
	"unicode"
	"unicode/utf8"
)

// splitter cuts a segment of text into pre-tokenizer pieces: next returns the
// end of the piece that starts at i (i < len(text)). Pieces cover the text
// without gaps, so BPE runs on each piece independently.
//
// The splitters below are hand-written equivalents of the regular expressions
// byte-level tokenizers use. Go's regexp has no lookahead, and those patterns
// rely on one: `\s+(?!\S)` takes a run of whitespace but leaves its last
// character to prefix the following word, so " x" stays one piece.
type splitter interface {
	next(text string, i int) int
}

// Regular expressions this package knows how to reproduce, as they appear in
// tokenizer.json files and tiktoken definitions.
const (
	// gpt2Pattern is the pattern of GPT-2, RoBERTa, r50k/p50k and HF's
	// ByteLevel pre-tokenizer with use_regex.
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// cl100kPattern is the pattern of cl100k_base and Llama 3.
	cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Pattern is cl100kPattern with single-digit numbers (Qwen 2 and 2.5).
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// knownPatterns maps a split pattern to its hand-written splitter.
var knownPatterns = map[string]splitter{
	gpt2Pattern:   gpt2Splitter{},
	cl100kPattern: cl100kSplitter{maxDigits: 3},
	qwen2Pattern:  cl100kSplitter{maxDigits: 1},
}

// wholeSplitter keeps the segment as one piece (ByteLevel with use_regex off).
type wholeSplitter struct{}

func (wholeSplitter) next(text string, _ int) int { return len(text) }

// Character classes of the patterns: \p{L}, \p{N}, \s (Unicode White_Space,
// as in Rust's regex and Oniguruma) and everything else. Invalid UTF-8 decodes
// to utf8.RuneError, which falls in "other" just like a literal U+FFFD.
const (
	classOther = iota
	classLetter
	classNumber
	classSpace
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		switch r := rune(c); {
		case unicode.IsLetter(r):
			t[c] = classLetter
		case unicode.IsNumber(r):
			t[c] = classNumber
		case unicode.IsSpace(r):
			t[c] = classSpace
		}
	}
	return t
}()

// runeAt decodes the rune at i and its class; i must be < len(text).
func runeAt(text string, i int) (r rune, width int, class uint8) {
	if c := text[i]; c < utf8.RuneSelf {
		return rune(c), 1, asciiClass[c]
	}
	r, width = utf8.DecodeRuneInString(text[i:])
	switch {
	case unicode.IsLetter(r):
		class = classLetter
	case unicode.IsNumber(r):
		class = classNumber
	case unicode.IsSpace(r):
		class = classSpace
	}
	return r, width, class
}

// classAt is the class of the rune at i, or -1 past the end.
func classAt(text string, i int) int {
	if i >= len(text) {
		return -1
	}
	_, _, c := runeAt(text, i)
	return int(c)
}

// skipClass returns the end of the run of runes of the given class from i.
func skipClass(text string, i int, class uint8) int {
	for i < len(text) {
		_, w, c := runeAt(text, i)
		if c != class {
			break
		}
		i += w
	}
	return i
}

// contraction returns the length of an English contraction suffix ('s, 't,
// 're, 've, 'm, 'll, 'd) at the start of s, after the apostrophe, or 0.
// foldCase matches like (?i:...) in Rust's regex, where s also matches ſ.
func contraction(s string, foldCase bool) int {
	lower := func(i int) (rune, int) {
		if i >= len(s) {
			return -1, 0
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if foldCase {
			if r == 'ſ' {
				return 's', w
			}
			if r >= 'A' && r <= 'Z' {
				r += 'a' - 'A'
			}
		}
		return r, w
	}
	r0, w0 := lower(0)
	switch r0 {
	case 's', 't', 'm', 'd':
		return w0
	case 'r', 'v':
		if r1, w1 := lower(w0); r1 == 'e' {
			return w0 + w1
		}
	case 'l':
		if r1, w1 := lower(w0); r1 == 'l' {
			return w0 + w1
		}
	}
	return 0
}

// whitespaceEnd resolves the trailing `\s+(?!\S)|\s+` alternatives for a run
// of whitespace [i, end): at the end of the text the run is one piece;
// before a non-space character the run gives up its last character (so it
// can prefix the next piece) unless that would leave it empty.
func whitespaceEnd(text string, i, end int) int {
	if end == len(text) {
		return end
	}
	_, last := utf8.DecodeLastRuneInString(text[i:end])
	if end-last > i {
		return end - last
	}
	return end
}

// gpt2Splitter implements gpt2Pattern.
type gpt2Splitter struct{}

func (gpt2Splitter) next(text string, i int) int {
	r, w, class := runeAt(text, i)
	if r == '\'' {
		if n := contraction(text[i+1:], false); n > 0 {
			return i + 1 + n
		}
	}
	j := i
	if r == ' ' {
		if c := classAt(text, i+1); c >= 0 && c != classSpace {
			j, class = i+1, uint8(c)
		}
	}
	if class != classSpace {
		return skipClass(text, j, class)
	}
	end := skipClass(text, i+w, classSpace)
	return whitespaceEnd(text, i, end)
}

// cl100kSplitter implements cl100kPattern, or qwen2Pattern with maxDigits 1.
type cl100kSplitter struct {
	maxDigits int
}

func (s cl100kSplitter) next(text string, i int) int {
	r, w, class := runeAt(text, i)
	if r == '\'' {
		if n := contraction(text[i+1:], true); n > 0 {
			return i + 1 + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if class == classLetter {
		return skipClass(text, i+w, classLetter)
	}
	if r != '\r' && r != '\n' && class != classNumber && classAt(text, i+w) == classLetter {
		return skipClass(text, i+w, classLetter)
	}
	// \p{N}{1,maxDigits}
	if class == classNumber {
		j := i + w
		for n := 1; n < s.maxDigits && classAt(text, j) == classNumber; n++ {
			_, w, _ := runeAt(text, j)
			j += w
		}
		return j
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	j := i
	if r == ' ' {
		j = i + 1
	}
	if classAt(text, j) == classOther {
		j = skipClass(text, j, classOther)
		for j < len(text) && (text[j] == '\r' || text[j] == '\n') {
			j++
		}
		return j
	}
	// Whitespace: `\s*[\r\n]+` ends after the run's last line break;
	// otherwise `\s+(?!\S)|\s+`.
	end, afterBreak := i, -1
	for end < len(text) {
		r, w, c := runeAt(text, end)
		if c != classSpace {
			break
		}
		end += w
		if r == '\r' || r == '\n' {
			afterBreak = end
		}
	}
	if afterBreak > 0 {
		return afterBreak
	}
	return whitespaceEnd(text, i, end)
}
