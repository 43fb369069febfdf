package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

// ErrUnsupported is wrapped by every error refusing a tokenizer.json this
// package cannot reproduce exactly.
var ErrUnsupported = errors.New("unsupported tokenizer configuration")

// BPE is a byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.
// It is safe for concurrent use.
type BPE struct {
	name        string
	added       *addedMatcher
	normalize   *norm.Form // nil: no normalizer
	split       splitter
	prefixSpace bool // ByteLevel add_prefix_space
	merger      merger
	cut         *newlineCut // nil: text cannot be cut safely
	// prefix and suffix are what the post_processor adds around a text
	// when special tokens are asked for (Pool.EncodeSpecial).
	prefix, suffix []uint32
}

// The parts of tokenizer.json this package reads. Unknown fields are ignored:
// decoder, truncation and padding do not change which ids the text maps
// to. The post_processor only adds special tokens around the text, which
// Encode never does and EncodeSpecial does.
type hfFile struct {
	AddedTokens   []hfAddedToken   `json:"added_tokens"`
	Normalizer    *hfComponent     `json:"normalizer"`
	PreTokenizer  *hfComponent     `json:"pre_tokenizer"`
	PostProcessor *hfPostProcessor `json:"post_processor"`
	Model         json.RawMessage  `json:"model"`
}

type hfAddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
}

// hfComponent is a normalizer or pre-tokenizer: one "type" tag plus the
// fields of the types this package supports.
type hfComponent struct {
	Type           string        `json:"type"`
	Normalizers    []hfComponent `json:"normalizers"`
	Pretokenizers  []hfComponent `json:"pretokenizers"`
	AddPrefixSpace bool          `json:"add_prefix_space"`
	UseRegex       *bool         `json:"use_regex"`
	Pattern        *struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
}

type hfModel struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// LoadHF reads a tokenizer.json file; the tokenizer is named "hf:" + path.
func LoadHF(path string) (*BPE, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenize: read tokenizer.json: %w", err)
	}
	return ParseHF("hf:"+path, data)
}

// ParseHF builds a tokenizer from the contents of a tokenizer.json. It
// refuses, with an error wrapping ErrUnsupported, any model, normalizer,
// pre-tokenizer or post-processor it would not reproduce exactly.
func ParseHF(name string, data []byte) (*BPE, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenize: parse tokenizer.json: %w", err)
	}
	t := &BPE{name: name}
	var err error
	if t.normalize, err = normalizerOf(f.Normalizer); err != nil {
		return nil, err
	}
	if t.split, t.prefixSpace, err = preTokenizerOf(f.PreTokenizer); err != nil {
		return nil, err
	}
	model, err := modelOf(f.Model)
	if err != nil {
		return nil, err
	}
	if err := t.merger.load(model); err != nil {
		return nil, err
	}
	var cutForbidden bool
	if t.added, cutForbidden, err = addedTokensOf(f.AddedTokens); err != nil {
		return nil, err
	}
	if !cutForbidden {
		t.cut = cutRuleOf(t.split, t.prefixSpace)
	}
	if t.prefix, t.suffix, err = specialTokensOf(f.PostProcessor); err != nil {
		return nil, err
	}
	return t, nil
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("tokenize: %w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

// normalizerOf accepts no normalizer, one Unicode normalization form, or a
// Sequence of at most one form (empty Sequences appear in real files).
func normalizerOf(c *hfComponent) (*norm.Form, error) {
	if c == nil {
		return nil, nil
	}
	forms := map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}
	if f, ok := forms[c.Type]; ok {
		return &f, nil
	}
	if c.Type == "Sequence" {
		var chosen *norm.Form
		for i := range c.Normalizers {
			f, err := normalizerOf(&c.Normalizers[i])
			if err != nil {
				return nil, err
			}
			if f != nil && chosen != nil {
				return nil, unsupported("normalizer Sequence with more than one normalization form")
			}
			if f != nil {
				chosen = f
			}
		}
		return chosen, nil
	}
	return nil, unsupported("normalizer %q", c.Type)
}

