// Package index is the in-memory block index of kvtier's KV-aware router: it
// records which serving pods hold which KV blocks (keyed by the engine's
// 64-bit block hash) in which tier, and scores pods for a prompt's sequence
// of block hashes so the router can send the prompt where most of its prefix
// is already cached. A hybrid model's KV-cache groups are kept apart by
// keying each block with its group (GroupKey); group 0 keys are the hashes
// themselves.
//
// Layout. Blocks are spread over a power-of-two number of shards by a mixed
// hash; each shard has its own RWMutex and is a linear-probing table of
// 32-byte slots. A slot stores the block hash and up to four holders inline,
// a holder being a 32-bit word (pod id, tier bitmask); further holders go to
// 32-byte overflow chunks chained by index. Nothing in a table is a Go
// pointer, so the garbage collector never scans it, and a (block, pod) entry
// costs about 32/load-factor bytes for singly held blocks and 8 bytes once
// blocks are shared.
//
// Writes. Add and Remove take a batch of hashes at a time: they lock every
// shard the batch touches (in shard order, so writers cannot deadlock), load
// each hash's home slot in one branch-free pass so the CPU overlaps the
// cache misses, then apply the batch. Readers lock one shard per block.
//
// Bound. The index holds at most Config.MaxBlocks blocks. Inserting a new
// block into a full index first evicts a block from the same shard (whose
// lock is already held), chosen by CLOCK (second chance): adds and reads set
// a reference bit, the shard's hand clears set bits and evicts the first
// block found clear. Eviction is therefore approximately least-recently-used
// within a shard; since hashes spread evenly over shards, it approximates
// LRU overall. Each shard is also capped at 1.25 × its even share of
// MaxBlocks, which bounds its table; only a badly skewed spread reaches that
// cap first. The bound is exact for a single writer, with two
// exceptions that later inserts work off: an insert into an empty shard of a
// full index cannot evict (at most one block per shard), and concurrent
// writers see each other's inserts only when a batch completes (at most
// one write batch, 32 blocks, per concurrent writer).
package index

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
)

// Tier is where a pod holds a block.
type Tier uint8

// Tiers, fastest first.
const (
	GPU Tier = iota
	CPU
	Disk
	Remote
	NumTiers // number of tiers; not a tier
)

