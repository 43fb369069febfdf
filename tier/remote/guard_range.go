package remote

import (
	"context"
	"fmt"

	"kvtier/chunk"
	"kvtier/tier"
)

// RangeGetter is implemented by stores that can read part of a stored
// object (Redis GETRANGE). Encoded uses it to read pieced objects a range
// at a time (tier.RangeReader, layerwise loads).
type RangeGetter interface {
	// GetRange reads the stored object's bytes from off into dst and
	// returns how many it read: len(dst), or fewer where the object ends
	// (0 for a missing object).
	GetRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error)
}

// rangeGetterOf returns t as a RangeGetter when it can really read ranges:
// a Guarded store only when the store it wraps can.
func rangeGetterOf(t tier.Tier) RangeGetter {
	if g, ok := t.(*Guarded); ok {
		if _, inner := g.inner.(RangeGetter); !inner {
			return nil
		}
		return g
	}
	rg, _ := t.(RangeGetter)
	return rg
}

// GetRange implements RangeGetter through the breaker, like Get. The inner
// tier must be a RangeGetter (rangeGetterOf checks).
func (g *Guarded) GetRange(ctx context.Context, key chunk.Key, off int, dst []byte) (int, error) {
	c, err := g.begin(opGetRange)
	if err != nil {
		return 0, err
	}
	c.key, c.off = key, off
	c.buf = grow(c.buf, len(dst))
	if err := g.run(ctx, c, g.deadline(len(dst))); err != nil {
		return 0, err
	}
	n, err := c.n, c.err
	if err == nil {
		if n < 0 || n > len(c.buf) {
			err = fmt.Errorf("remote %s: get range %v: inner tier returned length %d for a %d-byte buffer", g.inner.Name(), key, n, len(c.buf))
			n = 0
		} else {
			n = copy(dst, c.buf[:n])
		}
	}
	g.verdict(err)
	g.finish(c, classify(ctx, err))
	return n, err
}

// execGetRange runs a GetRange call on the inner tier.
func (g *Guarded) execGetRange(c *call) {
	rg, ok := g.inner.(RangeGetter)
	if !ok {
		c.err = fmt.Errorf("remote %s: no range reads", g.inner.Name())
		return
	}
	c.n, c.err = rg.GetRange(c.ctx, c.key, c.off, c.buf)
}

// Admits reports whether the breaker lets a call through now, as a call
// through it would be let through: never when it is open or too many calls
// hang, and when it is half-open only as its one trial call (trial is
// then true). It is for a caller that then talks to the store outside the
// breaker (a P2P range read on a connection it holds for one chunk) and
// reports each outcome with Report, the first with the trial it was given.
func (g *Guarded) Admits() (ok, trial bool) {
	c, err := g.begin(opGetRange)
	if err != nil {
		return false, false
	}
	trial = c.trial
	g.recycle(c)
	return true, trial
}

// Report records the outcome of a call made on the store outside the
// breaker as a call through it would be: failures count towards opening
// the circuit, an answer closes a half-open one. trial gives back the
// half-open trial Admits handed out, once its outcome is known. Bytes
// that failed verification (ErrCorrupt) count as corrupt; bytes that
// passed are for the caller to report (ReportVerified), since a nil error
// here may be any call's.
func (g *Guarded) Report(ctx context.Context, err error, trial bool) {
	if trial { // as finish does, before the outcome moves the state
		g.trial.Store(false)
	}
	if isDamage(err) {
		g.ReportCorrupt() // a verified read the caller reports itself
	}
	switch classify(ctx, err) {
	case outcomeSuccess:
		g.recordSuccess()
	case outcomeFailure:
		g.recordFailure()
	}
}