// preTokenizerOf accepts the two byte-level shapes found in practice:
// ByteLevel alone (GPT-2 style, with its built-in regex), and a Sequence of
// one Split with a known pattern followed by ByteLevel without regex
// (Llama 3, Qwen 2).
func preTokenizerOf(c *hfComponent) (splitter, bool, error) {
	if c == nil {
		return nil, false, unsupported("no pre_tokenizer: only byte-level BPE (ByteLevel pre-tokenizer) is supported")
	}
	switch c.Type {
	case "ByteLevel":
		if c.UseRegex != nil && !*c.UseRegex {
			return wholeSplitter{}, c.AddPrefixSpace, nil
		}
		return knownPatterns[gpt2Pattern], c.AddPrefixSpace, nil
	case "Sequence":
		if len(c.Pretokenizers) != 2 || c.Pretokenizers[0].Type != "Split" || c.Pretokenizers[1].Type != "ByteLevel" {
			return nil, false, unsupported("pre_tokenizer Sequence %s: only [Split, ByteLevel] is supported", componentTypes(c.Pretokenizers))
		}
		split, byteLevel := &c.Pretokenizers[0], &c.Pretokenizers[1]
		if byteLevel.UseRegex == nil || *byteLevel.UseRegex {
			return nil, false, unsupported("ByteLevel with use_regex after a Split")
		}
		if byteLevel.AddPrefixSpace {
			return nil, false, unsupported("ByteLevel with add_prefix_space after a Split")
		}
		if split.Behavior != "Isolated" || split.Invert {
			return nil, false, unsupported("Split behavior %q invert=%v", split.Behavior, split.Invert)
		}
		if split.Pattern == nil || split.Pattern.Regex == nil {
			return nil, false, unsupported("Split without a Regex pattern")
		}
		s, ok := knownPatterns[*split.Pattern.Regex]
		if !ok {
			return nil, false, unsupported("Split pattern %q", *split.Pattern.Regex)
		}
		return s, false, nil
	case "Metaspace":
		return nil, false, unsupported("pre_tokenizer Metaspace (SentencePiece-style BPE)")
	}
	return nil, false, unsupported("pre_tokenizer %q", c.Type)
}

func componentTypes(cs []hfComponent) string {
	types := make([]string, len(cs))
	for i := range cs {
		types[i] = cs[i].Type
	}
	return "[" + strings.Join(types, ", ") + "]"
}

// modelOf reads the model's type before its vocab, whose shape differs
// between model types, so that a Unigram or WordPiece file is named as such.
func modelOf(raw json.RawMessage) (*hfModel, error) {
	var head struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("tokenize: parse tokenizer.json model: %w", err)
	}
	if head.Type != "BPE" && !(head.Type == "" && head.Merges != nil) {
		return nil, unsupported("model type %q (only BPE)", head.Type)
	}
	var m hfModel
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("tokenize: parse tokenizer.json BPE model: %w", err)
	}
	return &m, checkModel(&m)
}

