package server

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"kvtier/wire"
)

// The limits that bound what connections can make the daemon hold: how
// many may be open, how long a frame may take once its header arrived,
// and how many bytes of large metadata bodies all connections together
// may buffer. Chunk bytes never count here: they are read straight into
// arena objects, which the arena bounds.

// bodyBudget is a counting semaphore of bytes shared by every connection's
// frame reader. A reader waits for room until its frame's deadline: a
// stalled peer holds what it sent only until its frame times out.
type bodyBudget struct {
	mu   sync.Mutex
	free int
	size int
	wake chan struct{} // closed and replaced whenever bytes are given back
}

func newBodyBudget(size int) *bodyBudget {
	return &bodyBudget{free: size, size: size, wake: make(chan struct{})}
}

var errBudget = fmt.Errorf("%w: the daemon's memory for request bodies stayed in use until the frame's deadline", wire.ErrTooBig)

// take reserves n bytes, waiting until deadline at the latest.
func (b *bodyBudget) take(n int, deadline time.Time) error {
	if n > b.size {
		return fmt.Errorf("%w: a body needing %d bytes, more than the budget of %d", wire.ErrTooBig, n, b.size)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			return nil
		}
		wake := b.wake
		b.mu.Unlock()
		left := time.Until(deadline)
		if deadline.IsZero() || left <= 0 {
			return errBudget
		}
		if timer == nil {
			timer = time.NewTimer(left)
		}
		select {
		case <-wake:
		case <-timer.C:
			return errBudget
		}
	}
}

func (b *bodyBudget) give(n int) {
	b.mu.Lock()
	b.free += n
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
}

// frameCharge is one connection's handle on the body budget: it carries
// the deadline of the frame being read (wire.Budget has no place for one).
type frameCharge struct {
	budget   *bodyBudget
	deadline time.Time
}

func (c *frameCharge) Take(n int) error { return c.budget.take(n, c.deadline) }
func (c *frameCharge) Give(n int)       { c.budget.give(n) }

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
// goes back to the budget, and a frame deadline is lifted so an idle
// connection may wait for its next request as long as it likes.
func (s *session) settle() {
	s.rd.Shrink()
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
