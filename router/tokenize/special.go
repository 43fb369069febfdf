package tokenize

import (
	"context"
	"encoding/json"
	"fmt"
)

// SpecialTokenizer is implemented by tokenizers that add tokens around an
// encoded text when asked for special tokens: what Hugging Face's
// add_special_tokens=True does by applying tokenizer.json's post_processor,
// and what vLLM does to a completion request's prompt (its
// add_special_tokens defaults to true there, and to false for chat, whose
// template writes the tokens itself). Llama 3 style files prepend
// <|begin_of_text|>; GPT-2 and Qwen 2 style files add nothing.
type SpecialTokenizer interface {
	// SpecialTokens returns the ids put before and after a single text.
	// The slices must not be modified.
	SpecialTokens() (prefix, suffix []uint32)
}

// EncodeSpecial is Encode with the tokenizer's special tokens added around
// the text (see SpecialTokenizer); a tokenizer that adds none (tiktoken
// encodings, a tokenizer.json without a post_processor) encodes as Encode.
// The text is encoded as is, with no chat template.
func (p *Pool) EncodeSpecial(ctx context.Context, text string, dst []uint32) ([]uint32, error) {
	st, ok := p.tok.(SpecialTokenizer)
	if !ok {
		return p.Encode(ctx, text, dst)
	}
	prefix, suffix := st.SpecialTokens()
	dst = append(dst, prefix...)
	dst, err := p.Encode(ctx, text, dst)
	if err != nil {
		return dst, err
	}
	return append(dst, suffix...), nil
}

// SpecialTokens implements SpecialTokenizer.
func (t *BPE) SpecialTokens() (prefix, suffix []uint32) { return t.prefix, t.suffix }

var _ SpecialTokenizer = (*BPE)(nil)

// hfPostProcessor is tokenizer.json's post_processor: what a single text's
// ids are wrapped in when special tokens are asked for. The pair and
// offset-trimming parts do not change a single text's ids.
type hfPostProcessor struct {
	Type       string            `json:"type"`
	Processors []hfPostProcessor `json:"processors"` // Sequence
	// TemplateProcessing: the single-text template and the ids of its
	// special tokens.
	Single        []hfTemplatePiece                 `json:"single"`
	SpecialTokens map[string]struct{ IDs []uint32 } `json:"special_tokens"`
	// BertProcessing, RobertaProcessing: [token, id] pairs.
	Cls []json.RawMessage `json:"cls"`
	Sep []json.RawMessage `json:"sep"`
}

type hfTemplatePiece struct {
	SpecialToken *struct{ ID string } `json:"SpecialToken"`
	Sequence     *struct{ ID string } `json:"Sequence"`
}

// specialTokensOf returns the ids a post_processor puts before and after
// a single text. It refuses a post-processor it does not know, since
// guessing would give prompts a different start than the engine's.
func specialTokensOf(pp *hfPostProcessor) (prefix, suffix []uint32, err error) {
	if pp == nil {
		return nil, nil, nil
	}
	switch pp.Type {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		// Each processor works on the output of the one before, so later
		// ones wrap the earlier ones' tokens.
		for i := range pp.Processors {
			p, s, err := specialTokensOf(&pp.Processors[i])
			if err != nil {
				return nil, nil, err
			}
			prefix = append(append([]uint32(nil), p...), prefix...)
			suffix = append(suffix, s...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		return templateTokens(pp)
	case "BertProcessing", "RobertaProcessing":
		cls, err := pairID(pp.Type+" cls", pp.Cls)
		if err != nil {
			return nil, nil, err
		}
		sep, err := pairID(pp.Type+" sep", pp.Sep)
		if err != nil {
			return nil, nil, err
		}
		return []uint32{cls}, []uint32{sep}, nil
	}
	return nil, nil, unsupported("post_processor %q", pp.Type)
}

// templateTokens reads a TemplateProcessing's single-text template: the
// special tokens before the sequence are the prefix, those after it the
// suffix.
func templateTokens(pp *hfPostProcessor) (prefix, suffix []uint32, err error) {
	seen := false
	for _, piece := range pp.Single {
		switch {
		case piece.Sequence != nil:
			if seen {
				return nil, nil, unsupported("TemplateProcessing with the sequence twice")
			}
			seen = true
		case piece.SpecialToken != nil:
			tok, ok := pp.SpecialTokens[piece.SpecialToken.ID]
			if !ok || len(tok.IDs) == 0 {
				return nil, nil, fmt.Errorf("tokenize: TemplateProcessing names special token %q without ids", piece.SpecialToken.ID)
			}
			if seen {
				suffix = append(suffix, tok.IDs...)
			} else {
				prefix = append(prefix, tok.IDs...)
			}
		default:
			return nil, nil, unsupported("TemplateProcessing piece that is neither SpecialToken nor Sequence")
		}
	}
	if !seen {
		return nil, nil, unsupported("TemplateProcessing without the sequence")
	}
	return prefix, suffix, nil
}

// pairID reads the id of a [token, id] pair.
func pairID(what string, pair []json.RawMessage) (uint32, error) {
	var id uint32
	if len(pair) != 2 || json.Unmarshal(pair[1], &id) != nil {
		return 0, fmt.Errorf("tokenize: %s is not a [token, id] pair", what)
	}
	return id, nil
}
