package engine

import (
	"context"
	"errors"
	"io"
	"sync"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
)

// RangeReads holds the chunks one RETRIEVE_RANGES serves: RAM chunks by
// reference, as Reads does, and every chunk of the prefix held only by a
// lower tier that reads ranges (the disk tier), whose asked ranges are
// read from that tier into scratch buffers and verified there, instead of
// promoting the whole chunk into RAM before its first range is sent. A
// connection reuses one; it is not safe for concurrent use.
type RangeReads struct {
	e      *Engine
	reads  Reads
	n      int
	lowers []tier.LowerRange // the lower-tier chunks, in hit order
	open   []lowerRead       // lowers[i]'s reads, opened at its first range
	chunk  []int32           // per chunk of the hit: its index in reads.ids, or -1 - its index in lowers
	held   [][]byte          // scratch buffers taken, given back at Release
	bytes  int               // held's bytes, counted as the pool does (whole size classes)
}

// lowerRead is a lower-tier chunk's reads: windows (each range into a
// buffer of its own), or range reads into one buffer of the chunk's size.
type lowerRead struct {
	win tier.WindowRead
	rr  tier.RangeRead
	buf []byte // rr's buffer
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
	n, lowers, err := e.mgr.AcquireRanged(ctx, keys, rd.ids, local, r.lowers[:0])
	r.n, r.lowers = n, lowers
	r.chunk = r.chunk[:0]
	refs, li := 0, 0
	for j := range n {
		if li < len(lowers) && lowers[li].At == j {
			r.chunk = append(r.chunk, int32(-1-li))
			li++
			continue
		}
		rd.ids[refs] = rd.ids[j]
		r.chunk = append(r.chunk, int32(refs))
		refs++
	}
	rd.ids = rd.ids[:refs]
	if cap(r.open) < len(lowers) {
		r.open = make([]lowerRead, len(lowers))
	}
	r.open = r.open[:len(lowers)]
	return n, err
}

// Len returns how many chunks r holds.
func (r *RangeReads) Len() int { return r.n }

// Size returns chunk j's length.
func (r *RangeReads) Size(j int) int {
	if c := r.chunk[j]; c < 0 {
		return r.lowers[-1-c].Size()
	}
	return r.reads.Size(int(r.chunk[j]))
}

// Range returns bytes [from, to) of chunk j, valid until Release: in
// place for a RAM chunk, read and verified first for a lower-tier one. A
// lower-tier chunk whose range finds no scratch memory free, or the
// request's share (RangeRequestScratchBytes) taken, is promoted whole
// into RAM instead, as Acquire does (never waiting for memory), and
// served from there. A failed read (a damaged piece, which the tier
// then drops; the tier's own error) is returned: the caller serves the
// prefix before j only.
func (r *RangeReads) Range(ctx context.Context, j, from, to int) ([]byte, error) {
	c := r.chunk[j]
	if c >= 0 {
		return r.reads.Bytes(int(c))[from:to], nil
	}
	li := int(-1 - c)
	l, o := r.lowers[li], &r.open[li]
	if l.Windows() {
		if o.win == nil {
			w, err := l.OpenWindows(ctx)
			if err != nil {
				return nil, err
			}
			o.win = w
		}
		return r.window(ctx, j, o.win, from, to)
	}
	if o.rr == nil {
		buf, ok := r.take(l.Size())
		if !ok {
			return r.promote(ctx, j, from, to)
		}
		rr, err := l.Open(ctx, buf)
		if err != nil {
			return nil, err
		}
		o.rr, o.buf = rr, buf
	}
	if err := o.rr.ReadRange(ctx, from, to); err != nil {
		return nil, err
	}
	return o.buf[from:to], nil
}

// window returns bytes [from, to) of lower-tier chunk j read through w
// into a scratch buffer, verified; with no scratch memory for it, the
// chunk promoted.
func (r *RangeReads) window(ctx context.Context, j int, w tier.WindowRead, from, to int) ([]byte, error) {
	for try := 0; ; try++ {
		buf, ok := r.take(w.WindowLen(from, to))
		if !ok {
			return r.promote(ctx, j, from, to)
		}
		data, err := w.ReadWindow(ctx, from, to, buf)
		if try > 0 || !errors.Is(err, io.ErrShortBuffer) {
			return data, err
		}
		// A version 1 record turns out, once its header is read, to
		// need a window of its whole size: the short buffer back (else
		// the request would hold it, unused, until Release), and once
		// more with that.
		r.giveBack(buf)
	}
}

// take gets a scratch buffer of n bytes for the request, or false: when
// the pool has too little free, or the request would hold more than
// RangeRequestScratchBytes.
func (r *RangeReads) take(n int) ([]byte, bool) {
	if n == 0 { // an empty range
		return nil, true
	}
	if n > RangeRequestScratchBytes {
		return nil, false
	}
	if _, size := scratchClass(n); r.bytes+size > RangeRequestScratchBytes {
		return nil, false
	}
	b, ok := r.e.scratch.get(n)
	if !ok {
		return nil, false
	}
	if len(r.held) == 0 {
		r.e.rangeHolders.Add(1)
	}
	r.held = append(r.held, b)
	r.bytes += cap(b)
	return b, true
}

// giveBack returns b, the buffer take returned last, to the pool.
func (r *RangeReads) giveBack(b []byte) {
	if b == nil { // an empty range took none
		return
	}
	k := len(r.held) - 1
	r.held[k] = nil
	r.held = r.held[:k]
	r.bytes -= cap(b)
	r.e.scratch.put(b)
	if k == 0 {
		r.e.rangeHolders.Add(-1)
	}
}

