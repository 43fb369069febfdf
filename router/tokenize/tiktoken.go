package tokenize

import (
	"fmt"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// Tiktoken is an OpenAI tiktoken encoding, with ranks embedded in the binary
// (no download). Special tokens written in the text (<|endoftext|>, ...) are
// encoded as special tokens. It is safe for concurrent use.
//
// tiktoken-go decodes text as runes, so invalid UTF-8 is encoded as U+FFFD
// rather than byte by byte.
type Tiktoken struct {
	name string
	enc  *tiktoken.Tiktoken
	cut  newlineCut
}

var (
	offlineOnce sync.Once
	encodingsMu sync.Mutex
	encodings   = map[string]*Tiktoken{} // building one takes ~100 ms; share it
)

// cutRules gives, per supported encoding, where its text may be cut (see
// newlineCut): o200k's punctuation pieces may run on through "\n/".
var cutRules = map[string]newlineCut{
	"cl100k_base": {afterAnyRun: true},
	"o200k_base":  {afterAnyRun: true, notBefore: "/"},
	"p50k_base":   {},
	"p50k_edit":   {},
	"r50k_base":   {},
}

// NewTiktoken returns the named encoding (cl100k_base, o200k_base,
// p50k_base, p50k_edit, r50k_base).
func NewTiktoken(encoding string) (*Tiktoken, error) {
	offlineOnce.Do(func() { tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader()) })
	encodingsMu.Lock()
	defer encodingsMu.Unlock()
	if t, ok := encodings[encoding]; ok {
		return t, nil
	}
	cut, ok := cutRules[encoding]
	if !ok {
		return nil, fmt.Errorf("tokenize: unknown tiktoken encoding %q", encoding)
	}
	enc, err := tiktoken.GetEncoding(encoding)
	if err != nil {
		return nil, fmt.Errorf("tokenize: load tiktoken encoding %q: %w", encoding, err)
	}
	t := &Tiktoken{name: "tiktoken:" + encoding, enc: enc, cut: cut}
	encodings[encoding] = t
	return t, nil
}

// Name returns "tiktoken:<encoding>".
func (t *Tiktoken) Name() string { return t.name }

var allSpecial = []string{"all"}

// Encode appends the ids of text to dst.
func (t *Tiktoken) Encode(text string, dst []uint32) (out []uint32, err error) {
	defer func() {
		// tiktoken-go panics on some inputs it deems invalid; a router
		// must answer with an error instead.
		if r := recover(); r != nil {
			out, err = dst, fmt.Errorf("tokenize: %s failed: %v", t.name, r)
		}
	}()
	for _, id := range t.enc.Encode(text, allSpecial, nil) {
		dst = append(dst, uint32(id))
	}
	return dst, nil
}

func (t *Tiktoken) cuttable() bool { return true }

func (t *Tiktoken) canCut(text string, c int) bool {
	return t.cut.ok(text, c)
}