func (t Tier) String() string {
	switch t {
	case GPU:
		return "gpu"
	case CPU:
		return "cpu"
	case Disk:
		return "disk"
	case Remote:
		return "remote"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

func (t Tier) valid() bool { return t < NumTiers }

// Entry is one (pod, tier) holding of a block.
type Entry struct {
	Pod  PodID
	Tier Tier
}

// ErrBadTier is returned for a Tier outside GPU..Remote.
var ErrBadTier = errors.New("index: unknown tier")

// ErrBadConfig is returned by New for an unusable Config.
var ErrBadConfig = errors.New("index: bad config")

// shardSlack lets a shard hold 1/shardSlack more than its even share of
// MaxBlocks, so that the uneven spread of hashes over shards does not make
// one shard evict while the index as a whole has room.
const shardSlack = 4

// MaxShards is the largest Config.Shards.
const MaxShards = 1024

// DefaultShards is the shard count used when Config.Shards is zero.
const DefaultShards = 128

// Config sizes an Index.
type Config struct {
	// MaxBlocks bounds the number of distinct blocks held; required.
	MaxBlocks int
	// Shards is the number of independently locked shards, a power of two
	// up to MaxShards; 0 means DefaultShards. It is lowered when MaxBlocks is smaller.
	Shards int
	// Preallocate sizes every shard's table for its share of MaxBlocks up
	// front (about 53–107 bytes per block of MaxBlocks), so that filling the
	// index never pauses to rehash. Otherwise tables start small and double.
	Preallocate bool
}

// Index maps block hashes to the pods and tiers holding them. All methods
// are safe for concurrent use.
type Index struct {
	shards    []shard
	shardMask uint64
	maxBlocks int
	blocks    atomic.Int64  // sum of the shards' block counts
	warmSink  atomic.Uint32 // see warm
	maxPod    atomic.Uint32 // highest PodID ever added; sizes scorer scratch
}

// New returns an empty index bounded by cfg.MaxBlocks.
func New(cfg Config) (*Index, error) {
	if cfg.MaxBlocks <= 0 {
		return nil, fmt.Errorf("%w: MaxBlocks %d must be positive", ErrBadConfig, cfg.MaxBlocks)
	}
	n := cfg.Shards
	if n == 0 {
		n = DefaultShards
	}
	if n < 0 || n > MaxShards || n&(n-1) != 0 {
		return nil, fmt.Errorf("%w: Shards %d must be a power of two up to %d", ErrBadConfig, cfg.Shards, MaxShards)
	}
	for n > 1 && n > cfg.MaxBlocks {
		n /= 2
	}
	ix := &Index{shards: make([]shard, n), shardMask: uint64(n - 1), maxBlocks: cfg.MaxBlocks}
	shift := uint(bits.TrailingZeros(uint(n)))
	share := (cfg.MaxBlocks + n - 1) / n
	limit := share + share/shardSlack + 1
	for i := range ix.shards {
		ix.shards[i] = newShard(limit, shift, cfg.Preallocate)
	}
	return ix, nil
}

func (ix *Index) shardOf(h uint64) *shard { return &ix.shards[mix(h)&ix.shardMask] }

func (ix *Index) notePod(pod PodID) {
	for {
		cur := ix.maxPod.Load()
		if uint32(pod) <= cur || ix.maxPod.CompareAndSwap(cur, uint32(pod)) {
			return
		}
	}
}

// Add records that pod holds each of hashes in tier. Adding a holding that
// exists only refreshes the block's recency.
func (ix *Index) Add(pod PodID, tier Tier, hashes []uint64) error {
	if !tier.valid() {
		return fmt.Errorf("adding blocks of pod %d: %w %d", pod, ErrBadTier, tier)
	}
	ix.notePod(pod)
	bit := uint32(1) << tier
	ix.writeBatches(hashes, func(batch []uint64) int64 {
		room := ix.maxBlocks - int(ix.blocks.Load())
		start := room
		for _, h := range batch {
			ix.shardOf(h).add(h, pod, bit, &room)
		}
		return int64(start - room)
	})
	return nil
}

// writeBatches runs write on hashes batch by batch, each with its shards
// write-locked and their home slots warmed, and adds what write returns
// to the index's block count.
func (ix *Index) writeBatches(hashes []uint64, write func(batch []uint64) (blocksAdded int64)) {
	for len(hashes) > 0 {
		batch := hashes[:min(len(hashes), writeBatch)]
		hashes = hashes[len(batch):]
		locked := ix.lockShards(batch)
		ix.warm(batch)
		ix.blocks.Add(write(batch))
		ix.unlockShards(&locked)
	}
}

// writeBatch bounds how many hashes one write handles under one set of
// shard locks, and so how long readers may wait for those shards.
const writeBatch = 32

// shardSet is a bitmap of shard numbers.
type shardSet [MaxShards / 64]uint64

// lockShards write-locks every shard that one of hashes maps to, in shard
// order so that concurrent writers cannot deadlock. Taking the locks up
// front keeps atomic instructions out of the loop that then probes the
// tables, so the CPU can overlap the probes' cache misses.
func (ix *Index) lockShards(hashes []uint64) shardSet {
	var set shardSet
	for _, h := range hashes {
		n := mix(h) & ix.shardMask
		set[n/64] |= 1 << (n % 64)
	}
	for w, word := range set {
		for ; word != 0; word &= word - 1 {
			ix.shards[w*64+bits.TrailingZeros64(word)].mu.Lock()
		}
	}
	return set
}

// warm reads the home slot of each hash, with the shards locked. The loads
// are independent and branch-free, so the CPU overlaps their cache misses;
// the probes that follow then find the lines cached. Probing directly would
// take the misses one at a time, because each probe branches on its load.
func (ix *Index) warm(hashes []uint64) {
	var sum uint32
	for _, h := range hashes {
		m := mix(h)
		sh := &ix.shards[m&ix.shardMask]
		sum += sh.slots[int(m>>sh.shift)&(len(sh.slots)-1)].meta
	}
	ix.warmSink.Store(sum) // a use, so the compiler keeps the loads
}

func (ix *Index) unlockShards(set *shardSet) {
	for w, word := range set {
		for ; word != 0; word &= word - 1 {
			ix.shards[w*64+bits.TrailingZeros64(word)].mu.Unlock()
		}
	}
}

// Remove forgets that pod holds each of hashes in tier. A block left with no
// holder is deleted. Unknown blocks and holdings are ignored.
func (ix *Index) Remove(pod PodID, tier Tier, hashes []uint64) error {
	if !tier.valid() {
		return fmt.Errorf("removing blocks of pod %d: %w %d", pod, ErrBadTier, tier)
	}
	bit := uint32(1) << tier
	ix.writeBatches(hashes, func(batch []uint64) int64 {
		deleted := 0
		for _, h := range batch {
			sh := ix.shardOf(h)
			if pos := sh.find(h); pos >= 0 && sh.drop(pos, pod, bit) {
				deleted++
			}
		}
		return -int64(deleted)
	})
	return nil
}

// ClearPod removes every holding of pod (an AllBlocksCleared event, or the
// pod going away). It visits every slot of every shard, one shard locked at
// a time, so it costs time proportional to the index's capacity.
func (ix *Index) ClearPod(pod PodID) {
	ix.clear(pod, holderTierMask)
}

// ClearPodTier removes every holding of pod in tier.
func (ix *Index) ClearPodTier(pod PodID, tier Tier) error {
	if !tier.valid() {
		return fmt.Errorf("clearing tier of pod %d: %w %d", pod, ErrBadTier, tier)
	}
	ix.clear(pod, 1<<tier)
	return nil
}

func (ix *Index) clear(pod PodID, bits uint32) {
	for i := range ix.shards {
		sh := &ix.shards[i]
		sh.mu.Lock()
		ix.blocks.Add(-int64(sh.dropAll(pod, bits)))
		sh.mu.Unlock()
	}
}

// HolderWords implements Store: it appends the holder words of h to dst
// and marks h referenced.
func (ix *Index) HolderWords(h uint64, dst []uint32) []uint32 { return ix.readHolders(h, dst) }

// readHolders appends the holder words of h to dst and marks h referenced.
func (ix *Index) readHolders(h uint64, dst []uint32) []uint32 {
	sh := ix.shardOf(h)
	sh.mu.RLock()
	if pos := sh.find(h); pos >= 0 {
		s := &sh.slots[pos]
		touch(s)
		dst = sh.appendHolders(dst, s)
	}
	sh.mu.RUnlock()
	return dst
}

// Lookup calls visit for hashes[i] in order with the block's holders, one
// Entry per (pod, tier), empty when no pod holds it, until visit returns
// false. holders is only valid during the call. buf is scratch space; the
// possibly grown buffer is returned for reuse, so a caller that keeps it
// looks up without allocating. visit runs with no lock held.
func (ix *Index) Lookup(hashes []uint64, buf []Entry, visit func(i int, holders []Entry) bool) []Entry {
	var words [inlineHolders + chunkHolders]uint32
	for i, h := range hashes {
		buf = appendEntries(buf[:0], ix.readHolders(h, words[:0]))
		if !visit(i, buf) {
			break
		}
	}
	return buf
}

// Holders appends the (pod, tier) holdings of block h to dst.
func (ix *Index) Holders(h uint64, dst []Entry) []Entry {
	var words [inlineHolders + chunkHolders]uint32
	return appendEntries(dst, ix.readHolders(h, words[:0]))
}

func appendEntries(dst []Entry, words []uint32) []Entry {
	for _, w := range words {
		for t := Tier(0); t < NumTiers; t++ {
			if w&(1<<t) != 0 {
				dst = append(dst, Entry{Pod: holderPod(w), Tier: t})
			}
		}
	}
	return dst
}

// Stats is a snapshot of the index's size.
type Stats struct {
	Blocks    int    // distinct blocks held
	Entries   int    // (block, pod) holdings
	Capacity  int    // MaxBlocks
	Evictions uint64 // blocks evicted to stay within Capacity
}

// Stats sums the shards' counters; shards are read one at a time, so under
// concurrent writes the figures are not a single point in time.
func (ix *Index) Stats() Stats {
	st := Stats{Capacity: ix.maxBlocks}
	for i := range ix.shards {
		sh := &ix.shards[i]
		sh.mu.RLock()
		st.Blocks += sh.blocks
		st.Entries += sh.entries
		st.Evictions += sh.evictions
		sh.mu.RUnlock()
	}
	return st
}
