package ingest

import (
	"math"
	"sync/atomic"

	"kvtier/kvevents"
	"kvtier/router/index"
)

// replayFunc fetches the buffered messages with seq ≥ start from a
// publisher's replay socket and passes each to visit in the order received.
// payload is only valid during the call.
type replayFunc func(start uint64, visit func(seq uint64, payload []byte)) error

// MaxPodsPerEndpoint bounds the distinct pod names one endpoint's topics
// may introduce (data-parallel ranks published under their own names
// included); messages naming more are counted as malformed.
const MaxPodsPerEndpoint = 256

// podRef is a pod as a stream knows it: its index id and its counters.
type podRef struct {
	id       index.PodID
	counters *podCounters
}

// seqKey names one publisher stream: each data-parallel rank of a pod has
// its own sequence counter. rank is -1 when the batch carries none.
type seqKey struct {
	pod  index.PodID
	rank int
}

// stream applies the messages of one endpoint. It is owned by one goroutine
// and reuses its decoder, batches and maps, so that steady-state messages
// allocate nothing.
type stream struct {
	ix       index.Store
	pods     *index.Pods
	counters *counterSet
	fallback string // the endpoint's configured pod name
	fixed    bool   // Endpoint.FixedPod: topics are not parsed
	shared   bool   // Endpoint.Shared: clears drop every tier of the pod
	replay   replayFunc
	onResync func(pod, reason string)

	topics   kvevents.Topics
	dec      kvevents.Decoder
	live     kvevents.Batch // the message being handled
	replayed kvevents.Batch // a message fetched by replay
	byName   map[string]podRef
	seqs     map[seqKey]*kvevents.Sequencer
	models   map[index.PodID]string // last model set for each pod
	wrote    map[index.PodID]uint8  // tiers (bitmask) this stream's events added blocks to
}

func newStream(ix index.Store, pods *index.Pods, counters *counterSet, fallback string, replay replayFunc) *stream {
	return &stream{
		ix: ix, pods: pods, counters: counters, fallback: fallback, replay: replay,
		byName: make(map[string]podRef),
		seqs:   make(map[seqKey]*kvevents.Sequencer),
	}
}

// pod resolves a pod name, interning it on first sight. ok is false when
// the index's pod registry refuses the name (it is full).
func (s *stream) pod(name string) (podRef, bool) {
	if p, ok := s.byName[name]; ok {
		return p, true
	}
	if len(s.byName) >= MaxPodsPerEndpoint {
		// Topics come from the network: a publisher must not be able to
		// fill the registry (and the index) with made-up pods.
		return podRef{}, false
	}
	id, err := s.pods.Intern(name)
	if err != nil {
		return podRef{}, false
	}
	p := podRef{id: id, counters: s.counters.get(name)}
	s.byName[name] = p
	return p, true
}

// podOf returns the pod named by topic, or the configured one when the topic
// does not follow "kv@<pod>@<model>".
func (s *stream) podOf(topic []byte) (podRef, bool) {
	if s.fixed {
		return s.pod(s.fallback)
	}
	name, model, err := s.topics.Parse(topic)
	if err != nil {
		return s.pod(s.fallback)
	}
	p, ok := s.pod(name)
	if ok && model != "" && s.models[p.id] != model {
		// Cached per stream so the shared registry's lock is taken only
		// when a pod's model changes, not per message.
		if s.models == nil {
			s.models = make(map[index.PodID]string)
		}
		s.models[p.id] = model
		s.pods.SetModel(p.id, model)
	}
	return p, ok
}

func (s *stream) sequencer(k seqKey) *kvevents.Sequencer {
	sq, ok := s.seqs[k]
	if !ok {
		sq = new(kvevents.Sequencer)
		s.seqs[k] = sq
	}
	return sq
}

// handle applies one received message (topic, seq, payload). It never fails:
// what cannot be used is counted and dropped.
func (s *stream) handle(frames [][]byte) {
	msg, err := kvevents.DecodeMessage(frames)
	if err != nil {
		s.countMalformedFallback()
		return
	}
	p, ok := s.podOf(msg.Topic)
	if !ok {
		s.countMalformedFallback()
		return
	}
	p.counters.messages.Add(1)
	if msg.Seq > maxSeq {
		// vLLM numbers messages with a non-negative int64; a larger value
		// (-1 is the replay's end marker) is no live sequence number, and
		// following it would wrap the sequencer around.
		p.counters.malformed.Add(1)
		return
	}
	if err := s.dec.Decode(msg.Payload, &s.live); err != nil {
		// The sequence number is not observed: without a decodable
		// payload the DP rank, and so the stream, is unknown.
		p.counters.malformed.Add(1)
		return
	}
	rank := -1
	if s.live.HasDPRank {
		rank = s.live.DPRank
	}
	st, missing, from, to := s.sequencer(seqKey{p.id, rank}).Observe(msg.Seq)
	switch st {
	case kvevents.First:
		s.resync(p, "first message")
	case kvevents.Gap:
		p.counters.gaps.Add(1)
	case kvevents.Restart:
		p.counters.restarts.Add(1)
		s.clearOwn(p)
		s.resync(p, "publisher restart")
	}
	if missing {
		s.recover(p, from, to)
	}
	s.apply(p, &s.live)
}

func (s *stream) countMalformedFallback() {
	if p, ok := s.pod(s.fallback); ok {
		p.counters.malformed.Add(1)
	}
}

