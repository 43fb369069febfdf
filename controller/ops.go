package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"kvtier/cluster"
)

// Bounds of the operation tracker: the operations it remembers, and
// those it runs at once (each fans out to every daemon it names).
const (
	maxOpHistory  = 256
	maxRunningOps = 32
)

// errOpsBusy refuses an operation while maxRunningOps run.
var errOpsBusy = fmt.Errorf("%d operations are running: try again when one has finished", maxRunningOps)

// errRegistryDown: the registered daemons could not be listed (the shared
// registry's Redis is unreachable).
var errRegistryDown = errors.New("cannot list the registered daemons")

// opTracker runs cluster operations (docs/cluster.md, "Cluster
// operations"): each is fanned out to the daemons it names through their
// admin APIs, asynchronously and under a deadline, with one result per
// daemon. It remembers the last maxOpHistory operations, in memory only:
// a controller restart forgets them, not what the daemons did.
type opTracker struct {
	members func() ([]cluster.Instance, error) // the registered daemons
	hc      *http.Client
	log     *slog.Logger

	mu      sync.Mutex
	ops     map[string]*cluster.Op
	order   []string // ids, oldest first
	running int
	idle    *sync.Cond // signalled when running drops, for tests
}

func newOpTracker(members func() ([]cluster.Instance, error), log *slog.Logger) *opTracker {
	t := &opTracker{members: members, log: log, ops: make(map[string]*cluster.Op),
		// No client timeout: each call carries its operation's deadline.
		hc: &http.Client{}}
	t.idle = sync.NewCond(&t.mu)
	return t
}

// start validates r, records the operation and runs it in the background.
// Daemons it names that are not registered get an error entry at once.
func (t *opTracker) start(r cluster.OpRequest) (string, error) {
	if err := r.Validate(); err != nil {
		return "", err
	}
	now := time.Now()
	op := &cluster.Op{ID: newOpID(), Kind: r.Kind, State: cluster.StateRunning, Request: r,
		Created: stamp(now), Deadline: stamp(now.Add(r.Timeout()))}
	members, err := t.members()
	if err != nil {
		return "", fmt.Errorf("%w: %w", errRegistryDown, err)
	}
	plan := t.plan(op, members)
	if len(op.Results) == 0 {
		return "", errors.New("all: no daemon is registered")
	}
	t.mu.Lock()
	if t.running >= maxRunningOps {
		t.mu.Unlock()
		return "", errOpsBusy
	}
	t.running++
	t.remember(op)
	t.mu.Unlock()
	t.log.Info("cluster operation started", "id", op.ID, "kind", r.Kind, "daemons", len(op.Results))
	go t.run(op, plan, now.Add(r.Timeout()))
	return op.ID, nil
}

// step is one daemon's part of an operation: where to send what.
type step struct {
	admin, path string
	body        any
}

// plan fills op.Results, one per daemon, and returns each one's request
// (nil for a daemon that is not registered, which is an error already).
func (t *opTracker) plan(op *cluster.Op, members []cluster.Instance) []*step {
	r := &op.Request
	byName := map[string]cluster.Instance{}
	var names []string
	for _, in := range members {
		byName[in.Instance] = in
		if r.All {
			names = append(names, in.Instance)
		}
	}
	if !r.All {
		names = r.Instances
	}
	if r.Between() {
		return t.planBetween(op, byName)
	}
	steps := make([]*step, len(names))
	for i, name := range names {
		op.Results = append(op.Results, cluster.DaemonResult{Instance: name, State: cluster.StatePending})
		in, ok := byName[name]
		if !ok {
			notRegistered(&op.Results[i])
			continue
		}
		steps[i] = &step{admin: in.Admin}
		switch r.Kind {
		case cluster.OpClear:
			steps[i].path, steps[i].body = cluster.DaemonClearPath, cluster.DaemonClear{Tier: r.Tier, Scope: r.Scope, Model: r.Model}
		case cluster.OpPin:
			steps[i].path, steps[i].body = cluster.DaemonPinPath, cluster.DaemonPin{Keys: r.Keys, TTLMS: r.TTLMS}
		case cluster.OpUnpin:
			steps[i].path, steps[i].body = cluster.DaemonUnpinPath, cluster.DaemonKeys{Keys: r.Keys}
		default: // copy or move between this daemon's tiers
			steps[i].path, steps[i].body = cluster.DaemonCopyPath, cluster.DaemonCopy{Keys: r.Keys, Tier: r.ToTier, Move: r.Kind == cluster.OpMove}
		}
	}
	return steps
}

// planBetween plans a copy or move to another daemon: the destination
// pulls from the source over the daemons' TCP protocol; a move's source
// then drops what the destination confirmed it holds (its request is
// made once the destination answered).
func (t *opTracker) planBetween(op *cluster.Op, byName map[string]cluster.Instance) []*step {
	r := &op.Request
	src, srcOK := byName[r.Instances[0]]
	dst, dstOK := byName[r.To]
	op.Results = append(op.Results, cluster.DaemonResult{Instance: r.To, Role: "destination", State: cluster.StatePending})
	steps := []*step{nil}
	switch {
	case !dstOK:
		notRegistered(&op.Results[0])
	case !srcOK:
		op.Results[0].State, op.Results[0].Error = cluster.StateError, fmt.Sprintf("source %q is not registered", r.Instances[0])
	default:
		steps[0] = &step{admin: dst.Admin, path: cluster.DaemonPullPath,
			body: cluster.DaemonPull{From: src.Addr, Keys: r.Keys, Tier: r.ToTier}}
	}
	if r.Kind == cluster.OpMove {
		op.Results = append(op.Results, cluster.DaemonResult{Instance: r.Instances[0], Role: "source", State: cluster.StatePending})
		steps = append(steps, nil)
		if !srcOK {
			notRegistered(&op.Results[1])
		} else {
			steps[1] = &step{admin: src.Admin, path: cluster.DaemonDropPath}
		}
	}
	return steps
}

