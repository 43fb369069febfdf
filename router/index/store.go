package index

// Store is what scorers, event ingestion and the score API need from a
// block index. *Index is the in-memory one; a shared index for several
// router replicas implements the same methods over an external store.
type Store interface {
	// Add records that pod holds the blocks in tier.
	Add(pod PodID, tier Tier, hashes []uint64) error
	// Remove records that pod no longer holds the blocks in tier.
	Remove(pod PodID, tier Tier, hashes []uint64) error
	// ClearPod drops every holding of pod.
	ClearPod(pod PodID)
	// ClearPodTier drops pod's holdings in one tier.
	ClearPodTier(pod PodID, tier Tier) error
	// Lookup calls visit with each block's holders, in prompt order (an
	// empty list for a block nobody holds), until visit returns false.
	// buf is scratch space for the holders and is returned, possibly grown.
	Lookup(hashes []uint64, buf []Entry, visit func(i int, holders []Entry) bool) []Entry
	// HolderWords appends block h's holders to dst as packed words (see
	// HolderWord), one per pod; the scorers read blocks this way.
	HolderWords(h uint64, dst []uint32) []uint32
}

// HolderWord packs one pod's holding of a block: the pod in the high 16
// bits, a bitmask of the tiers it holds the block in (bit t for Tier t) in
// the low bits.
func HolderWord(pod PodID, tiers uint32) uint32 { return holderWord(pod, tiers&holderTierMask) }

// HolderOf unpacks a holder word.
func HolderOf(w uint32) (PodID, uint32) { return holderPod(w), w & holderTierMask }

var _ Store = (*Index)(nil)

// Snapshotter is implemented by stores where reading block by block is
// slow (a store across the network): Snapshot reads every block of a
// prompt at once into a read-only Store that scorers then use.
type Snapshotter interface {
	Snapshot(hashes []uint64) (Store, error)
}
