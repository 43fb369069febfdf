package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/tier"
)

// ErrUnavailable is wrapped by the errors of a guarded tier whose store is
// cut off (circuit open), did not answer within the deadline, or has too
// many calls hung past their deadline.
var ErrUnavailable = errors.New("remote: store unavailable")

// Pinger is implemented by tiers that can check their store cheaply. Guard
// uses it as the health probe.
type Pinger interface {
	Ping(ctx context.Context) error
}

// PresenceReporter is implemented by tiers that can tell a presence check
// that failed from one that found nothing. Size and PrefixContains can
// only answer "not stored", so without it a store that refuses
// connections looks empty to Guard, which then never cuts it off.
type PresenceReporter interface {
	// PrefixContainsErr is PrefixContains with the error, if any, that
	// cut the answer short.
	PrefixContainsErr(keys []chunk.Key) (int, error)
	// SizeErr is Size with the error, if any, that kept it from
	// answering.
	SizeErr(key chunk.Key) (int, bool, error)
}

// State is a circuit breaker's state.
type State int32

const (
	// StateClosed lets every call through: the store is healthy.
	StateClosed State = iota
	// StateOpen fails every call fast without touching the store.
	StateOpen
	// StateHalfOpen lets one trial call through at a time; its outcome, or
	// the next probe's, closes or reopens the circuit.
	StateHalfOpen
)

func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// GuardOptions tune Guard. Zero values take the defaults noted.
type GuardOptions struct {
	// Timeout is the deadline of a call to the inner tier that moves no
	// bytes (default DefaultTimeout). Get and Put get more: CallDeadline
	// of their object's size at Bandwidth.
	Timeout time.Duration
	// Bandwidth is the slowest rate, in bytes per second, at which a
	// healthy store moves an object (default DefaultBandwidth).
	Bandwidth int64
	// Threshold is the number of consecutive failures or timeouts that
	// opens the circuit (default 5).
	Threshold int
	// ProbeInterval is how often the health probe runs while the circuit
	// is not closed (default 250ms). Two successful probes in a row close
	// it, so a store that comes back serves again within about twice
	// this.
	ProbeInterval time.Duration
	// MaxAbandoned bounds the inner calls still running after their
	// caller gave up at the deadline; beyond it calls fail fast, so a hung
	// store cannot pile up goroutines (default 32).
	MaxAbandoned int
	// ReadsVerified says the inner tier checks what it reads (a P2P
	// peer's checksums): a Get that returns no error returned verified
	// bytes. Otherwise only ReportVerified says so (Encoded does).
	ReadsVerified bool
	// CorruptBackoff is how long a circuit opened because reads failed
	// verification goes unprobed (default DefaultCorruptBackoff); it
	// doubles each time it opens so again, up to CorruptBackoffMax
	// (default DefaultCorruptBackoffMax). See corrupt.go.
	CorruptBackoff, CorruptBackoffMax time.Duration
	Logger                            *slog.Logger // default slog.Default()
}