func notRegistered(res *cluster.DaemonResult) {
	res.State, res.Error = cluster.StateError, "not registered with the controller"
}

// run carries op out: every daemon at once, or for a move between
// daemons the destination first and then the source.
func (t *opTracker) run(op *cluster.Op, steps []*step, deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if op.Request.Between() {
		t.runBetween(ctx, op, steps)
	} else {
		var wg sync.WaitGroup
		for i, s := range steps {
			if s == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.call(ctx, op, i, s)
			}()
		}
		wg.Wait()
	}
	t.finish(op)
}

func (t *opTracker) runBetween(ctx context.Context, op *cluster.Op, steps []*step) {
	var reply cluster.DaemonReply
	if steps[0] != nil {
		reply = t.call(ctx, op, 0, steps[0])
	}
	if len(steps) < 2 || steps[1] == nil {
		return
	}
	t.mu.Lock()
	pulled := op.Results[0].State == cluster.StateOK
	if !pulled {
		op.Results[1].State = cluster.StateError
		op.Results[1].Error = "not asked to drop anything: the destination did not confirm the copy"
	}
	t.mu.Unlock()
	if !pulled {
		return
	}
	// Only the chunks the destination confirmed it holds leave the
	// source; the rest stay where they were.
	steps[1].body = cluster.DaemonKeys{Keys: reply.Keys}
	t.call(ctx, op, 1, steps[1])
}

// call runs step s as op's daemon i and records its result.
func (t *opTracker) call(ctx context.Context, op *cluster.Op, i int, s *step) cluster.DaemonReply {
	t.mu.Lock()
	op.Results[i].State, op.Results[i].Started = cluster.StateRunning, stamp(time.Now())
	t.mu.Unlock()
	var reply cluster.DaemonReply
	err := cluster.CallDaemon(ctx, t.hc, s.admin, s.path, s.body, &reply)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("no answer by the operation's deadline: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	res := &op.Results[i]
	res.Finished = stamp(time.Now())
	if err != nil {
		res.State, res.Error = cluster.StateError, err.Error()
		return reply
	}
	res.State, res.Counts, res.Note = cluster.StateOK, reply.Counts, reply.Note
	return reply
}

// finish sets op's overall state once every daemon's part has ended.
func (t *opTracker) finish(op *cluster.Op) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ok := 0
	for i := range op.Results {
		if op.Results[i].State == cluster.StateOK {
			ok++
		}
	}
	switch {
	case ok == len(op.Results) && ok > 0:
		op.State = cluster.StateOK
	case ok == 0:
		op.State = cluster.StateError
	default:
		op.State = cluster.StatePartial
	}
	op.Finished = stamp(time.Now())
	t.running--
	t.idle.Broadcast()
	t.log.Info("cluster operation finished", "id", op.ID, "kind", op.Kind, "state", op.State)
}

// remember adds op to the history, forgetting the oldest finished
// operations beyond maxOpHistory. Called with t.mu held.
func (t *opTracker) remember(op *cluster.Op) {
	t.ops[op.ID] = op
	t.order = append(t.order, op.ID)
	for i := 0; len(t.order) > maxOpHistory && i < len(t.order); {
		if old := t.ops[t.order[i]]; old.Finished != "" {
			delete(t.ops, old.ID)
			t.order = slices.Delete(t.order, i, i+1)
			continue
		}
		i++ // still running: kept, it is at most maxRunningOps
	}
}

// get returns a copy of operation id.
func (t *opTracker) get(id string) (cluster.Op, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	op, ok := t.ops[id]
	if !ok {
		return cluster.Op{}, false
	}
	return copyOp(op), true
}

// list returns copies of the remembered operations, newest first,
// without their keys (GET /v1/cluster/ops/{id} has them).
func (t *opTracker) list() []cluster.Op {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]cluster.Op, 0, len(t.order))
	for i := len(t.order) - 1; i >= 0; i-- {
		op := copyOp(t.ops[t.order[i]])
		op.Request.Keys = nil
		out = append(out, op)
	}
	return out
}

// wait blocks until no operation runs, for tests.
func (t *opTracker) wait() {
	t.mu.Lock()
	for t.running > 0 {
		t.idle.Wait()
	}
	t.mu.Unlock()
}

// copyOp copies op's results, the part that changes while it runs;
// counts are set once and never changed.
func copyOp(op *cluster.Op) cluster.Op {
	c := *op
	c.Results = slices.Clone(op.Results)
	return c
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func newOpID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.New("crypto/rand failed")) // never on Linux ≥ 3.17
	}
	return hex.EncodeToString(b[:])
}
