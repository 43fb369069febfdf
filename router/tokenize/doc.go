// Package tokenize turns prompt text into token ids inside the router process,
// with no network access, so that a request carrying a prompt string can be
// scored against the block index exactly like one carrying token ids.
//
// Two families are supported behind one Tokenizer interface:
//
//   - tiktoken encodings (cl100k_base, o200k_base, p50k_base, r50k_base), whose
//     rank files are embedded in the binary by tiktoken-go-loader;
//   - Hugging Face tokenizer.json files describing a byte-level BPE model (GPT-2,
//     Llama 3, Qwen 2 and their relatives), with the BPE merge loop, the
//     byte-to-unicode alphabet and the regex pre-tokenizers written here.
//
// A tokenizer.json this package cannot reproduce exactly (WordPiece, Unigram,
// SentencePiece-style BPE, normalizers or split patterns it does not know) is
// refused at load time with an error naming the unsupported part: a router that
// tokenizes differently from the engine would silently score every prompt
// wrong, which is worse than not scoring strings at all.
//
// Encode reads text the way an engine reads an already templated prompt:
// special and added tokens written in the text are recognised as such, and no
// BOS/EOS or other post-processor tokens are added. Pool.EncodeSpecial reads
// it the way vLLM reads a completion request's prompt (add_special_tokens,
// true there): the tokens of tokenizer.json's post_processor, such as Llama
// 3's <|begin_of_text|>, are added around it (see SpecialTokenizer).
//
// Pool bounds the number of concurrent encoders and keeps a prefix cache: the
// text is cut at "safe" points (after a line feed, before a printable ASCII
// character; see newlineCut for the exact rule per pattern family), where no
// pre-tokenizer piece, normalization step or added-token match can straddle
// the cut, so the tokens of the whole text are the
// concatenation of the tokens of its segments. Segments are cached under the
// xxh3 hash of everything before their end, so prompts sharing a long prefix
// (system prompts, few-shot examples, chat history) are tokenized only once.
package tokenize