// promote reads lower-tier chunk j whole into RAM and serves it from
// there from now on.
func (r *RangeReads) promote(ctx context.Context, j, from, to int) ([]byte, error) {
	li := int(-1 - r.chunk[j])
	r.open[li].close()
	var id arena.ID
	if err := r.e.mgr.Promote(ctx, r.lowers[li], &id); err != nil {
		return nil, err
	}
	r.reads.ids = append(r.reads.ids, id)
	r.chunk[j] = int32(len(r.reads.ids) - 1)
	return r.reads.Bytes(int(r.chunk[j]))[from:to], nil
}

func (o *lowerRead) close() {
	if o.win != nil {
		o.win.Close()
	}
	if o.rr != nil {
		o.rr.Close()
	}
	*o = lowerRead{}
}

// Release drops the references, ends the lower tiers' reads and gives the
// scratch buffers back.
func (r *RangeReads) Release() {
	r.reads.Release()
	for i := range r.open {
		r.open[i].close()
	}
	if len(r.held) > 0 {
		for i, b := range r.held {
			r.e.scratch.put(b)
			r.held[i] = nil
		}
		r.held, r.bytes = r.held[:0], 0
		r.e.rangeHolders.Add(-1)
	}
	clear(r.lowers)
	r.lowers, r.n = r.lowers[:0], 0
}

// Scratch reports whether r holds scratch memory: a chunk of it is read
// from a lower tier by ranges. The server gives such a reply less time to
// be written (server/ranges.go), since the memory is bounded.
func (r *RangeReads) Scratch() bool { return len(r.held) > 0 }

// RangeBuffersInUse returns how many requests hold scratch memory now.
func (e *Engine) RangeBuffersInUse() int { return int(e.rangeHolders.Load()) }

// RangeScratchInUse returns the bytes of scratch memory requests hold now
// (at most RangeScratchBytes).
func (e *Engine) RangeScratchInUse() int { return e.scratch.inUse() }

// RangeScratchBytes bounds the scratch memory of the ranges read from
// lower tiers at once, in buffers rounded up to powers of two (at least
// 64 KiB); RangeRequestScratchBytes bounds one request's share. A
// request finding too little free, or past its share, does not wait: the
// chunk is promoted whole into RAM instead, as before ranges were read
// from lower tiers. Waiting would make it wait for the slowest readers
// of the daemon — memory is held while its ranges are written, to a reader that
// may have stopped reading — while the readers of ranges, P2P tiers and
// kvtier:// tiers, give up after a remote timeout of about 100 ms. With
// window reads (the disk tier) a range takes about its own size, so a
// layer of a 32 MiB chunk takes 1 to 2 MiB; a tier without them takes a
// buffer of the chunk's size per chunk.
const RangeScratchBytes = 128 << 20

// RangeRequestScratchBytes bounds the scratch memory one request holds, so
// that a request asking for ranges of many disk-only chunks leaves at
// least three quarters of RangeScratchBytes to the other readers: past it
// the chunks it reads next are promoted whole. All of one chunk of up to
// 32 MiB read by windows fits in it, as do a few layers of each of many
// chunks; a version 1 disk record of more than 32 MiB, which needs a
// window of its whole size, is promoted.
const RangeRequestScratchBytes = RangeScratchBytes / 4

// minScratchShift makes the smallest scratch buffer, 64 KiB.
const minScratchShift = 16

// scratchClasses are the buffer sizes, 64 KiB << class, up to 256 MiB.
const scratchClasses = 28 - minScratchShift + 1

// scratchPool keeps the buffers lower-tier ranges are read into, by
// power-of-two size class, so that a daemon serving ranges allocates
// none once warm. Buffers in use and kept free add up to at most
// RangeScratchBytes.
type scratchPool struct {
	mu        sync.Mutex
	used      int // bytes of the buffers taken
	freeBytes int // bytes of the buffers kept in free
	free      [scratchClasses][][]byte
}

// scratchClass returns the size class of an n-byte buffer and its length.
func scratchClass(n int) (int, int) {
	c := 0
	for (1<<minScratchShift)<<c < n {
		c++
	}
	return c, (1 << minScratchShift) << c
}

func (p *scratchPool) inUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

// get returns a buffer of n bytes, or false when that would take the
// pool past RangeScratchBytes.
func (p *scratchPool) get(n int) ([]byte, bool) {
	if n <= 0 || n > RangeScratchBytes {
		return nil, false
	}
	c, size := scratchClass(n)
	p.mu.Lock()
	if p.used+size > RangeScratchBytes {
		p.mu.Unlock()
		return nil, false
	}
	p.used += size
	var b []byte
	if k := len(p.free[c]); k > 0 {
		b, p.free[c] = p.free[c][k-1], p.free[c][:k-1]
		p.freeBytes -= size
	} else {
		p.shrink(RangeScratchBytes - p.used) // room for a new one
	}
	p.mu.Unlock()
	if b == nil {
		b = make([]byte, size)
	}
	return b[:n], true
}

// shrink drops free buffers, the largest first, until at most keep bytes
// are kept. Called with p.mu held.
func (p *scratchPool) shrink(keep int) {
	for c := scratchClasses - 1; c >= 0 && p.freeBytes > keep; c-- {
		for len(p.free[c]) > 0 && p.freeBytes > keep {
			k := len(p.free[c]) - 1
			p.free[c][k] = nil
			p.free[c] = p.free[c][:k]
			p.freeBytes -= (1 << minScratchShift) << c
		}
	}
}

// put gives back a buffer from get.
func (p *scratchPool) put(b []byte) {
	c, size := scratchClass(cap(b))
	p.mu.Lock()
	p.used -= size
	p.free[c] = append(p.free[c], b[:size])
	p.freeBytes += size
	p.shrink(RangeScratchBytes - p.used)
	p.mu.Unlock()
}