func checkModel(m *hfModel) error {
	switch {
	case m.Dropout != nil && *m.Dropout > 0:
		return unsupported("BPE dropout %v (not deterministic)", *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return unsupported("BPE continuing_subword_prefix %q", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return unsupported("BPE end_of_word_suffix %q", *m.EndOfWordSuffix)
	case m.ByteFallback:
		return unsupported("BPE byte_fallback (SentencePiece-style BPE)")
	case len(m.Vocab) == 0:
		return fmt.Errorf("tokenize: tokenizer.json model has an empty vocab")
	}
	return nil
}

// load fills the merger from the model's vocab and merges. Merges may be
// written "left right" (older files) or ["left", "right"] (newer files); a
// merge's rank is its index, and a pair listed twice keeps its last rank, as
// in HF's loader.
func (m *merger) load(model *hfModel) error {
	for b := 0; b < 256; b++ {
		id, ok := model.Vocab[string(byteRunes[b])]
		if !ok {
			return unsupported("vocab lacks the byte-level symbol for byte 0x%02x (not a byte-level BPE vocabulary)", b)
		}
		m.byteID[b] = id
	}
	m.whole = make(map[string]uint32, len(model.Vocab))
	for s, id := range model.Vocab {
		if raw, ok := rawBytes(s); ok {
			m.whole[string(raw)] = id
		}
	}
	pairs, err := parseMerges(model.Merges)
	if err != nil {
		return err
	}
	m.merges = make(map[uint64]merge, len(pairs))
	for rank, p := range pairs {
		left, okL := model.Vocab[p[0]]
		right, okR := model.Vocab[p[1]]
		merged, okM := model.Vocab[p[0]+p[1]]
		if !okL || !okR || !okM {
			return fmt.Errorf("tokenize: merge %d (%q %q) uses or makes a token missing from the vocab", rank, p[0], p[1])
		}
		m.merges[pairKey(left, right)] = merge{rank: uint32(rank), id: merged}
	}
	m.ignoreMerges = model.IgnoreMerges
	return nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("tokenize: model.merges is neither a list of strings nor of pairs: %w", err)
	}
	pairs = make([][2]string, len(lines))
	for i, line := range lines {
		left, right, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(right, " ") {
			return nil, fmt.Errorf("tokenize: merge %d %q is not two symbols separated by one space", i, line)
		}
		pairs[i] = [2]string{left, right}
	}
	return pairs, nil
}

func addedTokensOf(list []hfAddedToken) (*addedMatcher, bool, error) {
	tokens := make([]addedToken, 0, len(list))
	cutForbidden := false
	for _, a := range list {
		if a.SingleWord {
			return nil, false, unsupported("added token %q with single_word", a.Content)
		}
		t := addedToken{
			content:      a.Content,
			id:           a.ID,
			stripLeft:    a.LStrip,
			stripRight:   a.RStrip,
			containsLine: strings.ContainsAny(a.Content, "\r\n"),
		}
		// A token swallowing whitespace to its left, or spanning a line
		// break, could straddle a newline cut.
		cutForbidden = cutForbidden || t.stripLeft || t.containsLine
		tokens = append(tokens, t)
	}
	return newAddedMatcher(tokens), cutForbidden, nil
}

// Name identifies the tokenizer ("hf:" + path for LoadHF).
func (t *BPE) Name() string { return t.name }

// Encode appends the ids of text to dst. Added tokens are matched first;
// the text between them is normalized, pre-tokenized and merged. Invalid
// UTF-8 is encoded byte by byte rather than replaced.
func (t *BPE) Encode(text string, dst []uint32) ([]uint32, error) {
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	for text != "" {
		start, end, id := t.added.find(text)
		if start < 0 {
			return t.encodeSegment(text, dst, s), nil
		}
		dst = t.encodeSegment(text[:start], dst, s)
		dst = append(dst, id)
		text = text[end:]
	}
	return dst, nil
}

func (t *BPE) encodeSegment(seg string, dst []uint32, s *scratch) []uint32 {
	if seg == "" {
		return dst
	}
	if t.normalize != nil && !t.normalize.IsNormalString(seg) {
		seg = t.normalize.String(seg)
	}
	if t.prefixSpace && seg[0] != ' ' {
		s.bytes = append(append(s.bytes[:0], ' '), seg...)
		// s.bytes is not modified until this segment is encoded.
		seg = unsafe.String(&s.bytes[0], len(s.bytes))
	}
	for i := 0; i < len(seg); {
		j := t.split.next(seg, i)
		dst = t.merger.encode(seg[i:j], dst, s)
		i = j
	}
	return dst
}

// cutRuleOf returns where text split by s may be cut, or nil. A segment
// kept whole, or given a leading space, changes if cut.
func cutRuleOf(s splitter, prefixSpace bool) *newlineCut {
	if prefixSpace {
		return nil
	}
	switch s.(type) {
	case cl100kSplitter:
		return &newlineCut{afterAnyRun: true}
	case gpt2Splitter:
		return &newlineCut{}
	}
	return nil
}

func (t *BPE) cuttable() bool { return t.cut != nil }

func (t *BPE) canCut(text string, c int) bool {
	return t.cut != nil && t.cut.ok(text, c)
}