// recover replays the messages [from, to] that never arrived, applying each
// once and in sequence order, and counts those the publisher no longer had.
// Replayed messages carry no topic; they belong to the pod whose stream
// they were missing from.
func (s *stream) recover(p podRef, from, to uint64) {
	want := to - from + 1
	if s.replay == nil || want > maxReplay {
		// No replay, or more missing than any publisher buffers (vLLM
		// keeps 10,000 messages): asking would only stall this stream.
		s.forget(p, want)
		return
	}
	next, got := from, uint64(0)
	err := s.replay(from, func(seq uint64, payload []byte) {
		if seq < next || seq > to {
			return // a duplicate, or newer than the gap: those come live
		}
		next = seq + 1
		got++
		p.counters.messages.Add(1)
		if err := s.dec.Decode(payload, &s.replayed); err != nil {
			p.counters.malformed.Add(1)
			return
		}
		s.apply(p, &s.replayed)
	})
	if err != nil {
		p.counters.replayFailures.Add(1)
	} else {
		p.counters.replays.Add(1)
	}
	if got < want {
		s.forget(p, want-got)
	}
}

// forget handles messages of pod p that are gone for good: one of them
// may have removed or cleared blocks, so what the pod holds is unknown.
// Its entries are dropped rather than left to route requests to KV it may
// no longer have; its next events rebuild them.
func (s *stream) forget(p podRef, lost uint64) {
	addSaturating(&p.counters.lost, lost)
	s.clearOwn(p)
	s.resync(p, "messages lost")
}

// resync tells the OnResync hook, if any, that what p's stream announced
// must be sent again in full.
func (s *stream) resync(p podRef, reason string) {
	if s.onResync == nil {
		return
	}
	if name, ok := s.pods.Name(p.id); ok {
		s.onResync(name, reason)
	}
}

// maxSeq is the largest sequence number a vLLM publisher sends (int64).
const maxSeq = 1<<63 - 1

// maxReplay bounds the gap a replay is asked for; vLLM's replay buffer
// holds 10,000 messages by default, so a wider gap cannot be filled.
const maxReplay = 1 << 20

// addSaturating adds n to c, stopping at the largest uint64 instead of
// wrapping: a stream that jumps near 2^63 twice must not read as having
// lost almost nothing.
func addSaturating(c *atomic.Uint64, n uint64) {
	for {
		old := c.Load()
		sum := old + n
		if sum < old {
			sum = math.MaxUint64
		}
		if c.CompareAndSwap(old, sum) {
			return
		}
	}
}

// clearOwn drops the entries this stream wrote for pod p: the tiers its
// events named. Another publisher may report other tiers of the same pod —
// the node's kvtier daemon announces the pod's RAM and disk chunks while
// vLLM announces its GPU blocks — and a restart or a loss on one stream
// says nothing about what the other reported.
func (s *stream) clearOwn(p podRef) {
	if s.shared {
		s.ix.ClearPod(p.id)
		return
	}
	mask := s.wrote[p.id]
	for t := index.Tier(0); t < index.NumTiers; t++ {
		if mask&(1<<t) != 0 {
			s.ix.ClearPodTier(p.id, t)
		}
	}
}

// apply writes the events of b to the index. Counters are summed locally
// and published once per batch to keep atomics off the per-event path.
func (s *stream) apply(p podRef, b *kvevents.Batch) {
	var events, added, removed, clears, skipped, indexErrors uint64
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case kvevents.BlockStored, kvevents.BlockRemoved:
			tier, ok := TierOf(e.Medium)
			group := groupOf(e)
			if !ok || !index.ValidGroup(group) {
				skipped++
				continue
			}
			// Keyed by group so that hybrid models' groups stay apart.
			// The batch is this stream's own, so rewriting it is free.
			hashes := b.BlockHashes(e)
			index.GroupKeys(hashes, group)
			var err error
			if e.Kind == kvevents.BlockStored {
				if s.wrote[p.id]&(1<<tier) == 0 {
					if s.wrote == nil {
						s.wrote = make(map[index.PodID]uint8)
					}
					s.wrote[p.id] |= 1 << tier
				}
				err = s.ix.Add(p.id, tier, hashes)
				added += uint64(len(hashes))
			} else {
				err = s.ix.Remove(p.id, tier, hashes)
				removed += uint64(len(hashes))
			}
			if err != nil {
				indexErrors++
				continue
			}
		case kvevents.AllBlocksCleared:
			s.clearOwn(p) // the publisher's own cache, not other sources'
			clears++
		default:
			skipped++
			continue
		}
		events++
	}
	c := p.counters
	addIf(&c.events, events)
	addIf(&c.blocksAdded, added)
	addIf(&c.blocksRemoved, removed)
	addIf(&c.clears, clears)
	addIf(&c.skipped, skipped)
	addIf(&c.indexErrors, indexErrors)
}

// groupOf returns the KV-cache group of a block event: its group_idx, or
// 0 when it has none (vLLM before hybrid-model events, kvtier daemons).
func groupOf(e *kvevents.Event) int {
	if e.HasGroupIdx {
		return e.GroupIdx
	}
	return 0
}

// addIf skips the atomic add (a contended cache-line write) for zero.
func addIf(c interface{ Add(uint64) uint64 }, n uint64) {
	if n != 0 {
		c.Add(n)
	}
}
