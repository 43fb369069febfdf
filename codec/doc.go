// Package codec turns a chunk's KV bytes into the bytes a remote tier stores,
// and back. LMCache calls this step serde.
//
// A Codec is an encoding chosen by name (Lookup) and recorded in objects by
// a one-byte ID (ByID):
//
//	raw   the chunk as it is
//	zstd  lossless, Zstandard at its fastest level
//	lz4   lossless, LZ4 block format: less compression than zstd, faster
//	fp8   lossy, 8-bit float (e4m3) with a float32 scale per token per head
//	int8  lossy, symmetric 8-bit integers with a float32 scale per token per head
//
// The lossy codecs halve a float16 or bfloat16 chunk and decode it back to
// its original dtype. They rely on one fact of kvformat: in every layout a
// chunk is a sequence of rows of Spec.RowBytes bytes, each one token's
// [kv_heads, head_dim] elements for one layer and one of K or V. A scale per
// row and head is therefore the same thing whatever the layout, and the
// codecs never need to know which row belongs to which layer.
//
// A scale per token and head is what LMCache and most engines' fp8 KV
// caches use, and it is cheap to apply while loading. It is not the most
// accurate choice for K: keys carry a few outlier channels (KIVI, KVQuant)
// that set every token's scale, so the other channels of that head get
// coarse steps. Measure on SyntheticKV, which imitates those outliers,
// shows the effect.
//
// Seal wraps an encoded chunk in a self-describing envelope: a fixed
// HeaderSize-byte header (codec, kvformat spec, lengths, checksums; see
// envelope.go) followed by the payload. Unseal checks everything before it
// trusts anything, so an object read back from a shared store is either
// the chunk that was sealed or an error wrapping ErrCorrupt or ErrForeign.
//
// Measure and SyntheticKV let the benchmark command report ratio, speed and
// error of each codec on KV-shaped data without a model at hand.
package codec
