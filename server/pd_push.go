package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/wire"
)

// Batches of one RECEIVE: the chunks queued when the pusher looks, up to
// these bounds, so that a long prompt streams without a round trip per
// chunk and a chunk saved alone goes out at once.
const (
	pushBatchChunks = 64
	pushBatchBytes  = 256 << 20
	// pushConnsPerDest bounds the idle connections kept per consumer.
	pushConnsPerDest = 4
)

// transfer is one PUSH transfer on the producer: the chunks queued (held
// by references until the consumer has them) and how far it got. One
// goroutine (run) sends them; PUSH requests add to the queue.
type transfer struct {
	id      uint64
	dest    string
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	wake    chan struct{} // cap 1: the queue grew, or it was marked last

	mu     sync.Mutex
	keys   []chunk.Key // queued and not yet sent; refs holds them in the same order
	refs   engine.Refs
	fed    []engine.Fed // beside keys: a chunk of a store lease still being filled, else zero
	last   bool
	state  wire.TransferState
	queued uint32
	pushed uint32
	msg    string
}

// push adds keys to transfer m.Transfer, starting it if it is new, and
// returns how many chunks it has queued in all. The chunks are referenced
// into scratch first, outside the transfer's lock (it may read them from
// disk), then moved onto the transfer's queue under it.
func (p *pd) push(m *wire.Push, keys []chunk.Key, scratch *engine.Refs, fed *[]engine.Fed) (int, *requestError) {
	if m.Dest == "" {
		return 0, fail(wire.StatusBadRequest, "push: no destination address")
	}
	// The producer presents the fleet's tcp_token to whatever it dials, so
	// a client may only name destinations the configuration allows.
	if err := p.allow.Allowed(m.Dest); err != nil {
		return 0, fail(wire.StatusBadRequest, "push: destination refused by pd_push_allow: %v", err)
	}
	t, rerr := p.transferFor(m)
	if rerr != nil {
		return 0, rerr
	}
	t.mu.Lock()
	rerr = t.takesLocked()
	t.mu.Unlock()
	if rerr != nil {
		return 0, rerr
	}
	*fed = (*fed)[:0]
	var n int
	if m.StoreLease != 0 {
		var err error
		if *fed, n, err = p.eng.FeedChunks(engine.LeaseID(m.StoreLease), keys, scratch, *fed); err != nil {
			return 0, fail(wire.StatusNotFound, "push: store lease %d: %v", m.StoreLease, err)
		}
	} else {
		n, _ = scratch.AcquireLocal(t.ctx, p.eng, keys)
		for range n {
			*fed = append(*fed, engine.Fed{})
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if rerr := t.takesLocked(); rerr != nil { // it ended, or timed out, meanwhile
		scratch.Release()
		return 0, rerr
	}
	if n < len(keys) {
		scratch.Release()
		t.failLocked(fmt.Sprintf("chunk %d of %d named by a PUSH is not cached on the producer", n, len(keys)))
		return 0, fail(wire.StatusNotFound, "transfer %d: chunk %d of %d is not cached here; the transfer failed", t.id, n, len(keys))
	}
	t.refs.Splice(scratch)
	t.keys = append(t.keys, keys...)
	t.fed = append(t.fed, *fed...)
	t.queued += uint32(n)
	t.last = m.Last
	select {
	case t.wake <- struct{}{}:
	default:
	}
	return int(t.queued), nil
}

// takesLocked says why the transfer takes no more chunks, if it does not:
// it ended, its time is up (before run has marked it failed), the daemon
// is shutting down, or it was marked last.
func (t *transfer) takesLocked() *requestError {
	switch {
	case t.state == wire.TransferDone:
		return fail(wire.StatusBadRequest, "transfer %d has ended (%s)", t.id, t.state)
	case t.state != wire.TransferPending:
		return fail(wire.StatusBadRequest, "transfer %d has ended (%s): %s", t.id, t.state, t.msg)
	case t.ctx.Err() != nil && t.pastDeadline():
		return fail(wire.StatusBadRequest, "transfer %d has ended (failed): timed out after %v", t.id, t.timeout)
	case t.ctx.Err() != nil:
		return fail(wire.StatusShuttingDown, "transfer %d was cancelled: the daemon is shutting down", t.id)
	case t.last:
		return fail(wire.StatusBadRequest, "transfer %d was marked last; it takes no more chunks", t.id)
	}
	return nil
}

// transferFor returns transfer m.Transfer, made and started if new.
func (p *pd) transferFor(m *wire.Push) (*transfer, *requestError) {
	p.pushMu.Lock()
	defer p.pushMu.Unlock()
	if t, ok := p.transfers[m.Transfer]; ok {
		if t.dest != m.Dest {
			return nil, fail(wire.StatusBadRequest, "transfer %d goes to %s, not %s", m.Transfer, t.dest, m.Dest)
		}
		return t, nil
	}
	if p.active >= maxActivePushes {
		return nil, fail(wire.StatusNoSpace, "%d transfers are being pushed; retry later", p.active)
	}
	// One destination that never answers cannot take every slot.
	if p.activeTo[m.Dest] >= maxPushesPerDest {
		return nil, fail(wire.StatusNoSpace, "%d transfers are being pushed to %s; retry later", p.activeTo[m.Dest], m.Dest)
	}
	timeout := pdTimeout(m.TimeoutMS)
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	t := &transfer{id: m.Transfer, dest: m.Dest, timeout: timeout, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	p.transfers[t.id] = t
	p.active++
	p.activeTo[t.dest]++
	p.wg.Add(1)
	go p.run(t)
	return t, nil
}

// status returns transfer id's state.
func (p *pd) status(id uint64) (wire.PushStatusReply, bool) {
	p.pushMu.Lock()
	t, ok := p.transfers[id]
	p.pushMu.Unlock()
	if !ok {
		return wire.PushStatusReply{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return wire.PushStatusReply{State: t.state, Queued: t.queued, Pushed: t.pushed, Message: t.msg}, true
}

// failLocked ends the transfer as failed.
func (t *transfer) failLocked(msg string) {
	if t.state != wire.TransferPending {
		return
	}
	t.state, t.msg = wire.TransferFailed, msg
	t.cancel() // run lets the chunks go once it stops sending them
}

// pastDeadline reports whether the transfer's time is up. The
// connection's deadline is the context's, and may fire first: an I/O
// timeout then is the transfer timing out.
func (t *transfer) pastDeadline() bool {
	d, _ := t.ctx.Deadline()
	return t.ctx.Err() == context.DeadlineExceeded || !time.Now().Before(d)
}

// pusher is the scratch of one transfer's sending goroutine.
type pusher struct {
	pushConn // to the destination; no client until dialled
	// pooled says the connection came from the pool and has carried no
	// request of this transfer yet: only then is one found closed replaced
	// and the request sent again. Mid-transfer, the consumer may have
	// taken part of the batch already, and a new connection would start
	// the transfer anew there (its queue, its holds).
	pooled bool
	keys   []chunk.Key
	bufs   [][]byte
	fed    []engine.Fed
	layers wire.ReceiveLayers // a fed batch's request
}

// run sends t's queued chunks as they come until t is done or fails, then
// marks it ended.
func (p *pd) run(t *transfer) {
	defer p.wg.Done()
	ps := pusher{keys: make([]chunk.Key, 0, pushBatchChunks), bufs: make([][]byte, 0, pushBatchChunks), fed: make([]engine.Fed, 0, pushBatchChunks)}
	err := p.send(t, &ps)
	if ps.c != nil {
		if err == nil {
			ps.lastID = t.id
			p.putConn(t.dest, ps.pushConn)
		} else {
			ps.c.Close() // mid-request, or the consumer is gone; not pooled, so not trusted again
		}
	}
	t.mu.Lock()
	switch {
	case err == nil:
		t.state = wire.TransferDone
	case t.pastDeadline():
		t.failLocked(fmt.Sprintf("timed out after %v with %d of %d chunks pushed: %v", t.timeout, t.pushed, t.queued, err))
	default:
		t.failLocked(fmt.Sprintf("pushing to %s: %v", t.dest, err))
	}
	t.refs.Release()
	t.keys, t.fed = t.keys[:0], t.fed[:0]
	failed, msg := t.state == wire.TransferFailed, t.msg
	t.mu.Unlock()
	t.cancel()
	if failed {
		p.failed.Add(1)
		p.logs.Log(p.log, slog.LevelInfo, "push failed", "transfer", t.id, "dest", t.dest, "err", msg)
	} else {
		p.done.Add(1)
	}
	p.pushMu.Lock()
	p.active--
	if p.activeTo[t.dest]--; p.activeTo[t.dest] == 0 {
		delete(p.activeTo, t.dest)
	}
	p.ended = append(p.ended, endedTransfer{id: t.id, at: time.Now()})
	p.pushMu.Unlock()
}

// send is run's loop; it returns nil once a last-flagged transfer is all
// pushed.
func (p *pd) send(t *transfer, ps *pusher) error {
	for {
		n, last, err := p.nextBatch(t, ps)
		if err != nil {
			return err
		}
		if n == 0 {
			if last {
				return nil
			}
			select {
			case <-t.wake:
				continue
			case <-t.ctx.Done():
				return t.ctx.Err()
			}
		}
		var stored int
		if ps.fed[0].Feed != nil {
			n, stored, err = p.receiveFed(t, ps, n)
		} else {
			stored, err = p.receive(t, ps, n)
		}
		if err != nil {
			return err
		}
		if stored != n {
			return fmt.Errorf("the consumer stored %d of %d chunks", stored, n)
		}
		t.mu.Lock()
		t.refs.DropFront(n)
		t.keys = t.keys[:copy(t.keys, t.keys[n:])]
		t.fed = t.fed[:copy(t.fed, t.fed[n:])]
		t.pushed += uint32(n)
		t.mu.Unlock()
	}
}

// receive sends the batch in ps with one RECEIVE. A pooled connection
// the consumer has closed since (restarted, idle too long), found so by
// its first request, is replaced once; a connection closed mid-transfer
// fails the transfer.
func (p *pd) receive(t *transfer, ps *pusher, n int) (int, error) {
	hold := uint32(t.timeout / time.Millisecond)
	for attempt := 0; ; attempt++ {
		if ps.c == nil {
			if err := ps.dial(p, t); err != nil {
				return 0, err
			}
		}
		retry := ps.pooled
		ps.pooled = false // it carries a request of this transfer now
		// The client applies t.ctx's deadline only: a transfer failed or
		// cancelled by shutdown must not wait for the consumer's budget.
		stop := context.AfterFunc(t.ctx, ps.c.Interrupt)
		stored, err := ps.c.Receive(t.ctx, t.id, hold, ps.keys[:n], ps.bufs[:n], nil)
		if !stop() { // interrupted, or about to be: the connection is done
			ps.dropConn()
			if err == nil {
				err = t.ctx.Err()
			}
			return stored, err
		}
		if err == nil || !retry || attempt > 0 || !errors.Is(err, client.ErrClosed) || t.ctx.Err() != nil {
			return stored, err
		}
		ps.dropConn()
		p.dropConns(t.dest)
	}
}

// conn returns a connection to t's destination: an idle pooled one, with
// what it answered before, or a new one. A pooled connection whose last
// transfer had t's id is not taken: the consumer would take t for that
// transfer continued (its deadline, its place past the budget's queue).
func (p *pd) conn(t *transfer) (pushConn, bool, error) {
	p.pushMu.Lock()
	cs := p.conns[t.dest]
	for i := len(cs) - 1; i >= 0; i-- {
		if c := cs[i]; c.lastID != t.id {
			last := len(cs) - 1
			copy(cs[i:], cs[i+1:])
			cs[last] = pushConn{}
			p.conns[t.dest] = cs[:last]
			p.pushMu.Unlock()
			return c, true, nil
		}
	}
	p.pushMu.Unlock()
	tc, err := p.tlsFor(t.dest)
	if err != nil {
		return pushConn{}, false, err
	}
	c, err := client.DialTCP(t.ctx, t.dest, client.Options{Token: p.token, Name: "kvtier-pd", Timeout: t.timeout, TLS: tc})
	return pushConn{c: c}, false, err
}

// dial gives ps a connection to t's destination (see conn).
func (ps *pusher) dial(p *pd, t *transfer) error {
	c, pooled, err := p.conn(t)
	ps.pushConn, ps.pooled = c, pooled
	return err
}

// dropConn closes ps's connection and forgets what it answered.
func (ps *pusher) dropConn() {
	ps.c.Close()
	ps.pushConn, ps.pooled = pushConn{}, false
}

// tlsFor returns the TLS configuration to dial dest with: none without
// tcp_tls_ca, else the daemon's, set to verify dest's host when it names
// no server of its own.
func (p *pd) tlsFor(dest string) (*tls.Config, error) {
	if p.tls == nil || p.tls.ServerName != "" {
		return p.tls, nil
	}
	host, _, err := net.SplitHostPort(dest)
	if err != nil {
		return nil, fmt.Errorf("destination %q: %w", dest, err)
	}
	tc := p.tls.Clone()
	tc.ServerName = host
	return tc, nil
}

// putConn keeps a healthy connection for the next transfer to its
// destination, up to a few per destination.
func (p *pd) putConn(dest string, c pushConn) {
	p.pushMu.Lock()
	if p.ctx.Err() == nil && len(p.conns[dest]) < pushConnsPerDest {
		p.conns[dest] = append(p.conns[dest], c)
		c.c = nil
	}
	p.pushMu.Unlock()
	if c.c != nil {
		c.c.Close()
	}
}

// dropConns closes the idle connections to dest: one was found closed,
// so the others likely are too.
func (p *pd) dropConns(dest string) {
	p.pushMu.Lock()
	cs := p.conns[dest]
	delete(p.conns, dest)
	p.pushMu.Unlock()
	for _, c := range cs {
		c.c.Close()
	}
}

// nextBatch fills ps with the leading queued chunks (their bytes stay
// valid: only this goroutine drops their references) and reports whether
// the queue is complete.
func (p *pd) nextBatch(t *transfer, ps *pusher) (int, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != wire.TransferPending {
		return 0, false, fmt.Errorf("transfer %s", t.state)
	}
	ps.keys, ps.bufs, ps.fed = ps.keys[:0], ps.bufs[:0], ps.fed[:0]
	bytes := 0
	for j := 0; j < len(t.keys) && j < pushBatchChunks; j++ {
		b := t.refs.Bytes(j)
		if j > 0 && (bytes+len(b) > pushBatchBytes || t.fed[j].Feed != t.fed[0].Feed) {
			break // a batch is of one store lease in progress, or of none
		}
		bytes += len(b)
		ps.keys = append(ps.keys, t.keys[j])
		ps.bufs = append(ps.bufs, b)
		ps.fed = append(ps.fed, t.fed[j])
	}
	return len(ps.keys), t.last && len(t.keys) == 0, nil
}
