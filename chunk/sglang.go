package chunk

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// SGLang HiCache names each page of a prompt in its storage tier by a chained
// SHA-256. Confirmed against get_hash_str in
// python/sglang/srt/mem_cache/hicache_storage.py (and, in later releases, its
// move next to compute_node_hash_values and RadixKey.hash_page):
//
//	hasher = sha256()
//	if prior_hash:                      # hex string of the previous page
//	    hasher.update(bytes.fromhex(prior_hash))
//	for t in token_ids:
//	    hasher.update(t.to_bytes(4, "little", signed=False))
//	return hasher.hexdigest()
//
// So the previous page's hash is fed as its 32 decoded bytes, not as its hex
// text; the first page (prior None or "") feeds nothing before its tokens;
// each token is 4 bytes little-endian, unsigned; the key is lowercase hex.
// EAGLE's bigram mode, which feeds both ids of every (t_i, t_i+1) pair, is
// not covered here.

// SGLangPageHash returns the SHA-256 of prior (the previous page's 32-byte
// hash, or empty for the first page) followed by tokens as 4-byte
// little-endian values. Pages up to about 500 tokens hash without
// allocating.
func SGLangPageHash(prior []byte, tokens []uint32) [32]byte {
	var stack [encodeStackSize]byte
	buf := append(stack[:0], prior...)
	return sha256.Sum256(appendTokenBytes(buf, tokens))
}

// SGLangPageKeys appends the HiCache key (lowercase hex hash) of every full
// page of tokens to dst and returns the extended slice. A trailing partial
// page has no key, as HiCache stores whole pages only. pageSize must be
// positive; SGLangPageKeys panics otherwise. Each key is a new string.
func SGLangPageKeys(dst []string, tokens []uint32, pageSize int) []string {
	if pageSize <= 0 {
		panic(fmt.Sprintf("chunk: SGLang page size must be positive, got %d", pageSize))
	}
	var prior []byte
	var hash [32]byte
	for start := 0; start+pageSize <= len(tokens); start += pageSize {
		hash = SGLangPageHash(prior, tokens[start:start+pageSize])
		dst = append(dst, hex.EncodeToString(hash[:]))
		prior = hash[:]
	}
	return dst
}

// SGLangEventHash returns the signed 64-bit form SGLang's KV events use for a
// page hash (hash_str_to_int64): the first 8 bytes read big-endian, as a
// two's-complement int64.
func SGLangEventHash(h [32]byte) int64 { return int64(binary.BigEndian.Uint64(h[:8])) }
