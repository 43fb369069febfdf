package tokenize

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestHFMatchesTiktoken is the main correctness check of the HF loader: a
// tokenizer.json converted from cl100k_base must give exactly tiktoken's ids.
func TestHFMatchesTiktoken(t *testing.T) {
	t.Run("cl100k_base", func(t *testing.T) { testHFMatches(t, cl100kHF(t), tiktokenOf(t, "cl100k_base")) })
	t.Run("r50k_base", func(t *testing.T) { testHFMatches(t, r50kHF(t), tiktokenOf(t, "r50k_base")) })
}

func testHFMatches(t *testing.T, hf *BPE, tk *Tiktoken) {
	check := func(text string) {
		t.Helper()
		got, want := mustEncode(t, hf, text), mustEncode(t, tk, text)
		if !equalIDs(got, want) {
			t.Fatalf("text %q:\n hf       %v\n tiktoken %v", text, got, want)
		}
	}
	for _, text := range corpus {
		check(text)
	}
	check(strings.Join(corpus, "\n"))
	rng := rand.New(rand.NewPCG(1, 2))
	for range scaled(2000) {
		check(randomText(rng, 1+rng.IntN(30)))
	}
	// Long letter runs exercise deep merge sequences.
	for range scaled(3000) {
		word := make([]byte, 3+rng.IntN(12))
		for i := range word {
			word[i] = "etaoinshrdlucmfwypvbgkqjxz"[min(rng.IntN(26), rng.IntN(26))]
		}
		check(string(word))
	}
}

func TestHFKnownIDs(t *testing.T) {
	// Ids published for cl100k_base ("hello world" → [15339, 1917]).
	hf := cl100kHF(t)
	if got := mustEncode(t, hf, "hello world"); !equalIDs(got, []uint32{15339, 1917}) {
		t.Fatalf("hello world = %v, want [15339 1917]", got)
	}
}

func TestEncodeAppendsToDst(t *testing.T) {
	hf := cl100kHF(t)
	dst := make([]uint32, 1, 64)
	dst[0] = 7
	out, err := hf.Encode("hello world", dst)
	if err != nil {
		t.Fatal(err)
	}
	if !equalIDs(out, []uint32{7, 15339, 1917}) || &out[0] != &dst[0] {
		t.Fatalf("Encode did not append in place: %v", out)
	}
}

// toyJSON builds a small GPT-2 style tokenizer.json: the 256 byte symbols
// (ids 0..255 in byte order) plus the given extra tokens and string merges.
func toyJSON(preTokenizer, normalizer, extra string, merges []string, ignoreMerges bool, addedTokens string) []byte {
	var b strings.Builder
	b.WriteString(`{"added_tokens":[` + addedTokens + `],"normalizer":` + normalizer + `,"pre_tokenizer":` + preTokenizer + `,`)
	b.WriteString(`"model":{"type":"BPE","dropout":null,"ignore_merges":`)
	if ignoreMerges {
		b.WriteString("true")
	} else {
		b.WriteString("false")
	}
	b.WriteString(`,"vocab":{`)
	for i, r := range byteRunes {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(string(r)) + ":" + itoa(i))
	}
	if extra != "" {
		b.WriteString("," + extra)
	}
	b.WriteString(`},"merges":[`)
	for i, m := range merges {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(m))
	}
	b.WriteString("]}}")
	return []byte(b.String())
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}

const byteLevelPre = `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`

func TestHFToyByteLevel(t *testing.T) {
	// Ġ is the byte-level symbol of ' '.
	extra := `"Ġt":256,"he":257,"Ġthe":258,"Ġc":259,"at":260,"Ġcat":261,"xyz":262`
	merges := []string{"Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at"}
	tests := []struct {
		name, pre, norm, text string
		ignoreMerges          bool
		added                 string
		want                  []uint32
	}{
		{name: "merges", pre: byteLevelPre, norm: "null", text: " the cat", want: []uint32{258, 261}},
		{name: "first word has no space", pre: byteLevelPre, norm: "null", text: "the", want: []uint32{'t', 257}},
		{name: "lookahead leaves a space", pre: byteLevelPre, norm: "null", text: "a  the",
			want: []uint32{'a', ' ', 258}},
		{name: "prefix space", pre: `{"type":"ByteLevel","add_prefix_space":true,"use_regex":true}`, norm: "null",
			text: "the", want: []uint32{258}},
		{name: "whole piece without ignore_merges", pre: byteLevelPre, norm: "null", text: "xyz", want: []uint32{'x', 'y', 'z'}},
		{name: "whole piece with ignore_merges", pre: byteLevelPre, norm: "null", text: "xyz", ignoreMerges: true, want: []uint32{262}},
		{name: "NFC", pre: byteLevelPre, norm: `{"type":"NFC"}`, text: "e\u0301", want: []uint32{0xC3, 0xA9}},
		{name: "added token", pre: byteLevelPre, norm: "null", text: "a<s>b",
			added: `{"id":300,"content":"<s>","special":true}`, want: []uint32{'a', 300, 'b'}},
		{name: "added token strips", pre: byteLevelPre, norm: "null", text: "a  <m>  b",
			added: `{"id":301,"content":"<m>","lstrip":true,"rstrip":true}`, want: []uint32{'a', 301, 'b'}},
		{name: "longest added token wins", pre: byteLevelPre, norm: "null", text: "<ab>",
			added: `{"id":302,"content":"<a"},{"id":303,"content":"<ab>"}`, want: []uint32{303}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := ParseHF("toy", toyJSON(tt.pre, tt.norm, extra, merges, tt.ignoreMerges, tt.added))
			if err != nil {
				t.Fatal(err)
			}
			if got := mustEncode(t, tok, tt.text); !equalIDs(got, tt.want) {
				t.Fatalf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
			}
		})
	}
}

