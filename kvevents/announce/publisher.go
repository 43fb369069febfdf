// Package announce publishes, as vLLM-format KV events on a ZMQ PUB
// socket, which prompt blocks this node's kvtier holds in RAM and on disk,
// so that a kvtier router (or llm-d's indexer) credits the pod with them.
// The event format is package kvevents'; this package owns the socket and
// the queue that keeps a slow subscriber from ever slowing the cache
// (Socket, which the cluster's chunk stream in cluster/member uses too),
// and the mapping from kvtier's chunk keys to vLLM's block hashes.
package announce

import (
	"fmt"
	"log/slog"
	"sync"

	"kvtier/chunk"
	"kvtier/kvevents"
)

// Options configure the publisher.
type Options struct {
	// Endpoint is the ZMQ address the PUB socket binds, e.g. "tcp://*:5560".
	Endpoint string
	// Pod and Model name the vLLM pod this daemon serves, for the topic
	// kv@<pod>@<model>: the router credits the chunks to that pod.
	Pod, Model string
	// HashSeed and BlockSize are the pod's PYTHONHASHSEED and block size:
	// events carry vLLM's block hashes, so they must be the pod's.
	HashSeed  string
	BlockSize int
	// ChunkTokens is the daemon's chunk size; a multiple of BlockSize.
	ChunkTokens int
	// Encoding is how events are laid out (package kvevents): the zero
	// value, kvevents.Map, is what vLLM writes since v0.26 and what its
	// current subscribers read; kvevents.Array suits consumers written
	// for older vLLM releases (llm-d-kv-cache before v0.9). kvtier's
	// router reads both.
	Encoding kvevents.Encoding
	// QueueDepth bounds the events waiting to be sent (default 8192).
	QueueDepth int
	Logger     *slog.Logger
}

// Publisher announces, as vLLM-format KV events, which prompt blocks this
// node's kvtier holds in RAM ("CPU") and on disk ("DISK"), so that a
// kvtier router scores the pod for them as it does for its GPU cache.
//
// Chunk keys are kvtier's own, but the router indexes vLLM's block hashes.
// When a chunk is stored by token ids, the daemon computes the vLLM hashes
// of its blocks (Note) and keeps them with the chunk while any local tier
// holds it; the tiers report admissions and drops (tier.Observer), which
// become BlockStored and BlockRemoved events. Chunks stored by engine
// hashes cannot be mapped and are not announced.
//
// Events are sent by one goroutine through a bounded queue. When the queue
// is full an event is dropped but its sequence number is still consumed,
// so the router sees the gap and drops the pod's entries from this source
// rather than keep stale ones.
type Publisher struct {
	opts   Options
	hasher *chunk.VLLMHasher
	out    *Socket[blockEvent]

	mu     sync.Mutex
	chunks map[chunk.Key]*chunkBlocks
	seq    uint64 // last sequence number handed out
}

// chunkBlocks is what an announced chunk needs: its blocks' hashes, the
// hash of the block before it, and how many local tiers hold it.
type chunkBlocks struct {
	hashes    []uint64
	parent    uint64
	hasParent bool
	holders   int
}

type blockEvent struct {
	stored    bool
	medium    string
	hashes    []uint64 // shared with chunkBlocks; never modified after Note
	parent    uint64
	hasParent bool
}

// maxAnnounced bounds the chunks whose block hashes are remembered.
const maxAnnounced = 1 << 20

// New binds the PUB socket and starts the sender.
func New(o Options) (*Publisher, error) {
	if o.Pod == "" || o.Model == "" {
		return nil, fmt.Errorf("kv events: a pod name and a model are required (kv_events_pod, kv_events_model)")
	}
	if o.BlockSize <= 0 || o.ChunkTokens%o.BlockSize != 0 {
		return nil, fmt.Errorf("kv events: chunk size %d is not a multiple of the block size %d", o.ChunkTokens, o.BlockSize)
	}
	hasher, err := chunk.NewVLLMHasher(o.HashSeed, o.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = 8192
	}
	p := &Publisher{opts: o, hasher: hasher, chunks: make(map[chunk.Key]*chunkBlocks)}
	out, err := Bind(SocketOptions{Endpoint: o.Endpoint, Topic: "kv@" + o.Pod + "@" + o.Model, Label: "kv events",
		Encoding: o.Encoding, QueueDepth: o.QueueDepth, Logger: o.Logger}, p.batchOf)
	if err != nil {
		return nil, err
	}
	p.out = out
	return p, nil
}

// Addr returns the bound address (useful with port 0).
func (p *Publisher) Addr() string { return p.out.Addr() }

// Hasher returns the vLLM hasher the events use.
func (p *Publisher) Hasher() *chunk.VLLMHasher { return p.hasher }

// BlocksPerChunk is how many vLLM blocks one full chunk holds.
func (p *Publisher) BlocksPerChunk() int { return p.opts.ChunkTokens / p.opts.BlockSize }

// Note records the vLLM block hashes of chunk key (blocks, preceded by the
// block hashed as parent, if any). Call it before the chunk is committed.
func (p *Publisher) Note(key chunk.Key, blocks []uint64, parent uint64, hasParent bool) {
	if len(blocks) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.chunks[key]; ok || len(p.chunks) >= maxAnnounced {
		return
	}
	p.chunks[key] = &chunkBlocks{hashes: append([]uint64(nil), blocks...), parent: parent, hasParent: hasParent}
}

// Admitted implements engine.Observer.
func (p *Publisher) Admitted(tierName string, key chunk.Key) { p.observe(true, tierName, key) }

// Dropped implements engine.Observer.
func (p *Publisher) Dropped(tierName string, key chunk.Key) { p.observe(false, tierName, key) }

func (p *Publisher) observe(stored bool, tierName string, key chunk.Key) {
	medium := Medium(tierName)
	if medium == "" {
		return
	}
	// Sequence numbers are handed out and events queued under one lock,
	// so the queue is in sequence order (see Socket.Queue).
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.chunks[key]
	if !ok {
		return
	}
	if stored {
		c.holders++
	} else if c.holders--; c.holders <= 0 {
		delete(p.chunks, key)
	}
	p.seq++
	p.out.Queue(p.seq, blockEvent{stored: stored, medium: medium, hashes: c.hashes, parent: c.parent, hasParent: c.hasParent})
}

// batchOf fills b with the one event of ev: a BlockStored or BlockRemoved
// in the tier's medium, with no group (vLLM's default group 0). Token ids
// are not kept per chunk, so BlockStored carries none: the router does not
// read them, and llm-d treats a token-less BlockStored as a tier update of
// blocks it already knows from the pod's GPU events.
func (p *Publisher) batchOf(ev blockEvent, b *kvevents.Batch) {
	e := kvevents.Event{Kind: kvevents.BlockRemoved, Medium: ev.medium}
	if ev.stored {
		e.Kind, e.BlockSize = kvevents.BlockStored, p.opts.BlockSize
		e.Parent, e.HasParent = ev.parent, ev.hasParent
	}
	b.Add(e, ev.hashes, nil)
}

// Stats reports events sent and dropped.
func (p *Publisher) Stats() (sent, dropped uint64) { return p.out.Stats() }

// Close sends what is queued and closes the socket. Call it after the
// tiers stop changing (after the engine closed).
func (p *Publisher) Close() error { return p.out.Close() }
