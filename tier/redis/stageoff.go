package redis

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Staging refused by Redis. A reply that says Redis will not take the
// staging commands from this client (a renamed EVAL, NOPERM, CROSSSLOT)
// turns staging off for the tier, so that saves write whole chunks
// without asking again; but an operator can mend each of these (fix the
// ACL, restore the command), so staging is tried again after a back-off:
// once StageRetry has passed, the next chunk a save opens stages as a
// trial while the others go on being written whole. A trial whose publish
// succeeds turns staging back on; one that is refused again doubles the
// back-off, up to StageRetryMax. Each transition is logged once, never
// each chunk. A cluster prefix with a "}" but no hash tag is not a reply
// but the tier's own configuration, which no retry can mend: that tier
// never stages (noStage, decided at Dial).

// Back-off of staging after a refusal: the first retry, and its cap.
const (
	StageRetry    = time.Minute
	StageRetryMax = 30 * time.Minute
)

const (
	stagingOn    int32 = iota
	stagingOff         // refused; a trial is due at retryAt
	stagingTrial       // one chunk is trying; another may at retryAt
)

// stageSwitch is whether the tier stages now. Stages and claim read two
// atomics on the way to each chunk; transitions take the mutex.
type stageSwitch struct {
	state   atomic.Int32
	retryAt atomic.Int64 // unix ns; meaningful while not on
	offs    atomic.Uint64
	refused atomic.Uint64

	mu      sync.Mutex
	backoff time.Duration // the wait that began at the last refusal
	now     func() time.Time
	log     *slog.Logger
	retry   time.Duration // StageRetry, StageRetryMax unless a test changes them
	max     time.Duration
}

func newStageSwitch(log *slog.Logger) *stageSwitch {
	return &stageSwitch{now: time.Now, log: log, retry: StageRetry, max: StageRetryMax}
}

// open reports whether a chunk may ask to stage now: staging is on, or
// the back-off has passed and a trial is due.
func (s *stageSwitch) open() bool {
	return s.state.Load() == stagingOn || s.now().UnixNano() >= s.retryAt.Load()
}

// claim reports whether the chunk about to stage may: always while
// staging is on; while it is off, only the first chunk once the back-off
// has passed, which becomes the trial. The next trial is due a back-off
// later, in case this one never reaches its publish.
func (s *stageSwitch) claim() bool {
	if s.state.Load() == stagingOn {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.state.Load() == stagingOn {
		return true
	}
	if now.UnixNano() < s.retryAt.Load() {
		return false
	}
	s.state.Store(stagingTrial)
	s.retryAt.Store(now.Add(s.backoff).UnixNano())
	s.log.Info("redis tier: trying staging again after its refusal", "after", s.backoff)
	return true
}

// refusedBy notes a reply refusing a staging command: staging goes off
// (from on, for StageRetry; from a trial, for twice the last back-off, at
// most StageRetryMax). A refusal while off, of a chunk that began staging
// before, changes nothing.
func (s *stageSwitch) refusedBy(op, reply string) {
	s.refused.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state.Load() {
	case stagingOn:
		s.backoff = s.retry
		s.offs.Add(1)
		s.log.Warn("redis tier: staging refused, per-layer saves write whole chunks until a retry succeeds",
			"op", op, "reply", reply, "retry_in", s.backoff)
	case stagingTrial:
		s.backoff = min(2*s.backoff, s.max)
		s.log.Info("redis tier: staging still refused", "op", op, "reply", reply, "retry_in", s.backoff)
	default:
		return
	}
	s.retryAt.Store(s.now().Add(s.backoff).UnixNano())
	s.state.Store(stagingOff)
}

// accepted notes a publish Redis took: staging is on again, and its next
// refusal starts over at StageRetry.
func (s *stageSwitch) accepted() {
	if s.state.Load() == stagingOn {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state.Load() == stagingOn {
		return
	}
	s.state.Store(stagingOn)
	s.backoff = 0
	s.log.Info("redis tier: staging accepted again, per-layer saves stage into Redis")
}