func (o GuardOptions) withDefaults() GuardOptions {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Bandwidth <= 0 {
		o.Bandwidth = DefaultBandwidth
	}
	if o.Threshold <= 0 {
		o.Threshold = 5
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.MaxAbandoned <= 0 {
		o.MaxAbandoned = 32
	}
	if o.CorruptBackoff <= 0 {
		o.CorruptBackoff = DefaultCorruptBackoff
	}
	if o.CorruptBackoffMax <= 0 {
		o.CorruptBackoffMax = max(o.CorruptBackoff, DefaultCorruptBackoffMax)
	} else if o.CorruptBackoffMax < o.CorruptBackoff {
		o.CorruptBackoffMax = o.CorruptBackoff // no doubling: the cap is the back-off
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// DefaultProbeInterval is GuardOptions.ProbeInterval's default: short, so
// that a store that comes back rejoins within a second, and cheap, since
// probes run only while the circuit is not closed.
const DefaultProbeInterval = 250 * time.Millisecond

// Health is a snapshot of a breaker's state and counters, for metrics.
type Health struct {
	State               State
	ConsecutiveFailures int
	Opens               uint64 // transitions into StateOpen
	FastFails           uint64 // calls refused without touching the store
	Failures            uint64 // inner calls that failed (timeouts included)
	Timeouts            uint64 // inner calls that missed the deadline
	Abandoned           int    // inner calls still running past their deadline
	ProbeOK, ProbeFail  uint64
	// Corruption (corrupt.go): reads whose bytes failed verification,
	// openings they caused, and probes held back after those.
	Corrupt, CorruptOpens, ProbesHeld uint64
}

// Guarded is a tier behind a circuit breaker. Every inner call runs on a
// worker goroutine so the caller returns at the deadline even when the
// store hangs; Get and Put hand the inner tier private copies of their buffers,
// because an abandoned call may still write or read them after the caller
// has reused them. ErrNotFound (and ErrTooLarge) are answers, not
// failures; ErrCorrupt, bytes that failed verification, is counted apart
// (corrupt.go). PrefixContains, Size and Remove report no errors,
// so for them only a missed deadline, or an error the tier reports as a
// PresenceReporter, counts as a failure; their answers count as neither
// success nor failure, because a backend may give them from a local
// presence cache without asking the store at all (a hung Redis still
// "has" every key it held). Only a Get, a Put or a probe that the store
// answered proves it healthy.
//
// Besides tier.Tier, Guarded implements tier.PrefixContainer (the inner
// tier's, or one Size per key), tier.Remover (removing nothing when the
// inner tier cannot), tier.StatsReporter and io.Closer. It does not pin:
// the stores it guards evict on their own terms.
type Guarded struct {
	inner    tier.Tier
	ping     Pinger           // nil when inner has no Ping
	presence PresenceReporter // nil when inner cannot report presence errors
	o        GuardOptions

	state       atomic.Int32 // State
	consecutive atomic.Int32
	trial       atomic.Bool // a half-open trial call is in flight
	abandoned   atomic.Int64
	closed      atomic.Bool

	opens, fastFails, failures, timeouts, probeOK, probeFail atomic.Uint64

	cor corruption       // reads that failed verification (corrupt.go)
	now func() time.Time // time.Now; a test's own clock

	errOpen, errHung error // prebuilt so failing fast does not allocate

	calls       sync.Pool     // *call
	work        chan *call    // hands calls to idle workers
	quit        chan struct{} // closed by Close: idle workers exit
	probeCtx    context.Context
	probeCancel context.CancelFunc
	probeDone   chan struct{}
}

var (
	_ tier.Tier            = (*Guarded)(nil)
	_ tier.PrefixContainer = (*Guarded)(nil)
	_ tier.Remover         = (*Guarded)(nil)
	_ tier.StatsReporter   = (*Guarded)(nil)
	_ io.Closer            = (*Guarded)(nil)
)

// Guard wraps t in a circuit breaker and starts its health probe. Close
// stops the probe and closes t.
func Guard(t tier.Tier, o GuardOptions) *Guarded {
	o = o.withDefaults()
	g := &Guarded{
		inner: t, o: o, probeDone: make(chan struct{}), now: time.Now,
		work: make(chan *call), quit: make(chan struct{}),
	}
	g.ping, _ = t.(Pinger)
	g.presence, _ = t.(PresenceReporter)
	g.errOpen = fmt.Errorf("%w: %s: circuit open", ErrUnavailable, t.Name())
	g.errHung = fmt.Errorf("%w: %s: %d calls hung past the deadline", ErrUnavailable, t.Name(), o.MaxAbandoned)
	g.calls.New = func() any {
		tm := time.NewTimer(time.Hour)
		tm.Stop()
		return &call{done: make(chan struct{}, 1), timer: tm}
	}
	g.probeCtx, g.probeCancel = context.WithCancel(context.Background())
	go g.probeLoop()
	return g
}

// Inner returns the wrapped tier.
func (g *Guarded) Inner() tier.Tier { return g.inner }

// Health returns the breaker's state and counters.
func (g *Guarded) Health() Health {
	return Health{
		State:               State(g.state.Load()),
		ConsecutiveFailures: int(g.consecutive.Load()),
		Opens:               g.opens.Load(),
		FastFails:           g.fastFails.Load(),
		Failures:            g.failures.Load(),
		Timeouts:            g.timeouts.Load(),
		Abandoned:           int(g.abandoned.Load()),
		ProbeOK:             g.probeOK.Load(),
		ProbeFail:           g.probeFail.Load(),
		Corrupt:             g.cor.reads.Load(),
		CorruptOpens:        g.cor.opens.Load(),
		ProbesHeld:          g.cor.held.Load(),
	}
}

// Name implements tier.Tier.
func (g *Guarded) Name() string { return g.inner.Name() }

// Stats implements tier.StatsReporter by passing the inner tier's stats
// through.
func (g *Guarded) Stats() tier.Stats { return tier.StatsOf(g.inner) }

// PrefixContains implements tier.PrefixContainer; it is 0 while the store
// is cut off.
func (g *Guarded) PrefixContains(keys []chunk.Key) int {
	if len(keys) == 0 {
		return 0
	}
	c, err := g.begin(opPrefix)
	if err != nil {
		return 0
	}
	c.keys = append(c.keys[:0], keys...)
	if err := g.run(nil, c, g.o.Timeout); err != nil {
		g.o.Logger.Debug("remote tier lookup failed: served as a miss", "tier", g.inner.Name(), "err", err)
		return 0
	}
	n := c.n
	if presenceOutcome(c.err) == outcomeFailure {
		g.o.Logger.Debug("remote tier lookup failed: served as a miss", "tier", g.inner.Name(), "err", c.err)
	}
	g.finish(c, presenceOutcome(c.err))
	return n
}

// Size implements tier.Tier; it reports not-found while the store is cut
// off.
func (g *Guarded) Size(key chunk.Key) (int, bool) {
	c, err := g.begin(opSize)
	if err != nil {
		return 0, false
	}
	c.key = key
	if err := g.run(nil, c, g.o.Timeout); err != nil {
		g.o.Logger.Debug("remote tier size query failed: served as a miss", "tier", g.inner.Name(), "err", err)
		return 0, false
	}
	n, ok := c.n, c.ok
	if presenceOutcome(c.err) == outcomeFailure {
		g.o.Logger.Debug("remote tier size query failed: served as a miss", "tier", g.inner.Name(), "err", c.err)
	}
	g.finish(c, presenceOutcome(c.err))
	return n, ok
}

// Get implements tier.Tier.
func (g *Guarded) Get(ctx context.Context, key chunk.Key, dst []byte) (int, error) {
	c, err := g.begin(opGet)
	if err != nil {
		return 0, err
	}
	c.key = key
	c.buf = grow(c.buf, len(dst))
	if err := g.run(ctx, c, g.deadline(len(dst))); err != nil {
		return 0, err
	}
	n, err := c.n, c.err
	if err == nil {
		if n < 0 || n > len(c.buf) {
			err = fmt.Errorf("remote %s: get %v: inner tier returned length %d for a %d-byte buffer", g.inner.Name(), key, n, len(c.buf))
			n = 0
		} else {
			n = copy(dst, c.buf[:n])
		}
	}
	g.verdict(err)
	g.finish(c, classify(ctx, err))
	return n, err
}

// verdict tells the corruption count what an inner read's error says of
// the bytes: ErrCorrupt that they failed verification, no error that
// they passed, when the inner tier checks its reads. A foreign value
// (ErrCorrupt wrapping codec.ErrForeign: a Redis list under an object's
// key) is someone else's, not damage, and says nothing of the store.
func (g *Guarded) verdict(err error) {
	switch {
	case isDamage(err):
		g.ReportCorrupt()
	case err == nil && g.o.ReadsVerified:
		g.ReportVerified()
	}
}

// isDamage reports whether err says bytes failed verification, as
// opposed to a foreign value.
func isDamage(err error) bool {
	return errors.Is(err, tier.ErrCorrupt) && !errors.Is(err, codec.ErrForeign)
}

// Put implements tier.Tier.
func (g *Guarded) Put(ctx context.Context, key chunk.Key, data []byte) error {
	c, err := g.begin(opPut)
	if err != nil {
		return err
	}
	c.key = key
	c.buf = append(c.buf[:0], data...)
	if err := g.run(ctx, c, g.deadline(len(data))); err != nil {
		return err
	}
	err = c.err
	g.finish(c, classify(ctx, err))
	return err
}

// Remove implements tier.Remover; it is false while the store is cut off,
// and without a call when the inner tier cannot remove.
func (g *Guarded) Remove(key chunk.Key) bool {
	if _, ok := g.inner.(tier.Remover); !ok {
		return false
	}
	c, err := g.begin(opRemove)
	if err != nil {
		return false
	}
	c.key = key
	if g.run(nil, c, g.o.Timeout) != nil {
		return false
	}
	ok := c.ok
	g.finish(c, outcomeNeutral)
	return ok
}

// Close stops the health probe and closes the inner tier. Calls after Close
// fail with tier.ErrClosed.
func (g *Guarded) Close() error {
	if !g.closed.CompareAndSwap(false, true) {
		return nil
	}
	g.probeCancel()
	<-g.probeDone
	close(g.quit)
	return tier.Close(g.inner)
}

type op uint8

const (
	opPrefix op = iota
	opSize
	opGet
	opPut
	opRemove
	opPing
	opGetRange // guard_range.go
	opStage    // stage.go
	opStageWrite
	opStagePublish
	opStageDiscard
	opRemoveDamaged // damage.go
)

var opNames = [...]string{"prefix-contains", "size", "get", "put", "remove", "ping", "get-range",
	"stage", "stage-write", "stage-publish", "stage-discard", "remove-damaged"}

func (o op) String() string { return opNames[o] }

// Call ownership: the caller owns a call until run starts the inner
// goroutine; then whoever wins the status race owns it. If the inner call
// finishes first, the caller reads the results and returns the call to the
// pool; if the deadline wins, the goroutine keeps it and pools it when the
// inner call finally returns.
const (
	running int32 = iota
	finished
	abandoned
)

// call is one inner operation with its arguments, private buffers and
// results. Calls are pooled, so the hot path allocates nothing for
// Size.
type call struct {
	op     op
	trial  bool // holds the half-open trial slot
	ctx    context.Context
	cancel context.CancelFunc
	key    chunk.Key
	keys   []chunk.Key
	buf    []byte
	off    int    // GetRange, a staged write: where in the object buf starts
	stage  Staged // a staged object's calls (stage.go)
	dmg    Damage // RemoveDamaged's condition, over buf (damage.go)

	n   int // a count, a size, or RemoveDamaged's Removal
	ok  bool
	err error

	status atomic.Int32
	done   chan struct{} // capacity 1, empty whenever the call is pooled
	timer  *time.Timer   // deadline of calls without a context
}

type outcome uint8

const (
	outcomeNeutral outcome = iota // says nothing about the store's health
	outcomeSuccess
	outcomeFailure
)

// presenceOutcome judges the error a PresenceReporter gave: only a store
// that failed to answer says something about its health.
func presenceOutcome(err error) outcome {
	if err == nil || errors.Is(err, tier.ErrNotFound) || errors.Is(err, tier.ErrClosed) {
		return outcomeNeutral
	}
	return outcomeFailure
}

// classify judges a Get or Put error: answers from the store are
// successes, the caller's own cancellation says nothing. Bytes that fail
// verification are an answer, but not one that proves the store healthy:
// they count apart (verdict, corrupt.go).
func classify(ctx context.Context, err error) outcome {
	switch {
	case err == nil,
		errors.Is(err, tier.ErrNotFound),
		errors.Is(err, tier.ErrTooLarge):
		return outcomeSuccess
	case errors.Is(err, tier.ErrCorrupt), ctx.Err() != nil:
		return outcomeNeutral
	}
	return outcomeFailure
}

// begin admits a call or says why not, without touching the inner tier.
func (g *Guarded) begin(o op) (*call, error) {
	if g.closed.Load() {
		return nil, tier.ErrClosed
	}
	trial := false
	switch State(g.state.Load()) {
	case StateOpen:
		g.fastFails.Add(1)
		return nil, g.errOpen
	case StateHalfOpen:
		if !g.trial.CompareAndSwap(false, true) {
			g.fastFails.Add(1)
			return nil, g.errOpen
		}
		trial = true
	}
	if g.abandoned.Load() >= int64(g.o.MaxAbandoned) {
		if trial {
			g.trial.Store(false)
		}
		g.fastFails.Add(1)
		return nil, g.errHung
	}
	c := g.calls.Get().(*call)
	c.op, c.trial = o, trial
	return c, nil
}

// deadline is how long a Get or Put of n bytes may take.
func (g *Guarded) deadline(n int) time.Duration {
	return CallDeadline(g.o.Timeout, g.o.Bandwidth, n)
}

// run executes c on its own goroutine and waits for it, the timeout, or
// parent's cancellation (parent is nil for operations without a context).
// On a nil return the caller owns c and must pass it to finish; otherwise c
// is abandoned to its goroutine.
func (g *Guarded) run(parent context.Context, c *call, timeout time.Duration) error {
	var ctxDone <-chan struct{}
	var timerC <-chan time.Time
	if parent != nil {
		c.ctx, c.cancel = context.WithTimeout(parent, timeout)
		ctxDone = c.ctx.Done()
	} else {
		c.timer.Reset(timeout)
		timerC = c.timer.C
	}
	o, trial := c.op, c.trial // c belongs to the goroutine once abandoned
	c.status.Store(running)
	g.dispatch(c)
	select {
	case <-c.done:
		return nil
	case <-ctxDone:
	case <-timerC:
	}
	if !c.status.CompareAndSwap(running, abandoned) {
		<-c.done // finished just now: the results are valid
		return nil
	}
	g.abandoned.Add(1)
	if trial {
		g.trial.Store(false)
	}
	if parent != nil && parent.Err() != nil {
		return fmt.Errorf("remote %s: %s: %w", g.inner.Name(), o, parent.Err())
	}
	g.timeouts.Add(1)
	g.recordFailure()
	return fmt.Errorf("%w: %s %s: no answer within %v: %w",
		ErrUnavailable, g.inner.Name(), o, timeout, context.DeadlineExceeded)
}

// workerIdle is how long a worker waits for the next call before exiting.
const workerIdle = 10 * time.Second

// dispatch runs c on an idle worker, or on a new one if none is idle.
// Reusing workers spares the hot path a goroutine start and the closure
// allocation a go statement with arguments costs.
func (g *Guarded) dispatch(c *call) {
	select {
	case g.work <- c:
	default:
		go g.worker(c)
	}
}

// worker runs calls until it has been idle for workerIdle or the tier is
// closed. A worker stuck in a hung inner call is what MaxAbandoned counts.
func (g *Guarded) worker(c *call) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		g.exec(c)
		idle.Reset(workerIdle)
		select {
		case c = <-g.work:
		case <-idle.C:
			return
		case <-g.quit:
			return
		}
	}
}

// exec runs on a worker.
func (g *Guarded) exec(c *call) {
	switch {
	case g.presence != nil && c.op == opSize:
		c.n, c.ok, c.err = g.presence.SizeErr(c.key)
	case g.presence != nil && c.op == opPrefix:
		c.n, c.err = g.presence.PrefixContainsErr(c.keys)
	default:
		g.execPlain(c)
	}
	if c.status.CompareAndSwap(running, finished) {
		c.done <- struct{}{}
		return
	}
	g.abandoned.Add(-1)
	g.recycle(c)
}

// execPlain runs c's operation through the inner tier's methods.
func (g *Guarded) execPlain(c *call) {
	switch c.op {
	case opPrefix:
		c.n = tier.PrefixContains(g.inner, c.keys)
	case opSize:
		c.n, c.ok = g.inner.Size(c.key)
	case opGet:
		c.n, c.err = g.inner.Get(c.ctx, c.key, c.buf)
	case opPut:
		c.err = g.inner.Put(c.ctx, c.key, c.buf)
	case opRemove:
		c.ok = tier.Remove(g.inner, c.key)
	case opRemoveDamaged:
		c.n = int(removeDamaged(g.inner, c.key, c.dmg))
	case opPing:
		c.err = g.ping.Ping(c.ctx)
	case opGetRange:
		g.execGetRange(c)
	case opStage, opStageWrite, opStagePublish, opStageDiscard:
		g.execStage(c)
	}
}

// finish records a completed call's outcome and pools it.
func (g *Guarded) finish(c *call, o outcome) {
	if c.trial {
		g.trial.Store(false)
	}
	switch o {
	case outcomeSuccess:
		g.recordSuccess()
	case outcomeFailure:
		g.recordFailure()
	}
	g.recycle(c)
}

func (g *Guarded) recycle(c *call) {
	c.timer.Stop()
	if c.cancel != nil {
		c.cancel()
	}
	c.ctx, c.cancel, c.err, c.stage, c.dmg = nil, nil, nil, nil, Damage{}
	c.n, c.ok, c.trial = 0, false, false
	g.calls.Put(c)
}

func (g *Guarded) recordSuccess() {
	if g.consecutive.Load() != 0 {
		g.consecutive.Store(0)
	}
	if State(g.state.Load()) == StateHalfOpen {
		g.transition(StateHalfOpen, StateClosed, "store answered a trial call")
	}
}

func (g *Guarded) recordFailure() {
	g.failures.Add(1)
	n := g.consecutive.Add(1)
	switch State(g.state.Load()) {
	case StateHalfOpen:
		g.transition(StateHalfOpen, StateOpen, "trial call failed")
	case StateClosed:
		if int(n) >= g.o.Threshold {
			g.transition(StateClosed, StateOpen, "consecutive failures")
		}
	}
}

// transition moves from one state to another unless another goroutine got
// there first, and logs the moves that operators care about.
func (g *Guarded) transition(from, to State, why string) {
	if !g.state.CompareAndSwap(int32(from), int32(to)) {
		return
	}
	switch to {
	case StateOpen:
		g.opens.Add(1)
		g.o.Logger.Warn("remote tier cut off", "tier", g.inner.Name(), "reason", why,
			"consecutive_failures", g.consecutive.Load())
	case StateClosed:
		g.consecutive.Store(0)
		g.o.Logger.Info("remote tier back", "tier", g.inner.Name(), "reason", why)
	}
}

// probeLoop checks the store every ProbeInterval while the circuit is not
// closed.
func (g *Guarded) probeLoop() {
	defer close(g.probeDone)
	tick := time.NewTicker(g.o.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-g.probeCtx.Done():
			return
		case <-tick.C:
		}
		if State(g.state.Load()) != StateClosed {
			g.probe()
		}
	}
}

