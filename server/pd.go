package server

import (
	"context"
	"crypto/tls"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/internal/ratelog"
	"kvtier/netallow"
)

// Prefill/decode transfer (docs/disaggregation.md). A producer daemon pushes the
// chunks its connector names (PUSH) to a consumer daemon (RECEIVE); the
// consumer keeps them in RAM, held, until they are read or their hold
// runs out, within a byte budget that makes a full consumer slow the
// producer down instead of evicting or growing.

// Transfer defaults and limits.
const (
	DefaultPDTimeout = time.Minute      // a PUSH that names no timeout
	maxPDTimeout     = 10 * time.Minute // longest transfer, hold and WAIT
	maxActivePushes  = 1024             // transfers being pushed at once
	maxPushesPerDest = 256              // of those, to one destination
	maxEndedPushes   = 4096             // ended transfers remembered for PUSH_STATUS
	keepEnded        = 10 * time.Minute // how long an ended transfer is remembered
	defaultPDBudget  = 1 << 30          // pd_receive_bytes when unset, at most half the arena
)

// pdTimeout applies the rule to a duration asked in milliseconds.
func pdTimeout(ms uint32) time.Duration {
	if ms == 0 {
		return DefaultPDTimeout
	}
	return min(time.Duration(ms)*time.Millisecond, maxPDTimeout)
}

