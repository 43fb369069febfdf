// Package kvformat is the one place in kvtier that knows how KV-cache bytes
// are laid out. The daemon moves a chunk around as opaque bytes plus a Spec;
// this package says what those bytes mean and converts them to and from an
// engine's paged KV buffer.
//
// # Chunks
//
// A chunk holds the keys and values of up to Spec.ChunkTokens consecutive
// tokens, for every layer, in one of LMCache's memory formats (Layout).
// Every token contributes, per layer, one K row and one V row (or, for MLA,
// one latent row) of Spec.RowBytes bytes: the token's [kv_heads, head_dim]
// elements, head-major, exactly as they sit in the engine's paged buffer.
// Element bytes are copied verbatim and never reinterpreted, so they keep
// the engine's byte order (little-endian on every platform vLLM and SGLang
// run on).
//
// With L layers, T tokens in the chunk, H = kv_heads*head_dim and element
// size E, byte b of element (head h, dim d) of token t in layer l sits at
//
//	KV_2LTD    [2, L, T, H]  K: (((0*L + l)*T + t)*H + h*head_dim + d)*E + b
//	                         V: (((1*L + l)*T + t)*H + h*head_dim + d)*E + b
//	KV_2TD     [L, 2, T, H]  K: (((l*2 + 0)*T + t)*H + h*head_dim + d)*E + b
//	KV_T2D     [L, T, 2, H]  K: (((l*T + t)*2 + 0)*H + h*head_dim + d)*E + b
//	KV_MLA_FMT [1, L, T, D]      ((l*T + t)*D + d)*E + b   (D = head_dim, one head)
//
// and V of KV_2TD and KV_T2D is the same with 1 in place of 0. In words,
// KV_2LTD (the main chunk format, LMCache's default) is all K rows of layer
// 0 in token order, then all K rows of layer 1, and so on to layer L-1; then
// the V rows in the same order. LMCache defines KV_2TD and KV_T2D for one
// layer; a kvtier chunk in those formats is the L one-layer objects
// concatenated in layer order, so each layer's part is contiguous and can
// be handed out as its own layerwise object.
//
// Note that T is the number of tokens actually in the chunk, which is less
// than ChunkTokens for a final partial chunk: the V half of a KV_2LTD chunk
// starts right after the last K row, not at a fixed offset.
//
// # Paged engine buffers
//
// Engines keep KV in fixed-size blocks and address a token by its slot,
// block_id*block_size + offset. Paged describes one such buffer per layer
// in one of three shapes (PagedKind). Gather copies the tokens at a list of
// slots into a chunk, Scatter copies them back, and GatherLayer and
// ScatterLayer do the same for a single layer so a connector can overlap
// loading layer l+1 with computing layer l. Consecutive slots within a
// block are contiguous rows in every paged shape, so runs of them move with
// one copy each; none of these functions allocates.
//
// # Header
//
// A Spec marshals to a fixed 32-byte little-endian header (see header.go)
// that remote tiers store next to each object, so an object read back from
// a shared store says what it is.
package kvformat
