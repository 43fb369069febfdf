package tokenize

import (
	"encoding/json"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// cl100kSpecials are cl100k_base's special tokens as tiktoken-go defines them.
var cl100kSpecials = map[string]uint32{
	"<|endoftext|>":   100257,
	"<|fim_prefix|>":  100258,
	"<|fim_middle|>":  100259,
	"<|fim_suffix|>":  100260,
	"<|endofprompt|>": 100276,
}

// r50kSpecials are r50k_base's.
var r50kSpecials = map[string]uint32{"<|endoftext|>": 50256}

// cl100kPreTokenizer is how Llama 3 style files write cl100k's split.
var cl100kPreTokenizer = map[string]any{
	"type": "Sequence",
	"pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": cl100kPattern}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	},
}

// gpt2PreTokenizer is GPT-2's: ByteLevel with its built-in regex.
var gpt2PreTokenizer = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}

// tiktokenAsHFJSON converts a tiktoken encoding's ranks into the
// tokenizer.json a Hugging Face conversion would produce: the vocabulary in
// the byte-level alphabet with ids equal to ranks, one merge for every way a
// token splits into two tokens (ordered by the rank of the result, which is
// the order tiktoken merges in), the encoding's split, and ignore_merges,
// since tiktoken emits a piece that is a whole token directly.
func tiktokenAsHFJSON(t testing.TB, encoding string, preTokenizer any, specials map[string]uint32) []byte {
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe(encoding + ".tiktoken")
	if err != nil {
		t.Fatalf("load %s ranks: %v", encoding, err)
	}
	type split struct {
		rank, leftRank int
		left, right    string
	}
	vocab := make(map[string]int, len(ranks))
	var splits []split
	for token, rank := range ranks {
		vocab[byteLevelString([]byte(token))] = rank
		for k := 1; k < len(token); k++ {
			l, okL := ranks[token[:k]]
			_, okR := ranks[token[k:]]
			if okL && okR {
				splits = append(splits, split{rank, l, token[:k], token[k:]})
			}
		}
	}
	sort.Slice(splits, func(i, j int) bool {
		if splits[i].rank != splits[j].rank {
			return splits[i].rank < splits[j].rank
		}
		return splits[i].leftRank < splits[j].leftRank
	})
	merges := make([][2]string, len(splits))
	for i, s := range splits {
		merges[i] = [2]string{byteLevelString([]byte(s.left)), byteLevelString([]byte(s.right))}
	}
	type added struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		Normalized bool   `json:"normalized"`
	}
	var addedTokens []added
	for content, id := range specials {
		addedTokens = append(addedTokens, added{ID: id, Content: content, Special: true})
	}
	doc := map[string]any{
		"version":        "1.0",
		"added_tokens":   addedTokens,
		"normalizer":     nil,
		"pre_tokenizer":  preTokenizer,
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
			"vocab": vocab, "merges": merges,
		},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("marshal tokenizer.json: %v", err)
	}
	return data
}

// convertedHF loads a converted tiktoken encoding once per test binary.
type convertedHF struct {
	once sync.Once
	tok  *BPE
	err  error
}

var cl100kConverted, r50kConverted convertedHF

func (c *convertedHF) get(t testing.TB, encoding string, preTokenizer any, specials map[string]uint32) *BPE {
	t.Helper()
	c.once.Do(func() {
		c.tok, c.err = ParseHF("hf:"+encoding+"-converted", tiktokenAsHFJSON(t, encoding, preTokenizer, specials))
	})
	if c.err != nil {
		t.Fatalf("ParseHF(converted %s): %v", encoding, c.err)
	}
	return c.tok
}

// cl100kHF is cl100k_base as a Llama 3 style tokenizer.json.
func cl100kHF(t testing.TB) *BPE {
	return cl100kConverted.get(t, "cl100k_base", cl100kPreTokenizer, cl100kSpecials)
}

// r50kHF is r50k_base (GPT-2) as a GPT-2 style tokenizer.json.
func r50kHF(t testing.TB) *BPE {
	return r50kConverted.get(t, "r50k_base", gpt2PreTokenizer, r50kSpecials)
}

func tiktokenOf(t testing.TB, encoding string) *Tiktoken {
	t.Helper()
	tok, err := NewTiktoken(encoding)
	if err != nil {
		t.Fatalf("NewTiktoken(%q): %v", encoding, err)
	}
	return tok
}

func mustEncode(t testing.TB, tok Tokenizer, text string) []uint32 {
	t.Helper()
	ids, err := tok.Encode(text, nil)
	if err != nil {
		t.Fatalf("%s.Encode(%q): %v", tok.Name(), text, err)
	}
	return ids
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// scaled shrinks a randomized test's case count under the race detector.
func scaled(n int) int {
	if raceEnabled {
		return max(n/8, 1)
	}
	return n
}

// TestEveryKindIsDocumented: docs/router.md names each tokenizer kind a
// spec may use, as "<kind>:", so the list cannot drift from Names.
func TestEveryKindIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/router.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Names() {
		if !strings.Contains(string(doc), "`"+k+":") {
			t.Errorf("docs/router.md does not name tokenizer kind %q", k)
		}
	}
	if _, err := Open("sentencepiece:/x"); err == nil || !strings.Contains(err.Error(), "hf:") {
		t.Errorf("unknown kind: %v, want an error listing the kinds", err)
	}
}
