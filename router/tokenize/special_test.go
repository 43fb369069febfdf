package tokenize

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// testdata/bos-toy/tokenizer.json is a Llama 3 style file in miniature:
// <|begin_of_text|> (id 0) added by a Sequence[ByteLevel,
// TemplateProcessing] post_processor, and byte-level symbols with ids
// byte+1, so the text of bytes 0..14 encodes to ids 1..15 and, with special
// tokens, to 0..15 — the tokens of vLLM's block-hash test vectors.
const bosToy = "testdata/bos-toy/tokenizer.json"

func bosToyText() string {
	var b strings.Builder
	for c := byte(0); c < 15; c++ {
		b.WriteByte(c)
	}
	return b.String()
}

func TestEncodeSpecialAddsPostProcessorTokens(t *testing.T) {
	tok, err := LoadHF(bosToy)
	if err != nil {
		t.Fatal(err)
	}
	p := NewPool(tok, PoolOptions{})
	ctx := context.Background()
	plain, err := p.Encode(ctx, bosToyText(), nil)
	if err != nil {
		t.Fatal(err)
	}
	special, err := p.EncodeSpecial(ctx, bosToyText(), []uint32{99})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	if !slices.Equal(plain, want) {
		t.Errorf("Encode = %v, want %v", plain, want)
	}
	if want = append([]uint32{99, 0}, want...); !slices.Equal(special, want) {
		t.Errorf("EncodeSpecial = %v, want %v (dst kept, BOS added)", special, want)
	}
	// A prompt that already starts with BOS gets a second one, as in vLLM.
	twice, _ := p.EncodeSpecial(ctx, "<|begin_of_text|>a", nil)
	if !slices.Equal(twice, []uint32{0, 0, 'a' + 1}) {
		t.Errorf("EncodeSpecial(BOS + a) = %v", twice)
	}
}

func TestEncodeSpecialWithoutPostProcessorTokens(t *testing.T) {
	ctx := context.Background()
	for _, tok := range []Tokenizer{tiktokenOf(t, "cl100k_base"), cl100kHF(t)} {
		p := NewPool(tok, PoolOptions{})
		a, _ := p.Encode(ctx, "hello world", nil)
		b, err := p.EncodeSpecial(ctx, "hello world", nil)
		if err != nil || !slices.Equal(a, b) {
			t.Errorf("%s: EncodeSpecial = %v, %v; Encode = %v", tok.Name(), b, err, a)
		}
	}
}

func TestPostProcessors(t *testing.T) {
	toy := func(post string) []byte {
		return []byte(strings.Replace(string(toyJSON(byteLevelPre, "null", "", nil, false, "")), "{", `{"post_processor":`+post+",", 1))
	}
	tests := []struct {
		name, post     string
		prefix, suffix []uint32
		err            error // nil: loads
	}{
		{name: "none", post: "null"},
		{name: "byte level", post: `{"type":"ByteLevel","add_prefix_space":true}`},
		{name: "template", post: `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]},"</s>":{"id":"</s>","ids":[2],"tokens":["</s>"]}}}`,
			prefix: []uint32{1}, suffix: []uint32{2}},
		{name: "roberta", post: `{"type":"RobertaProcessing","sep":["</s>",2],"cls":["<s>",0],"trim_offsets":true}`,
			prefix: []uint32{0}, suffix: []uint32{2}},
		{name: "bert", post: `{"type":"BertProcessing","sep":["[SEP]",102],"cls":["[CLS]",101]}`,
			prefix: []uint32{101}, suffix: []uint32{102}},
		{name: "sequence wraps", post: `{"type":"Sequence","processors":[{"type":"BertProcessing","sep":["b",2],"cls":["a",1]},{"type":"RobertaProcessing","sep":["d",4],"cls":["c",3]}]}`,
			prefix: []uint32{3, 1}, suffix: []uint32{2, 4}},
		{name: "unknown", post: `{"type":"Mystery"}`, err: ErrUnsupported},
		{name: "template without sequence", post: `{"type":"TemplateProcessing","single":[],"special_tokens":{}}`, err: ErrUnsupported},
		{name: "template twice", post: `{"type":"TemplateProcessing","single":[{"Sequence":{"id":"A"}},{"Sequence":{"id":"A"}}]}`, err: ErrUnsupported},
		{name: "template empty piece", post: `{"type":"TemplateProcessing","single":[{}]}`, err: ErrUnsupported},
		{name: "template unknown token", post: `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<x>"}},{"Sequence":{"id":"A"}}],"special_tokens":{}}`, err: errAny},
		{name: "bad pair", post: `{"type":"BertProcessing","sep":["b"],"cls":["a",1]}`, err: errAny},
		{name: "bad sequence member", post: `{"type":"Sequence","processors":[{"type":"Mystery"}]}`, err: ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := ParseHF("toy", toy(tt.post))
			switch {
			case tt.err == nil && err != nil:
				t.Fatal(err)
			case tt.err != nil && err == nil:
				t.Fatalf("loaded; want an error")
			case tt.err != nil:
				if tt.err != errAny && !errors.Is(err, tt.err) {
					t.Fatalf("error %v, want %v", err, tt.err)
				}
				return
			}
			prefix, suffix := tok.SpecialTokens()
			if !slices.Equal(prefix, tt.prefix) || !slices.Equal(suffix, tt.suffix) {
				t.Errorf("SpecialTokens = %v, %v; want %v, %v", prefix, suffix, tt.prefix, tt.suffix)
			}
		})
	}
}

// errAny accepts any error.
var errAny = errors.New("any error")
