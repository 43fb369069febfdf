package member

import (
	"log/slog"
	"sync"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/kvevents"
	"kvtier/kvevents/announce"
)

// Stream publishes the daemon's chunk admissions and drops, per tier and
// by index key (chunk.Key.Index), as kvevents messages on a ZMQ PUB
// socket: BlockStored / BlockRemoved with medium "CPU" (RAM) or "DISK",
// and AllBlocksCleared to start a resync. Every chunk is reported, however
// it was keyed, unlike the router's stream (kvevents/announce), which only
// knows chunks stored by token ids.
//
// Messages go through a bounded queue sent by one goroutine, so a slow
// controller never slows the tiers. A message that does not fit is
// dropped with its sequence number consumed: the controller sees the gap
// and asks for a resync.
type Stream struct {
	out *announce.Socket[message]

	resyncMu sync.Mutex // one resync at a time

	mu      sync.Mutex
	seq     uint64 // last sequence number handed out; the first is 0
	started bool
	pending message // resync keys not yet queued
}

// message is one queued batch: a single event, or none (a keepalive).
type message struct {
	kind   kvevents.Kind
	medium string
	keys   []uint64 // a resync batch; nil for a live event
	key    uint64   // a live event's one key, kept inline so it allocates nothing
	empty  bool
}

// resyncBatch bounds the keys of one resync message: big enough that a
// million chunks take a thousand messages, small enough to stay well
// under the subscriber's frame limit.
const resyncBatch = 1024

// queueDepth bounds the messages waiting to be sent.
const queueDepth = 16384

// NewStream binds endpoint and starts the sender.
func NewStream(endpoint, instance string, log *slog.Logger) (*Stream, error) {
	out, err := announce.Bind(announce.SocketOptions{Endpoint: endpoint, Topic: cluster.Topic(instance),
		Label: "cluster_events_endpoint", Encoding: kvevents.Map, QueueDepth: queueDepth, Logger: log}, fill)
	if err != nil {
		return nil, err
	}
	return &Stream{out: out}, nil
}

// Addr returns the bound address (useful with port 0).
func (s *Stream) Addr() string { return s.out.Addr() }

// Admitted implements engine.Observer.
func (s *Stream) Admitted(tier string, key chunk.Key) { s.live(kvevents.BlockStored, tier, key) }

// Dropped implements engine.Observer.
func (s *Stream) Dropped(tier string, key chunk.Key) { s.live(kvevents.BlockRemoved, tier, key) }

func (s *Stream) live(kind kvevents.Kind, tier string, key chunk.Key) {
	medium := announce.Medium(tier)
	if medium == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Resync keys listed before this event must reach the controller
	// before it, or a drop could be undone by an older listing.
	s.flushLocked()
	s.enqueueLocked(message{kind: kind, medium: medium, key: key.Index()})
}

// Keepalive sends an empty message. The controller's subscription learns
// from its first message that it joined, and asks for a resync; quiet
// daemons would otherwise not be heard from, and a loss at the end of a
// quiet spell would go unnoticed.
func (s *Stream) Keepalive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	s.enqueueLocked(message{empty: true})
}

// Lister enumerates the chunks of the local tiers, as
// engine.Engine.ListChunks does: fn runs under the tier's lock.
type Lister interface {
	ListChunks(scopes []uint64, fn func(tier string, key chunk.Key, size int) bool)
}

// Resync publishes AllBlocksCleared and then every chunk of l's tiers as
// BlockStored, so that the controller's view of this daemon is rebuilt
// from scratch. Live events keep flowing meanwhile and stay in order with
// the listing: a chunk is listed under its tier's lock, and every live
// event first queues the keys listed before it. It returns the chunks
// listed.
func (s *Stream) Resync(l Lister) int {
	s.resyncMu.Lock()
	defer s.resyncMu.Unlock()
	s.mu.Lock()
	s.flushLocked()
	s.enqueueLocked(message{kind: kvevents.AllBlocksCleared})
	s.mu.Unlock()
	n := 0
	l.ListChunks([]uint64{0}, func(tier string, key chunk.Key, _ int) bool {
		medium := announce.Medium(tier)
		if medium == "" {
			return true
		}
		n++
		s.mu.Lock()
		if s.pending.medium != medium {
			s.flushLocked()
			s.pending.medium = medium
		}
		s.pending.keys = append(s.pending.keys, key.Index())
		if len(s.pending.keys) >= resyncBatch {
			s.flushLocked()
		}
		s.mu.Unlock()
		return true
	})
	s.mu.Lock()
	s.flushLocked()
	s.mu.Unlock()
	return n
}

// flushLocked queues the pending resync keys. Called with s.mu held.
func (s *Stream) flushLocked() {
	if len(s.pending.keys) == 0 {
		return
	}
	m := message{kind: kvevents.BlockStored, medium: s.pending.medium, keys: s.pending.keys}
	s.pending.keys = make([]uint64, 0, resyncBatch) // the queued slice is the sender's now
	s.enqueueLocked(m)
}

// enqueueLocked numbers m and queues it, or drops it (its number stays
// used, so the controller sees the gap). Called with s.mu held.
func (s *Stream) enqueueLocked(m message) {
	if s.started {
		s.seq++
	}
	s.started = true
	s.out.Queue(s.seq, m)
}

// fill turns one queued message into its batch: nothing (a keepalive),
// one live event, or a resync batch of keys.
func fill(m message, batch *kvevents.Batch) {
	switch {
	case m.empty:
	case m.keys == nil:
		batch.Add(kvevents.Event{Kind: m.kind, Medium: m.medium}, []uint64{m.key}, nil)
	default:
		batch.Add(kvevents.Event{Kind: m.kind, Medium: m.medium}, m.keys, nil)
	}
}

// Stats reports messages sent and dropped.
func (s *Stream) Stats() (sent, dropped uint64) { return s.out.Stats() }

// Close sends what is queued and closes the socket. Call it after the
// tiers stop changing.
func (s *Stream) Close() error { return s.out.Close() }
