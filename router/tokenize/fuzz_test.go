package tokenize

import (
	"context"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var (
	cl100kBytesOnce sync.Once
	cl100kBytes     map[uint32]string // id → the bytes it stands for
)

// decodeHF maps ids back to bytes through the loaded vocabulary.
func decodeHF(t testing.TB, tok *BPE, ids []uint32) string {
	cl100kBytesOnce.Do(func() {
		cl100kBytes = make(map[uint32]string, len(tok.merger.whole))
		for raw, id := range tok.merger.whole {
			cl100kBytes[id] = raw
		}
		for content, id := range cl100kSpecials {
			cl100kBytes[id] = content
		}
	})
	var b strings.Builder
	for _, id := range ids {
		s, ok := cl100kBytes[id]
		if !ok {
			t.Fatalf("id %d is not in the vocabulary", id)
		}
		b.WriteString(s)
	}
	return b.String()
}

// FuzzEncode: any bytes encode without error or panic; the HF tokens spell
// the input back byte for byte (invalid UTF-8 included); the HF tokenizer
// agrees with tiktoken on valid UTF-8; the pool agrees with the tokenizer.
func FuzzEncode(f *testing.F) {
	for _, s := range corpus {
		f.Add(s)
	}
	f.Add("\xff\xfe invalid \xc3 utf-8 \xe2\x82")
	f.Add("x\ny\nz\n<|endoftext|>\n/a\n")
	hf, tk := cl100kHF(f), tiktokenOf(f, "cl100k_base")
	pool := NewPool(hf, PoolOptions{Segment: 8, CacheBytes: 1 << 20})
	f.Fuzz(func(t *testing.T, text string) {
		got := mustEncode(t, hf, text)
		if back := decodeHF(t, hf, got); back != text {
			t.Fatalf("tokens of %q spell %q", text, back)
		}
		viaTiktoken := mustEncode(t, tk, text)
		// tiktoken-go turns invalid UTF-8 into U+FFFD, and its regex engine
		// does not fold ſ into s the way Rust's (?i) does.
		if utf8.ValidString(text) && !strings.ContainsRune(text, 'ſ') && !equalIDs(got, viaTiktoken) {
			t.Fatalf("%q: hf %v, tiktoken %v", text, got, viaTiktoken)
		}
		pooled, err := pool.Encode(context.Background(), text, nil)
		if err != nil || !equalIDs(pooled, got) {
			t.Fatalf("%q: pool %v (%v), tokenizer %v", text, pooled, err, got)
		}
	})
}

// FuzzParseHF: arbitrary tokenizer.json contents never panic, and whatever
// loads can encode.
func FuzzParseHF(f *testing.F) {
	f.Add(toyJSON(byteLevelPre, "null", `"Ġt":256`, []string{"Ġ t"}, true, `{"id":300,"content":"<s>","lstrip":true}`))
	f.Add(toyJSON(`{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":`+quote(qwen2Pattern)+`},"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]}`,
		`{"type":"Sequence","normalizers":[{"type":"NFC"}]}`, `"ab":256`, []string{"a b"}, false, ""))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","a"]]},"pre_tokenizer":{"type":"ByteLevel"}}`))
	f.Add([]byte(`{"model":{"type":"WordPiece"}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ParseHF("fuzz", data)
		if err != nil {
			return
		}
		for _, s := range []string{"", "hello world", " the  cat\n\n<s>x", "\xff\x00\u3000é"} {
			if _, err := tok.Encode(s, nil); err != nil {
				t.Fatalf("Encode(%q): %v", s, err)
			}
		}
	})
}
