package remote

import (
	"context"
	"errors"
	"fmt"

	"kvtier/chunk"
	"kvtier/tier"
)

// Staged writes: a store that can build an object a range at a time in a
// place readers never look, then publish it under its key in one atomic
// step (Redis: SETRANGE into a staging key, then RENAME). Per-layer saves
// (docs/layerwise.md) send each checksum piece of a pieced object as soon
// as its bytes are final and publish the object, header last, at the
// commit, so that no reader ever sees part of an object.

// Stager is implemented by stores that can stage objects.
type Stager interface {
	// Stage makes an invisible staged object of size bytes for key. The
	// store drops it on its own if it is neither written nor published
	// for a while (a writer that died leaks nothing for long).
	Stage(ctx context.Context, key chunk.Key, size int) (Staged, error)
}

// StageChooser is implemented by a Stager that can be told not to stage
// (Redis' layer_saves=false): per-layer saves then leave it whole chunks.
type StageChooser interface {
	Stages() bool
}

// Staged is one staged object. It is used by one goroutine at a time.
type Staged interface {
	// WriteAt writes data at off in the staged object.
	WriteAt(ctx context.Context, off int, data []byte) error
	// Publish writes head at offset 0 and makes the object visible under
	// its key in one step. When the key holds an object already (objects
	// are content-addressed: the same bytes), the staged one is dropped
	// and Publish returns nil. A staged object the store lost meanwhile
	// (expired, evicted, the store restarted) is not published:
	// ErrStageLost.
	Publish(ctx context.Context, head []byte) error
	// Discard drops the staged object. It is best effort: an object it
	// fails to drop expires on its own.
	Discard(ctx context.Context) error
}

// FoundStoredReporter is implemented by a Staged that can tell, after a
// Publish that returned nil, whether the key held an object already (so
// the staged one was dropped and nothing of it was published).
type FoundStoredReporter interface {
	FoundStored() bool
}

// ErrStageLost is why a staged object could not be published: the store
// no longer holds all of it.
var ErrStageLost = errors.New("remote: staged object lost before its publish")

// ErrRefused is wrapped by the error of a staging call that the store
// answered with a refusal (Redis: an error reply such as an unknown or
// renamed command, NOPERM or CROSSSLOT), or that the tier refused itself
// without asking the store. The store is up: the breaker counts it as an
// answer, and the chunk is written whole.
var ErrRefused = errors.New("remote: staging refused")

// ErrNotStaging wraps ErrRefused for a staging call the tier refused
// itself, without asking the store (Redis: staging is off after a refusal
// until its retry is due). It says nothing of the store's health: the
// breaker counts it as neither an answer nor a failure.
var ErrNotStaging = fmt.Errorf("%w: the tier does not stage now", ErrRefused)

// StagingReporter is implemented by a Stager that can say, for metrics,
// whether it stages now and how often the store's refusals turned it off.
type StagingReporter interface {
	Staging() StagingStatus
}

// StagingStatus is a StagingReporter's state.
type StagingStatus struct {
	On       bool   // chunks stage now (not refused, not configured off)
	Offs     uint64 // times a refusal turned staging off
	Refusals uint64 // refusal replies to staging calls
}

// stageOutcome is how the breaker counts a staging call's result: a lost
// staged object and a refusal are answers, not failures of the store; a
// refusal the tier made itself is neither.
func stageOutcome(ctx context.Context, err error) outcome {
	if errors.Is(err, ErrNotStaging) {
		return outcomeNeutral
	}
	if errors.Is(err, ErrStageLost) || errors.Is(err, ErrRefused) {
		return outcomeSuccess // the store answered
	}
	return classify(ctx, err)
}

// stagerOf returns t as a Stager when it can really stage: a Guarded
// store only when the store it wraps can.
func stagerOf(t tier.Tier) Stager {
	if g, ok := t.(*Guarded); ok {
		if _, inner := g.inner.(Stager); !inner {
			return nil
		}
		return g
	}
	s, _ := t.(Stager)
	return s
}

// Stage implements Stager through the breaker. Its deadline grows with
// size, as a Put's does: a store may allocate the whole object at once
// (Redis zero-fills the staging key). Writes to the object it returns go
// through the breaker too, each with a private copy of its bytes (as
// Put), since a call abandoned at its deadline may still read them.
func (g *Guarded) Stage(ctx context.Context, key chunk.Key, size int) (Staged, error) {
	c, err := g.begin(opStage)
	if err != nil {
		return nil, err
	}
	c.key, c.n = key, size
	if err := g.run(ctx, c, g.deadline(size)); err != nil {
		return nil, err
	}
	s, err := c.stage, c.err
	c.stage = nil
	g.finish(c, stageOutcome(ctx, err))
	if err != nil {
		return nil, err
	}
	return &guardedStage{g: g, inner: s}, nil
}

// Open reports whether the breaker refuses calls now.
func (g *Guarded) Open() bool { return State(g.state.Load()) == StateOpen }

// guardedStage is a staged object whose calls go through the breaker.
type guardedStage struct {
	g     *Guarded
	inner Staged
}

func (s *guardedStage) WriteAt(ctx context.Context, off int, data []byte) error {
	return s.call(ctx, opStageWrite, off, data)
}

func (s *guardedStage) Publish(ctx context.Context, head []byte) error {
	return s.call(ctx, opStagePublish, 0, head)
}

func (s *guardedStage) Discard(ctx context.Context) error {
	return s.call(ctx, opStageDiscard, 0, nil)
}

// FoundStored implements FoundStoredReporter when the store's staged
// object does (false otherwise). It is read after Publish returned nil,
// so the worker that ran the publish is done with the object.
func (s *guardedStage) FoundStored() bool {
	r, ok := s.inner.(FoundStoredReporter)
	return ok && r.FoundStored()
}

// call runs one operation on the staged object through the breaker.
func (s *guardedStage) call(ctx context.Context, o op, off int, data []byte) error {
	g := s.g
	c, err := g.begin(o)
	if err != nil {
		return err
	}
	c.stage, c.off = s.inner, off
	c.buf = append(c.buf[:0], data...)
	if err := g.run(ctx, c, g.deadline(len(data))); err != nil {
		return err
	}
	err = c.err
	c.stage = nil
	g.finish(c, stageOutcome(ctx, err))
	return err
}

// execStage runs a staging call on a worker.
func (g *Guarded) execStage(c *call) {
	switch c.op {
	case opStage:
		st, ok := g.inner.(Stager)
		if !ok {
			c.err = fmt.Errorf("remote %s: no staged writes", g.inner.Name())
			return
		}
		c.stage, c.err = st.Stage(c.ctx, c.key, c.n)
	case opStageWrite:
		c.err = c.stage.WriteAt(c.ctx, c.off, c.buf)
	case opStagePublish:
		c.err = c.stage.Publish(c.ctx, c.buf)
	case opStageDiscard:
		c.err = c.stage.Discard(c.ctx)
	}
}