// pd is the daemon's transfer state: chunks it pushes and chunks pushed
// to it.
type pd struct {
	eng   *engine.Engine
	log   *slog.Logger
	logs  ratelog.Set // failed pushes: one per transfer while a destination is down
	token string
	allow *netallow.List // where PUSH may send chunks (and the token)
	tls   *tls.Config    // dial destinations over TLS with it, when set

	budget  budget
	arrived signal // a pushed chunk became visible

	mu        sync.Mutex
	holds     map[chunk.Key]hold
	nheld     atomic.Int64
	expecting map[chunk.Key]int // holds announced and not yet kept (pd_expect.go)
	readEarly map[chunk.Key]int // reads of those meanwhile
	nexpect   atomic.Int64

	pushMu    sync.Mutex
	transfers map[uint64]*transfer
	active    int
	activeTo  map[string]int        // active transfers by destination
	conns     map[string][]pushConn // idle connections by destination
	noLayers  map[string]time.Time  // destinations found without RECEIVE_LAYERS, and when (pd_feed.go)
	ended     []endedTransfer       // oldest first
	done      atomic.Uint64         // transfers that ended, by outcome
	failed    atomic.Uint64

	ctx    context.Context // cancelled at shutdown: ends every push
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// hold keeps one received chunk in RAM until it is read or its deadline.
// A chunk pushed by several transfers is held once, until the latest
// deadline or until it has been read as many times as it was pushed.
type hold struct {
	ref      engine.Held
	size     int64
	deadline time.Time
	readers  int
}

type endedTransfer struct {
	id uint64
	at time.Time
}

func newPD(eng *engine.Engine, budgetBytes int64, token string, allow *netallow.List, log *slog.Logger) *pd {
	if budgetBytes <= 0 {
		budgetBytes = defaultPDBudget
		if eng != nil { // (tests make services of no engine to list their metrics)
			budgetBytes = min(budgetBytes, eng.ArenaBytes()/2)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &pd{eng: eng, log: log, token: token, allow: allow, budget: budget{limit: budgetBytes},
		holds: make(map[chunk.Key]hold), transfers: make(map[uint64]*transfer), activeTo: make(map[string]int),
		conns: make(map[string][]pushConn), noLayers: make(map[string]time.Time), ctx: ctx, cancel: cancel}
}

// keep holds key's chunk, referenced by h, for ttl, charging size bytes
// that the caller already took from the budget. A chunk held already
// keeps its one hold, now for one more reader and until the later of the
// two deadlines; the new reference and bytes are given back.
func (p *pd) keep(key chunk.Key, h engine.Held, size int64, ttl time.Duration) {
	p.mu.Lock()
	held := p.keepLocked(key, h, size, ttl)
	p.mu.Unlock()
	if held {
		p.eng.Unhold(h)
		p.budget.release(size)
	}
}

// keepLocked is keep under p.mu; it reports whether the chunk was held
// already, when the caller gives h and size back.
func (p *pd) keepLocked(key chunk.Key, h engine.Held, size int64, ttl time.Duration) bool {
	deadline := time.Now().Add(ttl)
	old, ok := p.holds[key]
	if !ok {
		p.holds[key] = hold{ref: h, size: size, deadline: deadline, readers: 1}
		p.nheld.Add(1)
		return false
	}
	old.readers++
	if deadline.After(old.deadline) {
		old.deadline = deadline
	}
	p.holds[key] = old
	return true
}

// consumed ends the holds of keys a client has just read.
func (p *pd) consumed(keys []chunk.Key) {
	// Announcements first: keepExpected adds the hold before it ends the
	// announcement, so one of the two counts is seen.
	if p.nexpect.Load() == 0 && p.nheld.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		h, ok := p.holds[k]
		switch {
		case !ok:
			p.readEarlyLocked(k)
		case h.readers > 1:
			h.readers--
			p.holds[k] = h
		default:
			p.dropLocked(k, h)
		}
	}
}

func (p *pd) dropLocked(k chunk.Key, h hold) {
	delete(p.holds, k)
	p.nheld.Add(-1)
	p.eng.Unhold(h.ref)
	p.budget.release(h.size)
}

// sweep ends holds past their deadline and forgets transfers that ended
// long ago.
func (p *pd) sweep(now time.Time) {
	if p.nheld.Load() > 0 {
		p.mu.Lock()
		for k, h := range p.holds {
			if now.After(h.deadline) {
				p.dropLocked(k, h)
			}
		}
		p.mu.Unlock()
	}
	p.pushMu.Lock()
	n := 0
	for n < len(p.ended) && (now.Sub(p.ended[n].at) > keepEnded || len(p.ended)-n > maxEndedPushes) {
		delete(p.transfers, p.ended[n].id)
		n++
	}
	p.ended = p.ended[:copy(p.ended, p.ended[n:])]
	p.sweepNoLayersLocked(now)
	p.pushMu.Unlock()
}

// close ends every push (as failed) and every hold; the service calls it
// once its sessions are gone. Cancelling p.ctx interrupts the dials and
// RECEIVEs of pushes in progress, so the wait for them is short.
func (p *pd) close() {
	p.cancel()
	p.wg.Wait()
	p.pushMu.Lock()
	for dest, cs := range p.conns {
		for _, c := range cs {
			c.c.Close()
		}
		delete(p.conns, dest)
	}
	p.pushMu.Unlock()
	p.mu.Lock()
	for k, h := range p.holds {
		p.dropLocked(k, h)
	}
	p.mu.Unlock()
}

// HeldBytes returns the bytes of pushed chunks this daemon holds for
// readers, within the pd_receive_bytes budget.
func (s *Service) HeldBytes() int64 { return s.pd.budget.used() }

// ReceiveWaiting returns how many pushed chunks (RECEIVE) and batches
// (RECEIVE_LAYERS) wait for room in the pd_receive_bytes budget.
func (s *Service) ReceiveWaiting() int { return s.pd.budget.waiting() }

// signal wakes waiters, each on a channel of its own made once (a
// session's), so that waking them for every chunk allocates nothing.
type signal struct {
	mu      sync.Mutex
	waiters []chan struct{}
}

// add registers ch (capacity 1) to be woken; call it before checking
// what is waited for, so that a change in between is not missed.
func (s *signal) add(ch chan struct{}) {
	select { // a wake-up left from an earlier wait
	case <-ch:
	default:
	}
	s.mu.Lock()
	s.waiters = append(s.waiters, ch)
	s.mu.Unlock()
}

func (s *signal) remove(ch chan struct{}) {
	s.mu.Lock()
	for i, w := range s.waiters {
		if w == ch {
			last := len(s.waiters) - 1
			s.waiters[i], s.waiters[last] = s.waiters[last], nil
			s.waiters = s.waiters[:last]
			break
		}
	}
	s.mu.Unlock()
}

func (s *signal) broadcast() {
	s.mu.Lock()
	for _, ch := range s.waiters {
		select {
		case ch <- struct{}{}:
		default: // it has one pending already
		}
	}
	s.mu.Unlock()
}