func TestHFRejectsUnsupported(t *testing.T) {
	base := func(pre, norm, model string) []byte {
		return []byte(`{"added_tokens":[],"normalizer":` + norm + `,"pre_tokenizer":` + pre + `,"model":` + model + `}`)
	}
	bpeModel := `{"type":"BPE","vocab":{"a":0},"merges":[]}`
	tests := []struct {
		name, mention string
		data          []byte
	}{
		{"WordPiece", `"WordPiece"`, base(byteLevelPre, "null", `{"type":"WordPiece","vocab":{"a":0}}`)},
		{"Unigram", `"Unigram"`, base(byteLevelPre, "null", `{"type":"Unigram","vocab":[["a",0.0]]}`)},
		{"Metaspace", "Metaspace", base(`{"type":"Metaspace","replacement":"▁"}`, "null", bpeModel)},
		{"no pre-tokenizer", "no pre_tokenizer", base("null", "null", bpeModel)},
		{"Lowercase", `"Lowercase"`, base(byteLevelPre, `{"type":"Lowercase"}`, bpeModel)},
		{"Replace in Sequence", `"Replace"`, base(byteLevelPre, `{"type":"Sequence","normalizers":[{"type":"Replace"}]}`, bpeModel)},
		{"unknown Split pattern", `\\p{N}+`, base(`{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]}`, "null", bpeModel)},
		{"Digits", "Digits", base(`{"type":"Sequence","pretokenizers":[{"type":"Digits"},{"type":"ByteLevel"}]}`, "null", bpeModel)},
		{"byte_fallback", "byte_fallback", base(byteLevelPre, "null", `{"type":"BPE","byte_fallback":true,"vocab":{"a":0},"merges":[]}`)},
		{"dropout", "dropout", base(byteLevelPre, "null", `{"type":"BPE","dropout":0.1,"vocab":{"a":0},"merges":[]}`)},
		{"subword prefix", "continuing_subword_prefix", base(byteLevelPre, "null", `{"type":"BPE","continuing_subword_prefix":"##","vocab":{"a":0},"merges":[]}`)},
		{"not byte-level vocab", "byte-level symbol", base(byteLevelPre, "null", bpeModel)},
		{"single_word", "single_word", toyJSON(byteLevelPre, "null", "", nil, false, `{"id":300,"content":"x","single_word":true}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseHF("bad", tt.data)
			if !errors.Is(err, ErrUnsupported) {
				t.Fatalf("err = %v, want ErrUnsupported", err)
			}
			if !strings.Contains(err.Error(), strings.ReplaceAll(tt.mention, `\\`, `\`)) {
				t.Fatalf("error %q does not name %s", err, tt.mention)
			}
		})
	}
}

func TestHFRejectsBrokenFiles(t *testing.T) {
	for name, data := range map[string][]byte{
		"not json":           []byte("{"),
		"empty vocab":        []byte(`{"pre_tokenizer":` + byteLevelPre + `,"model":{"type":"BPE","vocab":{},"merges":[]}}`),
		"merge out of vocab": toyJSON(byteLevelPre, "null", "", []string{"a b"}, false, ""),
		"merge not a pair":   toyJSON(byteLevelPre, "null", `"ab":256`, []string{"a b c"}, false, ""),
	} {
		if _, err := ParseHF("bad", data); err == nil {
			t.Errorf("%s: ParseHF succeeded", name)
		}
	}
}

func TestOpen(t *testing.T) {
	tok, err := Open("tiktoken:cl100k_base")
	if err != nil || tok.Name() != "tiktoken:cl100k_base" {
		t.Fatalf("Open(tiktoken:cl100k_base) = %v, %v", tok, err)
	}
	for _, spec := range []string{"tiktoken:nope", "sentencepiece:x", "hf:/nonexistent/tokenizer.json"} {
		if _, err := Open(spec); err == nil {
			t.Errorf("Open(%q) succeeded", spec)
		}
	}
}
