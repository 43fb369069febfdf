package chunk

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/fxamacker/cbor/v2"
)

// This file reproduces vLLM's (v1 engine) prefix-cache block hashes for
// --prefix-caching-hash-algo sha256_cbor, as in vllm/v1/core/kv_cache_utils.py
// (hash_block_tokens, init_none_hash, generate_block_hash_extra_keys) and
// vllm/utils/hashing.py (sha256_cbor) of the 2025-2026 releases, where a
// block hash is 32 raw bytes:
//
//	block_hash = sha256(cbor_canonical((parent or NONE_HASH, tuple(tokens), extra_keys)))
//	NONE_HASH  = sha256(cbor_canonical(PYTHONHASHSEED))   # a text string
//
// extra_keys is None or a tuple whose items are, in this order: the LoRA
// name (every block), (multimodal identifier, offset of the item relative to
// the block start) pairs for the items overlapping the block, the
// cache_salt (first block only) and a 32-byte digest of the block's prompt
// embeddings. The common inputs are encoded by hand into a stack buffer, so
// hashing a block does not allocate; BlockHashAny takes arbitrary extra keys
// through fxamacker/cbor's canonical mode, the same rules as Python's
// cbor2.dumps(x, canonical=True).

// CBOR major types (RFC 8949 section 3.1), shifted into the high 3 bits.
const (
	cborUnsigned byte = 0 << 5
	cborNegative byte = 1 << 5
	cborBytes    byte = 2 << 5
	cborText     byte = 3 << 5
	cborArray    byte = 4 << 5
	cborNull     byte = 0xf6
)

// encodeStackSize is the stack buffer BlockHash encodes into. It holds a
// block of about 400 tokens with typical extra keys; larger inputs spill to
// the heap (one allocation per block).
const encodeStackSize = 2048

// VLLMHasher computes vLLM block hashes for one PYTHONHASHSEED and block
// size. It is immutable and safe for concurrent use.
type VLLMHasher struct {
	noneHash  [32]byte
	blockSize int
}

// NewVLLMHasher returns a hasher matching a vLLM engine started with
// PYTHONHASHSEED=pythonHashSeed and the given block size (vLLM's default is
// 16). A vLLM started without PYTHONHASHSEED draws NONE_HASH at random and
// its hashes cannot be reproduced anywhere else.
func NewVLLMHasher(pythonHashSeed string, blockSize int) (*VLLMHasher, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: vLLM block size %d", ErrChunkSize, blockSize)
	}
	var stack [encodeStackSize]byte
	return &VLLMHasher{
		noneHash:  sha256.Sum256(appendCBORText(stack[:0], pythonHashSeed)),
		blockSize: blockSize,
	}, nil
}

// NoneHash returns NONE_HASH, the parent hash used for a prompt's first block.
func (h *VLLMHasher) NoneHash() [32]byte { return h.noneHash }

// BlockSize returns the number of tokens per block.
func (h *VLLMHasher) BlockSize() int { return h.blockSize }

// ExtraKey is one item of a block's extra_keys tuple. Make it with TextKey,
// IntKey, BytesKey or MMKey; the zero ExtraKey stands for Python's None.
type ExtraKey struct {
	kind  extraKind
	text  string
	bytes []byte
	n     int64
}

type extraKind uint8

const (
	extraNone extraKind = iota
	extraText
	extraBytes
	extraInt
	extraMM
)

// TextKey is a text item: a LoRA name, a cache_salt, or (in vLLM releases
// before multimodal offsets) a multimodal hash.
func TextKey(s string) ExtraKey { return ExtraKey{kind: extraText, text: s} }

// IntKey is an integer item.
func IntKey(n int64) ExtraKey { return ExtraKey{kind: extraInt, n: n} }

// BytesKey is a byte-string item, such as the SHA-256 digest vLLM computes
// for a block's prompt embeddings. b is not copied.
func BytesKey(b []byte) ExtraKey { return ExtraKey{kind: extraBytes, bytes: b} }

// MMKey is a multimodal item: the pair (identifier, offset), where offset is
// the item's start relative to the block's first token (negative when the
// item began in an earlier block).
func MMKey(identifier string, offset int64) ExtraKey {
	return ExtraKey{kind: extraMM, text: identifier, n: offset}
}

// value returns the item as the Go value fxamacker/cbor encodes the same way.
func (k ExtraKey) value() any {
	switch k.kind {
	case extraText:
		return k.text
	case extraBytes:
		return k.bytes
	case extraInt:
		return k.n
	case extraMM:
		return []any{k.text, k.n}
	default:
		return nil
	}
}

// BlockHash returns the hash of one full block. parent is the previous
// block's hash when hasParent is set; the first block of a prompt passes
// hasParent false and is chained to NONE_HASH. extra holds the block's extra
// keys in vLLM's order; empty means None. Blocks up to a few hundred tokens
// are hashed without allocating.
func (h *VLLMHasher) BlockHash(parent [32]byte, hasParent bool, tokens []uint32, extra []ExtraKey) [32]byte {
	if !hasParent {
		parent = h.noneHash
	}
	var stack [encodeStackSize]byte
	return sha256.Sum256(appendBlockInput(stack[:0], &parent, tokens, extra))
}

// VLLMRequest holds the per-request values vLLM mixes into block hashes
// besides the tokens. Multimodal items are not covered: their keys depend
// on item positions, so hash such blocks one by one with BlockHash and MMKey.
type VLLMRequest struct {
	LoRAName  string // added to every block; empty means no LoRA adapter
	CacheSalt string // added to the first block only; empty means no salt
}

