package index

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"unsafe"
)

func newIndex(t testing.TB, maxBlocks, shards int) *Index {
	t.Helper()
	ix, err := New(Config{MaxBlocks: maxBlocks, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func mustAdd(t testing.TB, ix *Index, pod PodID, tier Tier, hashes ...uint64) {
	t.Helper()
	if err := ix.Add(pod, tier, hashes); err != nil {
		t.Fatal(err)
	}
}

func mustRemove(t testing.TB, ix *Index, pod PodID, tier Tier, hashes ...uint64) {
	t.Helper()
	if err := ix.Remove(pod, tier, hashes); err != nil {
		t.Fatal(err)
	}
}

func sortEntries(e []Entry) []Entry {
	slices.SortFunc(e, func(a, b Entry) int {
		if a.Pod != b.Pod {
			return int(a.Pod) - int(b.Pod)
		}
		return int(a.Tier) - int(b.Tier)
	})
	return e
}

// checkInvariants verifies every shard's internal bookkeeping: counters
// match the slots, every block is reachable by probing, holders are unique
// with a non-empty tier mask, and every overflow chunk is either in exactly
// one chain or on the free list.
func checkInvariants(t testing.TB, ix *Index) {
	t.Helper()
	checkInvariantsWithin(t, ix, 0)
}

// checkInvariantsAllowingOvershoot lets the block count exceed MaxBlocks by
// one per shard: inserts into empty shards of a full index.
func checkInvariantsAllowingOvershoot(t testing.TB, ix *Index) {
	t.Helper()
	checkInvariantsWithin(t, ix, len(ix.shards))
}

func checkInvariantsWithin(t testing.TB, ix *Index, overshoot int) {
	t.Helper()
	total := 0
	for si := range ix.shards {
		sh := &ix.shards[si]
		sh.mu.RLock()
		total += sh.blocks
		blocks, entries := 0, 0
		chunkUse := make([]int, len(sh.chunks))
		for pos := range sh.slots {
			s := &sh.slots[pos]
			n := int(s.meta & metaCountMask)
			if n == 0 {
				if s.ovf != 0 {
					t.Errorf("shard %d slot %d: empty slot with overflow chain", si, pos)
				}
				continue
			}
			blocks++
			entries += n
			if got := sh.find(s.hash); got != pos {
				t.Errorf("shard %d: block %x at %d found at %d", si, s.hash, pos, got)
			}
			if mix(s.hash)&ix.shardMask != uint64(si) {
				t.Errorf("block %x in wrong shard %d", s.hash, si)
			}
			words := sh.appendHolders(nil, s)
			seen := map[PodID]bool{}
			for _, w := range words {
				if w&holderTierMask == 0 || w&^(holderTierMask|0xffff0000) != 0 {
					t.Errorf("block %x: bad holder word %#x", s.hash, w)
				}
				if seen[holderPod(w)] {
					t.Errorf("block %x: pod %d held twice", s.hash, holderPod(w))
				}
				seen[holderPod(w)] = true
			}
			wantChunks := 0
			if n > inlineHolders {
				wantChunks = (n - inlineHolders + chunkHolders - 1) / chunkHolders
			}
			got := 0
			for c := s.ovf; c != 0; c = sh.chunks[c-1].next {
				chunkUse[c-1]++
				got++
			}
			if got != wantChunks {
				t.Errorf("block %x: %d holders in %d chunks, want %d", s.hash, n, got, wantChunks)
			}
		}
		for c := sh.freeChunk; c != 0; c = sh.chunks[c-1].next {
			chunkUse[c-1]++
		}
		for c, use := range chunkUse {
			if use != 1 {
				t.Errorf("shard %d chunk %d used %d times", si, c+1, use)
			}
		}
		if blocks != sh.blocks || entries != sh.entries {
			t.Errorf("shard %d: counters blocks=%d entries=%d, slots say %d, %d", si, sh.blocks, sh.entries, blocks, entries)
		}
		if sh.blocks > sh.limit {
			t.Errorf("shard %d over its limit: %d > %d", si, sh.blocks, sh.limit)
		}
		sh.mu.RUnlock()
	}
	if got := ix.blocks.Load(); got != int64(total) {
		t.Errorf("index-wide block count %d, shards hold %d", got, total)
	}
	if total > ix.maxBlocks+overshoot {
		t.Errorf("%d blocks exceed MaxBlocks %d", total, ix.maxBlocks)
	}
}

// podHoldings counts pod's (block, tier) holdings by scanning every slot.
func podHoldings(ix *Index, pod PodID) int {
	n := 0
	for si := range ix.shards {
		sh := &ix.shards[si]
		sh.mu.RLock()
		for pos := range sh.slots {
			for _, w := range sh.appendHolders(nil, &sh.slots[pos]) {
				if holderPod(w) == pod {
					for t := range NumTiers {
						if w&(1<<t) != 0 {
							n++
						}
					}
				}
			}
		}
		sh.mu.RUnlock()
	}
	return n
}

func TestSlotIs32Bytes(t *testing.T) {
	if s, c := unsafe.Sizeof(slot{}), unsafe.Sizeof(chunk{}); s != 32 || c != 32 {
		t.Fatalf("slot %d bytes, chunk %d bytes; want 32 and 32", s, c)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{{MaxBlocks: 0}, {MaxBlocks: -1}, {MaxBlocks: 10, Shards: 3}, {MaxBlocks: 10, Shards: -4}} {
		if _, err := New(cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("New(%+v) error %v, want ErrBadConfig", cfg, err)
		}
	}
	ix := newIndex(t, 10, 128)
	if len(ix.shards) > 10 {
		t.Errorf("MaxBlocks 10 gave %d shards; each shard needs room for a block", len(ix.shards))
	}
	if got := ix.Stats().Capacity; got != 10 {
		t.Errorf("capacity %d, want 10", got)
	}
}

func TestBadTier(t *testing.T) {
	ix := newIndex(t, 100, 4)
	if err := ix.Add(1, NumTiers, []uint64{1}); !errors.Is(err, ErrBadTier) {
		t.Errorf("Add: %v", err)
	}
	if err := ix.Remove(1, 7, []uint64{1}); !errors.Is(err, ErrBadTier) {
		t.Errorf("Remove: %v", err)
	}
	if err := ix.ClearPodTier(1, 9); !errors.Is(err, ErrBadTier) {
		t.Errorf("ClearPodTier: %v", err)
	}
	if st := ix.Stats(); st.Blocks != 0 {
		t.Errorf("bad-tier add stored %d blocks", st.Blocks)
	}
}

func TestAddHoldersLookup(t *testing.T) {
	ix := newIndex(t, 100, 4)
	mustAdd(t, ix, 1, GPU, 10, 20, 30)
	mustAdd(t, ix, 2, CPU, 20)
	mustAdd(t, ix, 1, CPU, 20)
	mustAdd(t, ix, 1, GPU, 20) // repeat: no new entry

	if got, want := sortEntries(ix.Holders(20, nil)), []Entry{{1, GPU}, {1, CPU}, {2, CPU}}; !slices.Equal(got, want) {
		t.Errorf("Holders(20) = %v, want %v", got, want)
	}
	if got := ix.Holders(40, nil); len(got) != 0 {
		t.Errorf("Holders(40) = %v, want none", got)
	}
	st := ix.Stats()
	if st.Blocks != 3 || st.Entries != 4 {
		t.Errorf("stats %+v, want 3 blocks, 4 entries", st)
	}

	var visited []int
	var counts []int
	ix.Lookup([]uint64{10, 40, 20, 30}, nil, func(i int, h []Entry) bool {
		visited = append(visited, i)
		counts = append(counts, len(h))
		return i < 2
	})
	if !slices.Equal(visited, []int{0, 1, 2}) || !slices.Equal(counts, []int{1, 0, 3}) {
		t.Errorf("Lookup visited %v with counts %v, want [0 1 2] / [1 0 3]", visited, counts)
	}
	checkInvariants(t, ix)
}

func TestRemove(t *testing.T) {
	ix := newIndex(t, 100, 4)
	mustAdd(t, ix, 1, GPU, 10, 20)
	mustAdd(t, ix, 1, CPU, 10)
	mustAdd(t, ix, 2, Disk, 10)

	mustRemove(t, ix, 1, GPU, 10)
	if got, want := sortEntries(ix.Holders(10, nil)), []Entry{{1, CPU}, {2, Disk}}; !slices.Equal(got, want) {
		t.Errorf("after removing GPU: %v, want %v", got, want)
	}
	mustRemove(t, ix, 1, CPU, 10)
	mustRemove(t, ix, 3, CPU, 10)    // unknown pod
	mustRemove(t, ix, 2, Remote, 10) // tier not held
	mustRemove(t, ix, 1, GPU, 999)   // unknown block
	if got, want := ix.Holders(10, nil), []Entry{{2, Disk}}; !slices.Equal(got, want) {
		t.Errorf("after removing pod 1: %v, want %v", got, want)
	}
	if st := ix.Stats(); st.Blocks != 2 || st.Entries != 2 {
		t.Errorf("stats %+v, want 2 blocks, 2 entries", st)
	}
	mustRemove(t, ix, 2, Disk, 10)
	mustRemove(t, ix, 1, GPU, 20)
	if st := ix.Stats(); st.Blocks != 0 || st.Entries != 0 {
		t.Errorf("stats %+v after removing everything, want empty", st)
	}
	checkInvariants(t, ix)
}

// TestManyHoldersOverflow puts more pods on one block than fit inline and
// removes them in random order, checking chunk bookkeeping at each step.
func TestManyHoldersOverflow(t *testing.T) {
	ix := newIndex(t, 100, 1)
	const pods = 40
	for p := range PodID(pods) {
		mustAdd(t, ix, p, Tier(p%4), 7)
	}
	if got := len(ix.Holders(7, nil)); got != pods {
		t.Fatalf("%d holders, want %d", got, pods)
	}
	checkInvariants(t, ix)
	r := rand.New(rand.NewPCG(1, 2))
	order := r.Perm(pods)
	for i, p := range order {
		mustRemove(t, ix, PodID(p), Tier(p%4), 7)
		hs := ix.Holders(7, nil)
		if len(hs) != pods-i-1 || slices.Contains(hs, Entry{PodID(p), Tier(p % 4)}) {
			t.Fatalf("after removing %d pods: %d holders (pod %d present: %v)", i+1, len(hs), p,
				slices.Contains(hs, Entry{PodID(p), Tier(p % 4)}))
		}
		checkInvariants(t, ix)
	}
	if st := ix.Stats(); st.Blocks != 0 {
		t.Errorf("block still present: %+v", st)
	}
	sh := &ix.shards[0]
	free := 0
	for c := sh.freeChunk; c != 0; c = sh.chunks[c-1].next {
		free++
	}
	if free != len(sh.chunks) {
		t.Errorf("%d of %d chunks free after removing all holders", free, len(sh.chunks))
	}
}

// model is a reference implementation: block → pod → tier mask.
type model map[uint64]map[PodID]uint32

func (m model) add(pod PodID, tier Tier, hs []uint64) {
	for _, h := range hs {
		if m[h] == nil {
			m[h] = map[PodID]uint32{}
		}
		m[h][pod] |= 1 << tier
	}
}

func (m model) drop(h uint64, pod PodID, bits uint32) {
	if m[h] == nil {
		return
	}
	m[h][pod] &^= bits
	if m[h][pod] == 0 {
		delete(m[h], pod)
	}
	if len(m[h]) == 0 {
		delete(m, h)
	}
}

func (m model) entries() int {
	n := 0
	for _, ps := range m {
		n += len(ps)
	}
	return n
}

func compareModel(t *testing.T, ix *Index, m model, universe []uint64) {
	t.Helper()
	checkInvariants(t, ix)
	st := ix.Stats()
	if st.Blocks != len(m) || st.Entries != m.entries() {
		t.Fatalf("stats %+v, model has %d blocks %d entries", st, len(m), m.entries())
	}
	for _, h := range universe {
		var want []Entry
		for p, bits := range m[h] {
			for tier := range NumTiers {
				if bits&(1<<tier) != 0 {
					want = append(want, Entry{p, tier})
				}
			}
		}
		if got := sortEntries(ix.Holders(h, nil)); !slices.Equal(got, sortEntries(want)) {
			t.Fatalf("block %d: holders %v, model %v", h, got, want)
		}
	}
}

// TestAgainstModel runs random operations on a small, collision-heavy index
// (no eviction) and compares its content with a map-based model.
func TestAgainstModel(t *testing.T) {
	for _, prealloc := range []bool{false, true} {
		ix, err := New(Config{MaxBlocks: 4000, Shards: 2, Preallocate: prealloc})
		if err != nil {
			t.Fatal(err)
		}
		runAgainstModel(t, ix)
	}
}

func runAgainstModel(t *testing.T, ix *Index) {
	r := rand.New(rand.NewPCG(3, 4))
	m := model{}
	universe := make([]uint64, 1500)
	for i := range universe {
		universe[i] = r.Uint64()
	}
	pick := func(n int) []uint64 {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = universe[r.IntN(len(universe))]
		}
		return hs
	}
	for step := range 3000 {
		pod, tier := PodID(r.IntN(12)), Tier(r.IntN(int(NumTiers)))
		switch op := r.IntN(100); {
		case op < 55:
			hs := pick(1 + r.IntN(3*writeBatch)) // spans several write batches
			mustAdd(t, ix, pod, tier, hs...)
			m.add(pod, tier, hs)
		case op < 95:
			hs := pick(1 + r.IntN(3*writeBatch))
			mustRemove(t, ix, pod, tier, hs...)
			for _, h := range hs {
				m.drop(h, pod, 1<<tier)
			}
		case op < 98:
			if err := ix.ClearPodTier(pod, tier); err != nil {
				t.Fatal(err)
			}
			for h := range m {
				m.drop(h, pod, 1<<tier)
			}
		default:
			ix.ClearPod(pod)
			for h := range m {
				m.drop(h, pod, holderTierMask)
			}
		}
		if step%500 == 499 {
			compareModel(t, ix, m, universe)
		}
	}
	compareModel(t, ix, m, universe)
	if st := ix.Stats(); st.Evictions != 0 {
		t.Errorf("unexpected evictions: %+v", st)
	}
}

func TestClearPodLeavesNoStaleEntries(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ix := newIndex(t, 50000, 8)
	const pods = 10
	m := model{}
	for range 400 {
		pod, tier := PodID(r.IntN(pods)), Tier(r.IntN(int(NumTiers)))
		hs := make([]uint64, 64)
		for i := range hs {
			hs[i] = uint64(r.IntN(20000))
		}
		mustAdd(t, ix, pod, tier, hs...)
		m.add(pod, tier, hs)
	}
	if podHoldings(ix, 3) == 0 {
		t.Fatal("setup: pod 3 holds nothing")
	}
	ix.ClearPod(3)
	for h := range m {
		m.drop(h, 3, holderTierMask)
	}
	if n := podHoldings(ix, 3); n != 0 {
		t.Fatalf("pod 3 still holds %d blocks after ClearPod", n)
	}
	checkInvariants(t, ix)
	if st := ix.Stats(); st.Blocks != len(m) || st.Entries != m.entries() {
		t.Fatalf("stats %+v, want %d blocks %d entries", st, len(m), m.entries())
	}
	if got := (LongestPrefix{}).Score(ix, []uint64{1, 2, 3}, []PodID{3}, nil); got[0].Score != 0 {
		t.Errorf("cleared pod scores %v", got[0].Score)
	}

	before := podHoldings(ix, 4)
	gpu := 0
	for _, ps := range m {
		if ps[4]&(1<<GPU) != 0 {
			gpu++
		}
	}
	if err := ix.ClearPodTier(4, GPU); err != nil {
		t.Fatal(err)
	}
	if after := podHoldings(ix, 4); after != before-gpu {
		t.Errorf("ClearPodTier(GPU): pod 4 holdings %d → %d, want %d", before, after, before-gpu)
	}
	for _, h := range []uint64{0, 1, 2, 100, 19999} {
		if slices.Contains(ix.Holders(h, nil), Entry{4, GPU}) {
			t.Errorf("block %d still held by pod 4 in GPU", h)
		}
	}

	// Clearing every pod empties the index and frees every overflow chunk.
	for p := range PodID(pods) {
		ix.ClearPod(p)
	}
	if st := ix.Stats(); st.Blocks != 0 || st.Entries != 0 {
		t.Errorf("after clearing all pods: %+v", st)
	}
	checkInvariants(t, ix)
}

func TestCapacityBoundAndEviction(t *testing.T) {
	ix := newIndex(t, 64, 4)
	for h := range uint64(1000) {
		mustAdd(t, ix, PodID(h%3), GPU, h)
	}
	st := ix.Stats()
	if st.Blocks != 64 || st.Evictions != 1000-64 || st.Capacity != 64 {
		t.Errorf("stats %+v, want 64 blocks, %d evictions", st, 1000-64)
	}
	checkInvariants(t, ix)
}

// TestTinyCapacityManyShards fills an index whose shards hold about one
// block each, where an insert may land in an empty shard of a full index.
func TestTinyCapacityManyShards(t *testing.T) {
	ix := newIndex(t, 16, 16)
	for h := range uint64(500) {
		mustAdd(t, ix, 1, CPU, h)
		if n := ix.blocks.Load(); n > 16+int64(len(ix.shards)) {
			t.Fatalf("after %d adds: %d blocks, bound 16 (+%d shards)", h+1, n, len(ix.shards))
		}
	}
	st := ix.Stats()
	if st.Blocks > 16+len(ix.shards) || st.Blocks == 0 || st.Evictions == 0 {
		t.Errorf("stats %+v", st)
	}
	checkInvariantsAllowingOvershoot(t, ix)
}

// TestEvictionSparesReferencedBlocks checks the CLOCK policy: blocks read
// since the hand last passed survive while unreferenced ones are evicted.
func TestEvictionSparesReferencedBlocks(t *testing.T) {
	ix := newIndex(t, 64, 1)
	for h := range uint64(64) {
		mustAdd(t, ix, 1, GPU, h)
	}
	mustAdd(t, ix, 1, GPU, 1000) // full: the hand clears every bit, evicts one
	var hot []uint64
	for h := range uint64(64) {
		if h%2 == 0 && len(ix.Holders(h, nil)) > 0 { // read: referenced
			hot = append(hot, h)
		}
	}
	if len(hot) < 31 {
		t.Fatalf("only %d even blocks left", len(hot))
	}
	for h := range uint64(16) {
		mustAdd(t, ix, 1, GPU, 2000+h)
	}
	for _, h := range hot {
		if len(ix.Holders(h, nil)) == 0 {
			t.Errorf("referenced block %d was evicted", h)
		}
	}
	for h := range uint64(16) {
		if len(ix.Holders(2000+h, nil)) == 0 {
			t.Errorf("new block %d was evicted", 2000+h)
		}
	}
	if st := ix.Stats(); st.Blocks != 64 || st.Evictions != 17 {
		t.Errorf("stats %+v, want 64 blocks and 17 evictions", st)
	}
	checkInvariants(t, ix)
}

func TestConcurrentUse(t *testing.T) {
	ix := newIndex(t, 5000, 16)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			hs := make([]uint64, 32)
			var dst []PodScore
			for range 2000 {
				for i := range hs {
					hs[i] = uint64(r.IntN(8000))
				}
				pod, tier := PodID(r.IntN(8)), Tier(r.IntN(int(NumTiers)))
				switch r.IntN(10) {
				case 0, 1, 2, 3:
					if err := ix.Add(pod, tier, hs); err != nil {
						t.Error(err) // not t.Fatal: this is not the test's goroutine
						return
					}
				case 4, 5:
					if err := ix.Remove(pod, tier, hs); err != nil {
						t.Error(err)
						return
					}
				case 6:
					if r.IntN(10) == 0 {
						ix.ClearPod(pod)
					}
				case 7:
					dst = (BlockHits{}).Score(ix, hs, nil, dst[:0])
				case 8:
					dst = (TierWeightedPrefix{DefaultTierWeights()}).Score(ix, hs, []PodID{1, 2, 3}, dst[:0])
				default:
					dst = (LongestPrefix{}).Score(ix, hs, nil, dst[:0])
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, ix)
	ix.ClearPod(0)
	if n := podHoldings(ix, 0); n != 0 {
		t.Errorf("pod 0 holds %d after ClearPod", n)
	}
}