// probe asks the store whether it is back: Ping if the tier has one, else a
// Size of a random key, which only has to answer within the deadline.
// A success half-opens an open circuit and closes a half-open one. After
// reads failed verification it waits out the back-off first (corrupt.go).
func (g *Guarded) probe() {
	if g.probeHeld() {
		return
	}
	if g.abandoned.Load() >= int64(g.o.MaxAbandoned) {
		g.probeFail.Add(1)
		return
	}
	c := g.calls.Get().(*call)
	var parent context.Context
	if g.ping != nil {
		c.op, parent = opPing, g.probeCtx
	} else {
		c.op = opSize
		c.key = chunk.Key{Scope: rand.Uint64()}
		binary.LittleEndian.PutUint64(c.key.Hash[:8], rand.Uint64())
		binary.LittleEndian.PutUint64(c.key.Hash[8:], rand.Uint64())
	}
	if err := g.run(parent, c, g.o.Timeout); err != nil {
		g.probeFail.Add(1)
		return
	}
	err := c.err
	g.recycle(c)
	if err != nil {
		g.probeFail.Add(1)
		g.transition(StateHalfOpen, StateOpen, "probe failed")
		return
	}
	g.probeOK.Add(1)
	if !g.state.CompareAndSwap(int32(StateOpen), int32(StateHalfOpen)) {
		g.transition(StateHalfOpen, StateClosed, "probe succeeded twice")
	} else {
		g.o.Logger.Info("remote tier answers probe", "tier", g.inner.Name())
	}
}

// grow returns b resized to n bytes, reusing its array when it is big
// enough.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
