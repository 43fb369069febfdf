package remote

import (
	"sync"
	"sync/atomic"
	"time"
)

// Corruption. A store whose answers fail their checksums answers all the
// same: its pings succeed, its calls return in time, so the failure count
// alone would keep it, or close its circuit again within two probes, and
// every read of it would cost a transfer and then the recompute. So reads
// that fail verification (a damaged envelope, piece or P2P checksum) are
// counted apart from failures and weigh on the store's health on their
// own:
//
//   - Each corrupt read adds corruptWeight to a score and each verified
//     read takes one off (not below zero). At corruptWeight × Threshold
//     (Threshold corrupt reads in a row, or more than a third of the reads
//     over a longer run) the circuit opens for corruption.
//   - Opened for corruption, the circuit is not probed for a back-off
//     (CorruptBackoff, 30 s by default): a ping proves the store answers,
//     not that its bytes are right. Then it is probed as after any
//     opening and closes on two good probes, but on probation: the first
//     read that fails verification before one passes opens it again at
//     once, for twice the back-off (up to CorruptBackoffMax, 10 min). The
//     first verified read ends the probation and resets the back-off.
//
// Who verifies depends on the stack. Encoded checks envelopes above the
// breaker and tells it (ReportCorrupt, ReportVerified); a store that checks
// its own reads (a P2P peer's checksums, GuardOptions.ReadsVerified) has
// its Get's nil error count as verified; ErrCorrupt from any inner call
// counts as corrupt.

// corruptWeight is what a corrupt read adds to the score; a verified read
// takes one off.
const corruptWeight = 2

// Defaults of GuardOptions.CorruptBackoff and CorruptBackoffMax.
const (
	DefaultCorruptBackoff    = 30 * time.Second
	DefaultCorruptBackoffMax = 10 * time.Minute
)

// corruption is a breaker's state about damaged answers.
type corruption struct {
	score     atomic.Int32
	probation atomic.Bool  // closed again after a corruption opening, no read verified since
	until     atomic.Int64 // unix ns: probes are held until then
	reads     atomic.Uint64
	opens     atomic.Uint64
	held      atomic.Uint64 // probes not run because of the back-off

	mu      sync.Mutex
	backoff time.Duration // of the next opening; 0: CorruptBackoff

	racing func() // a test's: runs in ReportVerified between its first look and its decision
}

// ReportCorrupt tells the breaker that bytes the store returned failed
// verification. It may open the circuit (see above).
func (g *Guarded) ReportCorrupt() {
	c := &g.cor
	c.reads.Add(1)
	score := c.score.Add(corruptWeight)
	if c.probation.Load() || int(score) >= corruptWeight*g.o.Threshold {
		g.openForCorruption()
	}
}

// ReportVerified tells the breaker that bytes the store returned passed
// verification. It costs two atomic loads while nothing is amiss.
func (g *Guarded) ReportVerified() {
	c := &g.cor
	for s := c.score.Load(); s > 0 && !c.score.CompareAndSwap(s, s-1); s = c.score.Load() {
	}
	if !c.probation.Load() {
		return
	}
	if c.racing != nil {
		c.racing()
	}
	// Under c.mu, so that an opening for corruption (which sets probation
	// and the back-off under it) cannot fall between the check of the
	// state and the end of the probation: that would leave the circuit
	// open for corruption, off probation, with the back-off reset.
	c.mu.Lock()
	ended := c.probation.Load() && State(g.state.Load()) != StateOpen
	if ended {
		c.probation.Store(false)
		c.backoff = 0
	}
	c.mu.Unlock()
	if ended {
		g.o.Logger.Info("remote tier's reads verify again", "tier", g.inner.Name())
	}
}

// openForCorruption opens the circuit and holds its probes for the
// back-off, which it doubles for the next time.
func (g *Guarded) openForCorruption() {
	c := &g.cor
	c.mu.Lock()
	defer c.mu.Unlock()
	now := g.now()
	if State(g.state.Load()) == StateOpen && now.UnixNano() < c.until.Load() {
		return // held open for corruption already
	}
	wait := c.backoff
	if wait <= 0 {
		wait = g.o.CorruptBackoff
	}
	c.backoff = min(2*wait, g.o.CorruptBackoffMax)
	c.until.Store(now.Add(wait).UnixNano())
	c.probation.Store(true)
	c.score.Store(0)
	for {
		s := g.state.Load()
		if State(s) == StateOpen {
			// Open already (for failures, or for corruption with the
			// back-off run out and not yet probed): the hold and the
			// probation above apply, but this is no new opening.
			return
		}
		if g.state.CompareAndSwap(s, int32(StateOpen)) {
			break
		}
	}
	g.opens.Add(1)
	c.opens.Add(1)
	g.o.Logger.Warn("remote tier cut off: its answers fail verification", "tier", g.inner.Name(),
		"corrupt_reads", c.reads.Load(), "probes_after", wait)
}

// probeHeld reports whether the corruption back-off holds probes now,
// counting the probe it holds.
func (g *Guarded) probeHeld() bool {
	if g.now().UnixNano() < g.cor.until.Load() {
		g.cor.held.Add(1)
		return true
	}
	return false
}
