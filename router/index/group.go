package index

// KV-cache groups. A hybrid model (full attention beside sliding-window or
// Mamba layers) has one KV cache per group of layers, and vLLM reports each
// group's blocks with its group_idx. The block hashes of every group are
// computed from the same tokens, so the same hash in two groups names two
// different caches: a pod holding block h of group 1 (say, only the last
// sliding window) does not hold the prefix that block h of group 0 (full
// attention) stands for. Blocks must therefore be indexed and scored per
// group.
//
// Rather than widen every slot with a group field, a block is indexed under
// a key derived from its hash and group: group 0 keeps the hash itself, so
// non-hybrid models, events without a group_idx (vLLM before hybrid-model
// events, kvtier daemons) and requests that name no group work exactly as
// before; group g > 0 XORs the hash with a fixed 64-bit constant drawn from
// g. Two keys of different groups coincide only when two hashes differ by
// exactly that constant, as likely as two hashes colliding outright. Every
// Store (in memory or Redis) then keeps groups apart with no change, and
// the key costs nothing on the score path.

// MaxGroup is the largest KV-cache group index accepted. vLLM's hybrid
// models have a handful of groups; the bound only keeps nonsense out.
const MaxGroup = 1<<16 - 1

// ValidGroup reports whether g is a KV-cache group index (0..MaxGroup).
func ValidGroup(g int) bool { return g >= 0 && g <= MaxGroup }

// GroupKey returns the index key of block hash h in KV-cache group g (see
// above); g must satisfy ValidGroup. GroupKey(h, 0) == h.
func GroupKey(h uint64, g int) uint64 { return h ^ groupSalt(g) }

// GroupKeys rewrites hashes, in place, into their keys in group g.
func GroupKeys(hashes []uint64, g int) {
	if g == 0 {
		return
	}
	salt := groupSalt(g)
	for i := range hashes {
		hashes[i] ^= salt
	}
}

// groupSalt is 0 for group 0 and a well-mixed constant (SplitMix64's
// finalizer of g) otherwise; the finalizer is a bijection, so distinct
// groups get distinct salts.
func groupSalt(g int) uint64 {
	if g == 0 {
		return 0
	}
	z := uint64(g) * 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
