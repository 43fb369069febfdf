package tokenize

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched verbatim in the text before pre-tokenization
// (special tokens such as <|im_start|> and other added tokens).
type addedToken struct {
	content      string
	id           uint32
	stripLeft    bool // lstrip: also swallow whitespace before the match
	stripRight   bool // rstrip: also swallow whitespace after the match
	containsLine bool // content has a line break (makes prefix cuts unsafe)
}

// addedMatcher finds added tokens in text, leftmost first and longest at a
// given position, like the Aho-Corasick LeftmostLongest search HF uses.
type addedMatcher struct {
	byFirst [256][]addedToken // candidates by first byte, longest first
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	m := &addedMatcher{}
	for _, t := range tokens {
		if t.content == "" {
			continue
		}
		m.byFirst[t.content[0]] = append(m.byFirst[t.content[0]], t)
	}
	for i := range m.byFirst {
		c := m.byFirst[i]
		sort.SliceStable(c, func(a, b int) bool { return len(c[a].content) > len(c[b].content) })
	}
	return m
}

// find returns the span [start, end) that the first added token in text
// covers (including stripped whitespace) and its id; start is -1 if none.
func (m *addedMatcher) find(text string) (start, end int, id uint32) {
	for i := 0; i < len(text); i++ {
		for _, t := range m.byFirst[text[i]] {
			if !strings.HasPrefix(text[i:], t.content) {
				continue
			}
			start, end = i, i+len(t.content)
			if t.stripLeft {
				for start > 0 {
					r, w := utf8.DecodeLastRuneInString(text[:start])
					if !unicode.IsSpace(r) {
						break
					}
					start -= w
				}
			}
			if t.stripRight {
				for end < len(text) {
					r, w := utf8.DecodeRuneInString(text[end:])
					if !unicode.IsSpace(r) {
						break
					}
					end += w
				}
			}
			return start, end, t.id
		}
	}
	return -1, -1, 0
}
