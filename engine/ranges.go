package engine

import (
	"context"
	"sync"

	"kvtier/chunk"
	"kvtier/tier"
)

// RangeReads holds the chunks one RETRIEVE_RANGES serves: RAM chunks by
// reference, as Reads does, and the first chunk of the prefix held only
// by a lower tier that reads ranges (the disk tier), whose asked ranges
// are read from that tier into a scratch buffer and verified there,
// instead of promoting the whole chunk into RAM before its first range
// is sent. Chunks after that one are acquired as Acquire does. A
// connection reuses one; it is not safe for concurrent use.
type RangeReads struct {
	e     *Engine
	reads Reads
	at    int // index of the chunk read from the lower tier, -1 when none (set by AcquireRanges)
	lower tier.LowerRange
	rr    tier.RangeRead // open while a range of it has been read
	buf   []byte         // the scratch buffer at's ranges land in
	n     int
	take  func(size int) bool // takes buf from the engine's scratch pool
}

// AcquireRanges holds the leading keys cached anywhere (RAM and the
// node-local tiers only when local is set, for a peer) in r and returns
// how many. A tier failing after some chunks ends the prefix there
// without an error. r must be released before it is used again.
func (e *Engine) AcquireRanges(ctx context.Context, keys []chunk.Key, local bool, r *RangeReads) (int, error) {
	r.e = e
	rd := &r.reads
	rd.e = e
	rd.ids = growIDs(rd.ids, len(keys))
	if r.take == nil { // made once per RangeReads: a closure per request would allocate
		r.take = func(size int) bool {
			r.buf, _ = r.e.scratch.get(size)
			return r.buf != nil
		}
	}
	n, at, lower, err := e.mgr.AcquireRanged(ctx, keys, rd.ids, local, r.take)
	if at >= 0 && at < n {
		copy(rd.ids[at:], rd.ids[at+1:n]) // ids[at] was left unset
		rd.ids = rd.ids[:n-1]
	} else {
		rd.ids = rd.ids[:n]
	}
	r.n, r.at, r.lower = n, at, lower
	if at < 0 && r.buf != nil { // taken, then not used
		e.scratch.put(r.buf)
		r.buf = nil
	}
	return n, err
}

// Len returns how many chunks r holds.
func (r *RangeReads) Len() int { return r.n }

// Size returns chunk j's length.
func (r *RangeReads) Size(j int) int {
	if j == r.at {
		return r.lower.Size()
	}
	return r.reads.Size(r.ref(j))
}

// ref returns the index in r.reads of chunk j, which is not r.at.
func (r *RangeReads) ref(j int) int {
	if r.at >= 0 && j > r.at {
		return j - 1
	}
	return j
}

// Range returns bytes [from, to) of chunk j, valid until Release: in
// place for a RAM chunk, read and verified first for the lower-tier one.
// A failed read (a damaged piece, which the tier then drops; the tier's
// own error) is returned: the caller serves the prefix before j only.
func (r *RangeReads) Range(ctx context.Context, j, from, to int) ([]byte, error) {
	if j != r.at {
		return r.reads.Bytes(r.ref(j))[from:to], nil
	}
	if r.rr == nil {
		rr, err := r.lower.Open(ctx, r.buf)
		if err != nil {
			return nil, err
		}
		r.rr = rr
	}
	if err := r.rr.ReadRange(ctx, from, to); err != nil {
		return nil, err
	}
	return r.buf[from:to], nil
}

// Release drops the references, ends the lower tier's read and gives the
// scratch buffer back.
func (r *RangeReads) Release() {
	r.reads.Release()
	if r.rr != nil {
		r.rr.Close()
		r.rr = nil
	}
	if r.buf != nil {
		r.e.scratch.put(r.buf)
		r.buf = nil
	}
	r.at, r.n, r.lower = -1, 0, tier.LowerRange{}
}

// Scratch reports whether r holds a scratch buffer: a chunk of it is read
// from a lower tier by ranges. The server gives such a reply less time to
// be written (server/ranges.go), since the buffer is one of a few.
func (r *RangeReads) Scratch() bool { return r.buf != nil }

// RangeBuffersInUse returns how many scratch buffers requests hold now
// (at most scratchBuffers).
func (e *Engine) RangeBuffersInUse() int { return e.scratch.inUse() }

// scratchBuffers bounds the chunks served by ranges from a lower tier at
// once, and so the scratch memory they take (one chunk's size each). A
// connection holds at most one: its requests run one at a time, and a
// request holds its buffer only while it reads and sends its ranges. A
// request finding them all in use does not wait for one: it promotes the
// chunk whole into RAM instead, as before ranges were read from lower
// tiers. Waiting would make it wait for the slowest readers of the
// daemon — a buffer is held while its ranges are written, to a reader
// that may have stopped reading — while the readers of ranges, P2P tiers
// and kvtier:// tiers, give up after a remote timeout of about 100 ms.
const scratchBuffers = 4

// scratchPool keeps the buffers lower-tier ranges are read into. A range
// read needs a buffer of the whole chunk's size (tier.RangeReader reads
// at the chunk's offsets), but touches only the pieces of its ranges.
type scratchPool struct {
	once  sync.Once
	slots chan struct{} // one token per buffer in use
	mu    sync.Mutex
	free  [][]byte
}

func (p *scratchPool) init() { p.slots = make(chan struct{}, scratchBuffers) }

func (p *scratchPool) inUse() int {
	p.once.Do(p.init)
	return len(p.slots)
}

// get returns a buffer of size bytes, or false when scratchBuffers are in
// use. It allocates only when no free buffer is large enough.
func (p *scratchPool) get(size int) ([]byte, bool) {
	p.once.Do(p.init)
	select {
	case p.slots <- struct{}{}:
	default:
		return nil, false
	}
	var b []byte
	p.mu.Lock()
	if k := len(p.free); k > 0 {
		b, p.free = p.free[k-1], p.free[:k-1]
	}
	p.mu.Unlock()
	if cap(b) < size {
		b = make([]byte, size)
	}
	return b[:size], true
}

// put gives back a buffer from get.
func (p *scratchPool) put(b []byte) {
	p.mu.Lock()
	p.free = append(p.free, b)
	p.mu.Unlock()
	<-p.slots
}
