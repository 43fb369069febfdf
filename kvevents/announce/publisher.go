// Package announce publishes, as vLLM-format KV events on a ZMQ PUB
// socket, which prompt blocks this node's kvtier holds in RAM and on disk,
// so that a kvtier router (or llm-d's indexer) credits the pod with them.
// The event format is package kvevents'; this package owns the socket, the
// mapping from kvtier's chunk keys to vLLM's block hashes, and the queue
// that keeps a slow subscriber from ever slowing the cache.
package announce

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"

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
	topic  []byte
	sock   zmq4.Socket
	log    *slog.Logger

	mu     sync.Mutex
	chunks map[chunk.Key]*chunkBlocks
	seq    uint64 // last sequence number handed out
	closed bool

	queue   chan blockEvent
	dropped atomic.Uint64
	sent    atomic.Uint64
	done    chan struct{}
	cancel  context.CancelFunc
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
	seq       uint64
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
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewPub(ctx)
	if err := sock.Listen(o.Endpoint); err != nil {
		cancel()
		sock.Close()
		return nil, fmt.Errorf("kv events: binding %s: %w", o.Endpoint, err)
	}
	p := &Publisher{opts: o, hasher: hasher, topic: []byte("kv@" + o.Pod + "@" + o.Model), sock: sock, log: o.Logger,
		chunks: make(map[chunk.Key]*chunkBlocks), queue: make(chan blockEvent, o.QueueDepth),
		done: make(chan struct{}), cancel: cancel}
	go p.send()
	return p, nil
}

// Addr returns the bound address (useful with port 0).
func (p *Publisher) Addr() string { return p.sock.Addr().String() }

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
	medium := mediumOf(tierName)
	if medium == "" {
		return
	}
	// Sequence numbers are handed out and events queued under one lock,
	// so the queue is in sequence order: out-of-order numbers would look
	// like a publisher restart to the router.
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.chunks[key]
	if !ok || p.closed {
		return
	}
	if stored {
		c.holders++
	} else if c.holders--; c.holders <= 0 {
		delete(p.chunks, key)
	}
	p.seq++
	ev := blockEvent{stored: stored, medium: medium, hashes: c.hashes, parent: c.parent, hasParent: c.hasParent, seq: p.seq}
	select {
	case p.queue <- ev:
	default:
		p.dropped.Add(1) // its sequence number stays unused: the router sees a gap
	}
}

// mediumOf maps a local tier to the medium vLLM's events name.
func mediumOf(tierName string) string {
	switch tierName {
	case "mem":
		return "CPU"
	case "disk":
		return "DISK"
	}
	return ""
}

// send publishes queued events in order, one message per event. A message
// carries the event's own sequence number, so drops show as gaps.
func (p *Publisher) send() {
	defer close(p.done)
	var seqFrame [8]byte
	var batch kvevents.Batch
	enc := kvevents.Encoder{Encoding: p.opts.Encoding}
	for ev := range p.queue {
		p.batchOf(ev, &batch)
		payload := enc.Append(nil, &batch)
		binary.BigEndian.PutUint64(seqFrame[:], ev.seq)
		msg := zmq4.NewMsgFrom(p.topic, append([]byte(nil), seqFrame[:]...), payload)
		if err := p.sock.SendMulti(msg); err != nil {
			p.log.Warn("kv events: sending", "err", err)
			continue
		}
		p.sent.Add(1)
	}
}

// batchOf fills b with the one event of ev: a BlockStored or BlockRemoved
// in the tier's medium, with no group (vLLM's default group 0). Token ids
// are not kept per chunk, so BlockStored carries none: the router does not
// read them, and llm-d treats a token-less BlockStored as a tier update of
// blocks it already knows from the pod's GPU events.
func (p *Publisher) batchOf(ev blockEvent, b *kvevents.Batch) {
	b.Reset()
	b.Timestamp = kvevents.Now()
	e := kvevents.Event{Kind: kvevents.BlockRemoved, Medium: ev.medium}
	if ev.stored {
		e.Kind, e.BlockSize = kvevents.BlockStored, p.opts.BlockSize
		e.Parent, e.HasParent = ev.parent, ev.hasParent
	}
	b.Add(e, ev.hashes, nil)
}

// Stats reports events sent and dropped.
func (p *Publisher) Stats() (sent, dropped uint64) { return p.sent.Load(), p.dropped.Load() }

// Close stops observing new events, sends what is queued and closes the
// socket. Call it after the tiers stop changing (after the engine closed).
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.queue)
	p.mu.Unlock()
	<-p.done
	p.cancel()
	return p.sock.Close()
}