// BlockHashes appends the chained hashes of every full block of a prompt to
// dst and returns the extended slice, as vLLM computes request.block_hashes.
// A trailing partial block has no hash. It does not allocate when cap(dst)
// suffices.
func (h *VLLMHasher) BlockHashes(dst [][32]byte, tokens []uint32, req VLLMRequest) [][32]byte {
	var parent [32]byte
	var keys [2]ExtraKey
	for start := 0; start+h.blockSize <= len(tokens); start += h.blockSize {
		extra := keys[:0]
		if req.LoRAName != "" {
			extra = append(extra, TextKey(req.LoRAName))
		}
		if start == 0 && req.CacheSalt != "" {
			extra = append(extra, TextKey(req.CacheSalt))
		}
		parent = h.BlockHash(parent, start > 0, tokens[start:start+h.blockSize], extra)
		dst = append(dst, parent)
	}
	return dst
}

// BlockHashAny is BlockHash for extra keys of any shape, encoded by
// fxamacker/cbor in canonical mode: nil is None, []any a tuple, string a
// text string, []byte a byte string, integers are integers. It allocates
// and is meant for inputs ExtraKey cannot express.
func (h *VLLMHasher) BlockHashAny(parent [32]byte, hasParent bool, tokens []uint32, extra []any) ([32]byte, error) {
	if !hasParent {
		parent = h.noneHash
	}
	encoded, err := canonicalBlockInput(&parent, tokens, extra)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(encoded), nil
}

// EventHash returns the integer form vLLM's KV events carry for a block hash
// (the default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the digest read as a
// big-endian integer, truncated to its low 64 bits, i.e. its last 8 bytes.
func EventHash(h [32]byte) uint64 { return binary.BigEndian.Uint64(h[24:]) }

// canonicalEncoder is fxamacker/cbor's canonical mode (RFC 7049 canonical:
// shortest integer and length forms, definite lengths), the library
// reference for the hand-written encoder below.
var canonicalEncoder = sync.OnceValues(func() (cbor.EncMode, error) {
	return cbor.CanonicalEncOptions().EncMode()
})

// canonicalBlockInput encodes (parent, tokens, extra) with fxamacker/cbor.
func canonicalBlockInput(parent *[32]byte, tokens []uint32, extra []any) ([]byte, error) {
	enc, err := canonicalEncoder()
	if err != nil {
		return nil, fmt.Errorf("chunk: canonical CBOR mode: %w", err)
	}
	var extraValue any // nil encodes as CBOR null, Python's None
	if len(extra) > 0 {
		extraValue = extra
	}
	b, err := enc.Marshal([]any{parent[:], tokens, extraValue})
	if err != nil {
		return nil, fmt.Errorf("chunk: encoding vLLM block hash input: %w", err)
	}
	return b, nil
}

// appendBlockInput appends the canonical CBOR encoding of the 3-array
// [parent as a 32-byte byte string, tokens as unsigned ints, extra or null].
func appendBlockInput(dst []byte, parent *[32]byte, tokens []uint32, extra []ExtraKey) []byte {
	dst = appendCBORHead(dst, cborArray, 3)
	dst = appendCBORHead(dst, cborBytes, uint64(len(parent)))
	dst = append(dst, parent[:]...)
	dst = appendCBORHead(dst, cborArray, uint64(len(tokens)))
	for _, t := range tokens {
		dst = appendCBORHead(dst, cborUnsigned, uint64(t))
	}
	if len(extra) == 0 {
		return append(dst, cborNull)
	}
	dst = appendCBORHead(dst, cborArray, uint64(len(extra)))
	for i := range extra {
		dst = appendExtraKey(dst, &extra[i])
	}
	return dst
}

func appendExtraKey(dst []byte, k *ExtraKey) []byte {
	switch k.kind {
	case extraText:
		return appendCBORText(dst, k.text)
	case extraBytes:
		dst = appendCBORHead(dst, cborBytes, uint64(len(k.bytes)))
		return append(dst, k.bytes...)
	case extraInt:
		return appendCBORInt(dst, k.n)
	case extraMM:
		dst = appendCBORHead(dst, cborArray, 2)
		dst = appendCBORText(dst, k.text)
		return appendCBORInt(dst, k.n)
	default:
		return append(dst, cborNull)
	}
}

func appendCBORText(dst []byte, s string) []byte {
	dst = appendCBORHead(dst, cborText, uint64(len(s)))
	return append(dst, s...)
}

// appendCBORInt encodes n as major type 0 when n >= 0 and as major type 1
// (the value -1-n) when negative, as CBOR requires.
func appendCBORInt(dst []byte, n int64) []byte {
	if n >= 0 {
		return appendCBORHead(dst, cborUnsigned, uint64(n))
	}
	return appendCBORHead(dst, cborNegative, uint64(-1-n))
}

// appendCBORHead appends a data item head in its shortest form: the value
// in the low 5 bits when below 24, else in 1, 2, 4 or 8 big-endian bytes.
func appendCBORHead(dst []byte, major byte, n uint64) []byte {
	switch {
	case n < 24:
		return append(dst, major|byte(n))
	case n <= 0xff:
		return append(dst, major|24, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, major|25), uint16(n))
	case n <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(dst, major|26), uint32(n))
	default:
		return binary.BigEndian.AppendUint64(append(dst, major|27), n)
	}
}
