// Package chunk cuts token sequences into fixed-size chunks and names each
// chunk with a key that every tier, daemon and router agrees on.
//
// A chunk's key is a chained hash: chunk i is hashed together with the hash
// of chunk i-1, so one key stands for the whole prefix up to and including
// its chunk. Two requests share a key exactly when they share every token up
// to that point. The chain starts from a seed derived from the Scope (model,
// parallel layout, KV format, namespace), so chunks never match across
// scopes. Everything that feeds the hashes is encoded in a fixed,
// length-prefixed, little-endian form, which makes keys identical across
// processes, restarts and machines of either byte order, with no seed or
// environment variable to configure.
//
// Besides kvtier's own keys (xxh3-128, see Chunker) the package computes the
// hashes the serving engines compute themselves, so that a connector or a
// router can key by what the engine already reports:
//
//   - vLLM prefix-cache block hashes with --prefix-caching-hash-algo
//     sha256_cbor (VLLMHasher), and their 64-bit KV-event form (EventHash);
//   - SGLang HiCache page keys (SGLangPageHash, SGLangPageKeys).
package chunk
