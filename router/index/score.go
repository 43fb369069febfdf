package index

import "sync"

// PodScore is one pod's score for a prompt.
type PodScore struct {
	Pod   PodID
	Score float64
}

// Scorer scores pods for a prompt's block hashes, in prompt order.
//
// Score appends one PodScore per scored pod to dst and returns it; with a
// dst of sufficient capacity it does not allocate. When candidates is nil,
// every pod holding a relevant block is scored (pods scoring 0 are left
// out); otherwise exactly the candidates are scored, each once, in the order
// given, and holdings of other pods are ignored.
type Scorer interface {
	Score(ix Store, hashes []uint64, candidates []PodID, dst []PodScore) []PodScore
}

// LongestPrefix scores a pod by the number of leading blocks of the prompt
// it holds, in any tier. It stops reading the index at the first block that
// no scored pod continues its prefix with.
type LongestPrefix struct{}

// Score implements Scorer.
func (LongestPrefix) Score(ix Store, hashes []uint64, candidates []PodID, dst []PodScore) []PodScore {
	dst, _ = score(ix, hashes, candidates, dst, modePrefix, &unitWeights)
	return dst
}

// BlockHits scores a pod by how many of the prompt's blocks it holds,
// wherever they are in the prompt.
type BlockHits struct{}

// Score implements Scorer.
func (BlockHits) Score(ix Store, hashes []uint64, candidates []PodID, dst []PodScore) []PodScore {
	dst, _ = score(ix, hashes, candidates, dst, modeHits, &unitWeights)
	return dst
}

// Coverage scores a pod by the fraction of the prompt's blocks it holds
// (BlockHits divided by the number of blocks), in [0, 1].
type Coverage struct{}

// Score implements Scorer.
func (Coverage) Score(ix Store, hashes []uint64, candidates []PodID, dst []PodScore) []PodScore {
	base := len(dst)
	dst, _ = score(ix, hashes, candidates, dst, modeHits, &unitWeights)
	if len(hashes) > 0 {
		for i := base; i < len(dst); i++ {
			dst[i].Score /= float64(len(hashes))
		}
	}
	return dst
}

// TierWeightedPrefix is LongestPrefix where each block of a pod's prefix
// adds the weight of the best (highest-weighted) tier the pod holds it in,
// so a prefix held on disk counts less than one held in GPU memory. The
// prefix runs on across tiers.
type TierWeightedPrefix struct {
	Weights [NumTiers]float64 // indexed by Tier
}

// DefaultTierWeights are GPU 1.0, CPU 0.8, Disk 0.5, Remote 0.3.
func DefaultTierWeights() [NumTiers]float64 {
	return [NumTiers]float64{GPU: 1.0, CPU: 0.8, Disk: 0.5, Remote: 0.3}
}

// Score implements Scorer.
func (s TierWeightedPrefix) Score(ix Store, hashes []uint64, candidates []PodID, dst []PodScore) []PodScore {
	var best [holderTierMask + 1]float64
	for mask := 1; mask < len(best); mask++ {
		first := true
		for t := Tier(0); t < NumTiers; t++ {
			if mask&(1<<t) != 0 && (first || s.Weights[t] > best[mask]) {
				best[mask], first = s.Weights[t], false
			}
		}
	}
	dst, _ = score(ix, hashes, candidates, dst, modePrefix, &best)
	return dst
}

type scoreMode uint8

const (
	modePrefix scoreMode = iota // count consecutive leading blocks
	modeHits                    // count blocks anywhere
)

// unitWeights gives every non-empty tier mask weight 1.
var unitWeights = func() (w [holderTierMask + 1]float64) {
	for i := 1; i < len(w); i++ {
		w[i] = 1
	}
	return w
}()

// score walks hashes and adds, per scored pod, weight[tier mask] for each
// counted block. It returns the extended dst and how many blocks it read.
func score(ix Store, hashes []uint64, candidates []PodID, dst []PodScore, mode scoreMode,
	weight *[holderTierMask + 1]float64) ([]PodScore, int) {
	ws := workspaces.Get().(*workspace)
	defer workspaces.Put(ws)

	pods := 0
	if mem, ok := ix.(*Index); ok {
		pods = int(mem.maxPod.Load()) + 1
	}
	for _, c := range candidates {
		pods = max(pods, int(c)+1)
	}
	ws.reset(pods)
	base := len(dst)
	for _, c := range candidates {
		if ws.find(c) < 0 {
			ws.track(c)
			dst = append(dst, PodScore{Pod: c})
		}
	}
	open := candidates == nil
	walked := 0
	for i, h := range hashes {
		walked++
		ws.words = ix.HolderWords(h, ws.words[:0])
		continuing := 0
		for _, w := range ws.words {
			pod := holderPod(w)
			t := ws.find(pod)
			if t < 0 {
				// Only a pod holding the first block can have a prefix.
				if !open || (mode == modePrefix && i > 0) {
					continue
				}
				t = ws.track(pod)
				dst = append(dst, PodScore{Pod: pod})
			}
			if mode == modePrefix {
				if ws.count[t] != int32(i) {
					continue // its prefix ended earlier
				}
				continuing++
			}
			ws.count[t]++
			dst[base+t].Score += weight[w&holderTierMask]
		}
		if mode == modePrefix && continuing == 0 {
			break
		}
	}
	return dst, walked
}

// workspace is per-call scratch for scoring, pooled so scoring does not
// allocate: a generation-stamped map from PodID to a dense tracked index.
type workspace struct {
	gen   uint32
	stamp []uint32 // by PodID: equals gen while pos is valid
	pos   []int32  // by PodID: tracked index
	count []int32  // by tracked index: blocks counted so far
	words []uint32 // holders of the block being scored
}

var workspaces = sync.Pool{New: func() any { return new(workspace) }}

func (ws *workspace) reset(pods int) {
	if len(ws.stamp) < pods {
		ws.stamp = make([]uint32, pods)
		ws.pos = make([]int32, pods)
		ws.gen = 0
	}
	ws.gen++
	if ws.gen == 0 { // wrapped: old stamps could look current
		clear(ws.stamp)
		ws.gen = 1
	}
	ws.count = ws.count[:0]
}

func (ws *workspace) find(pod PodID) int {
	if int(pod) < len(ws.stamp) && ws.stamp[pod] == ws.gen {
		return int(ws.pos[pod])
	}
	return -1
}

func (ws *workspace) track(pod PodID) int {
	if int(pod) >= len(ws.stamp) {
		// A pod newer than the scratch's sizing: grow (amortized, and the
		// pooled workspace keeps the room for later calls).
		n := max(int(pod)+1, 2*len(ws.stamp))
		ws.stamp = append(ws.stamp, make([]uint32, n-len(ws.stamp))...)
		ws.pos = append(ws.pos, make([]int32, n-len(ws.pos))...)
	}
	t := len(ws.count)
	ws.stamp[pod] = ws.gen
	ws.pos[pod] = int32(t)
	ws.count = append(ws.count, 0)
	return t
}
