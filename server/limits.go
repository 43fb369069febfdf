package server

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/wire"
)

// The limits that bound what connections can make the daemon hold: how
// many may be open, how long a frame may take once its header arrived,
// and how many large metadata bodies may be buffered at once. Chunk bytes
// never count here: they are read straight into arena objects, which the
// arena bounds.

// bodyPool lends connections the buffers of metadata bodies larger than
// wire.SmallBody. A connection takes one of a fixed number of slots for
// the first such buffer of a request and keeps it until the request ends;
// the slots bound the memory all large bodies hold together (each is at
// most wire.MaxMetaBody). A slot is the only thing a reader ever waits
// for, and it waits holding nothing: growing a buffer it already has a
// slot for never waits, so readers cannot deadlock each other. A reader
// that finds no slot free waits until its frame's deadline: a peer that
// stalls with a half-sent large body holds its slot only until then.
//
// Buffers are power-of-two sizes from just above wire.SmallBody to
// wire.MaxMetaBody, recycled through sync.Pools, which the garbage
// collector empties when they sit unused.
type bodyPool struct {
	slots   chan struct{}
	classes [poolClasses]sync.Pool // class i holds *[]byte of minPooled<<i bytes
	lent    atomic.Int64           // bytes lent since returnMemory last acted
}

const (
	minPooled   = wire.SmallBody * 2
	poolClasses = 7 // 128 KiB … 8 MiB
)

// newBodyPool returns a pool whose slots hold budget bytes in all.
func newBodyPool(budget int) *bodyPool {
	return &bodyPool{slots: make(chan struct{}, max(1, budget/wire.MaxMetaBody))}
}

var errNoSlot = fmt.Errorf("%w: every buffer for large request bodies stayed in use until the frame's deadline", wire.ErrTooBig)

// acquire takes a slot, waiting until deadline at the latest.
func (p *bodyPool) acquire(deadline time.Time) error {
	select {
	case p.slots <- struct{}{}:
		return nil
	default:
	}
	left := time.Until(deadline)
	if deadline.IsZero() || left <= 0 {
		return errNoSlot
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return nil
	case <-t.C:
		return errNoSlot
	}
}

func (p *bodyPool) release() { <-p.slots }

// poolClass returns the size class of an n-byte buffer and its size.
func poolClass(n int) (int, int) {
	c, size := 0, minPooled
	for size < n {
		c, size = c+1, size*2
	}
	return c, size
}

func (p *bodyPool) get(n int) ([]byte, error) {
	c, size := poolClass(n)
	if c >= poolClasses {
		return nil, fmt.Errorf("%w: a body of %d bytes", wire.ErrTooBig, n)
	}
	p.lent.Add(int64(size))
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:0], nil
	}
	return make([]byte, 0, size), nil
}

func (p *bodyPool) put(b []byte) {
	if c, size := poolClass(cap(b)); size == cap(b) && c < poolClasses {
		p.classes[c].Put(&b)
	}
}

// returnMemory hands the heap that large bodies used back to the operating
// system once none is in use. The Go runtime would return it too, but over
// minutes; a burst of large bodies (or of clients stalling with half-sent
// ones) should not leave the daemon's RSS high that long.
func (p *bodyPool) returnMemory() {
	if len(p.slots) > 0 || p.lent.Load() < returnAfter {
		return
	}
	p.lent.Store(0)
	// The first collection moves pooled buffers to the pools' victim
	// caches; the one FreeOSMemory runs frees them and returns the pages.
	runtime.GC()
	debug.FreeOSMemory()
}

// returnAfter is how many bytes lent make returnMemory act: below it the
// runtime's own pace is fine.
const returnAfter = 16 << 20

// frameCharge is one connection's handle on the body pool, a wire.Pool.
// It takes a slot on the first large buffer of a request, waiting no
// longer than the deadline of the frame being read, and done gives the
// slot back when the request ends.
type frameCharge struct {
	pool     *bodyPool
	deadline time.Time
	holding  bool
}

func (c *frameCharge) Get(n int) ([]byte, error) {
	if !c.holding {
		if err := c.pool.acquire(c.deadline); err != nil {
			return nil, err
		}
		c.holding = true
	}
	return c.pool.get(n)
}

func (c *frameCharge) Put(b []byte) { c.pool.put(b) }

func (c *frameCharge) done() {
	if c.holding {
		c.pool.release()
		c.holding = false
	}
}

// armFrame starts the deadline of a frame whose header just arrived and
// whose n body bytes are due: unless they are already buffered (the common
// case for small requests, which then pay for no timer), the connection's
// read deadline moves to FrameTimeout from now.
func (s *session) armFrame(n uint32) {
	if s.br.Buffered() >= int(n) {
		return
	}
	s.charge.deadline = time.Now().Add(s.svc.opts.FrameTimeout)
	s.conn.SetReadDeadline(s.charge.deadline)
	s.armed = true
}

// settle ends a request's hold on memory and time: a large body buffer
// and its slot go back to the pool, and a frame deadline is lifted so an idle
// connection may wait for its next request as long as it likes.
func (s *session) settle() {
	s.rd.Shrink()
	s.charge.done()
	if s.armed {
		s.conn.SetReadDeadline(time.Time{})
		s.charge.deadline = time.Time{}
		s.armed = false
	}
}

// frameErr turns a read error inside a frame into the error a client sees.
func frameErr(err error) error {
	if os.IsTimeout(err) {
		return fmt.Errorf("the frame was not complete within the daemon's frame_timeout: %w", err)
	}
	return err
}

// maxRefusing bounds the connections being refused at once; beyond it a
// connection over the cap is closed without a word.
const maxRefusing = 32

// refuse tells a connection over max_connections why it is turned away
// (an error reply to the HELLO it is about to send, request id 0) and
// closes it. It reads whatever the peer sends for a moment first, so the
// close does not reset the connection before the reply is read.
func (s *Service) refuse(c net.Conn) {
	s.refused.Add(1)
	select {
	case s.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-s.refusing }()
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		msg := fmt.Sprintf("the daemon serves %d connections, its limit (max_connections); try again later", s.opts.MaxConns)
		b := append(wire.Begin(nil), msg...)
		if _, err := c.Write(wire.Finish(b, wire.OpHello, wire.FlagReply, 0, wire.StatusNoSpace)); err != nil {
			return
		}
		io.CopyN(io.Discard, c, 64<<10)
	}()
}
