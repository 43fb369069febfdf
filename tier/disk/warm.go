package disk

import (
	"slices"
	"time"

	"kvtier/chunk"
	"kvtier/tier/policy"
)

// Open does not wait for the eviction policy to take in the records a
// checkpoint restores: a million admissions cost about as much CPU as
// filling the index itself, and reads need only the index. A goroutine
// admits the restored keys, in log order, while Open fills the index and
// after it returns ("warming"). Until it is done, nothing else touches the
// policy: admissions, hits and removals that come meanwhile are queued in
// order and applied when it finishes, and anything that needs the policy's
// answer — an eviction — waits for it. So the policy ends in the state an
// Open that admitted everything itself would have left, reads are served
// from the start, and no record can be evicted before the policy knows it.
//
// Nothing waits for the policy while holding the tier's lock, or every
// read would wait with it (a million records take seconds to admit): a Put
// that must evict lets go of the lock until the policy is ready
// (waitPolicyLocked), Puts evict ahead of need (Headroom) only once it is,
// and an operation that finds the queue full waits before it takes the
// lock (waitQueueRoom).

// polOp is a policy operation queued while the policy warms.
type polOp struct {
	kind  polKind
	hasUp bool
	key   chunk.Key
	up    chunk.Key // the parent, for an admission that names one
}

type polKind uint8

const (
	polAdmit polKind = iota
	polAccess
	polRemove
	polAdopt // link key under up (adopt.go)
)

// maxQueuedOps bounds the queue once Open has returned: past it, Gets,
// Puts and Removes wait for the policy before they take the tier's lock (a
// read storm during warm-up costs those callers a wait, not unbounded
// memory). The bound is loose by what callers already inside the lock add.
const maxQueuedOps = 1 << 16

// warmRec is a restored record as the policy takes it in: its key and,
// when it names one, its parent's key hash (same scope).
type warmRec struct {
	key   chunk.Key
	up    chunk.Hash
	hasUp bool
}

// warmer is the goroutine admitting restored keys, and the queue.
type warmer struct {
	batches chan []int32  // entries of the checkpoint restored, one batch per segment, in log order
	feeding bool          // batches is still open: Open is restoring
	done    chan struct{} // closed once every batch is admitted and linked
	end     time.Time     // when; written before done is closed
	queued  []polOp       // under the tier's lock
	late    []warmRec     // restored before their parents and not linked by the goroutine; written before done is closed
}

// ready reports whether the policy goroutine is done.
func (w *warmer) ready() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// warmHold, when set (tests), is called by the policy goroutine before it
// starts: the test holds the policy cold while it works the tier.
var warmHold func()

// warmWaiting, when set (tests), is called by a caller that starts
// waiting for the policy without the tier's lock.
var warmWaiting func()

// startWarm starts admitting restored keys on another goroutine, after
// sizing the policy for grow keys; at most segs batches of cp's entries
// will come.
func (x *index) startWarm(cp *checkpoint, grow, segs int) {
	// The checkpoint is the goroutine's alone (never changed after
	// decoding), and not kept past it: 56 bytes a record.
	w := &warmer{batches: make(chan []int32, segs), feeding: true, done: make(chan struct{})}
	order, hold := x.order, warmHold
	go func() {
		defer func() {
			w.end = time.Now()
			close(w.done)
		}()
		if hold != nil {
			hold()
		}
		policy.Grow(order, grow) // a map grown step by step rehashes some twenty times
		late := admitRestored(order, cp, w.batches)
		w.late = adoptLate(order, cp, late)
	}()
	x.warm = w
}

// admitRestored admits the restored records in log order, each as its
// parent's child where the policy follows prefixes, and returns those
// that came before their parents (adopt.go).
func admitRestored(order policy.Policy[chunk.Key], cp *checkpoint, batches <-chan []int32) []int32 {
	ad, chains := order.(policy.Adopter[chunk.Key])
	var late []int32
	for b := range batches {
		for _, i := range b {
			key, _, _ := cp.rec(int(i))
			up, hasUp := cp.parent(int(i))
			if !chains || !hasUp {
				order.Admit(key)
				continue
			}
			if !ad.AdmitChildLinked(key, chunk.Key{Scope: key.Scope, Hash: up}) {
				late = append(late, i)
			}
		}
	}
	return late
}

// adoptLate links the restored records that came before their parents,
// on the policy goroutine once it has admitted every restored record
// (before done closes, so that no caller of pol waits for it with the
// tier's lock held). It walks them from the end, as adoptAll does, and
// returns those it could not link: their parent may be among the records
// found in the log past the checkpoint, which pol links with the rest.
func adoptLate(order policy.Policy[chunk.Key], cp *checkpoint, late []int32) []warmRec {
	ad, ok := order.(policy.Adopter[chunk.Key])
	if !ok {
		return nil
	}
	var failed []warmRec
	for j := len(late) - 1; j >= 0; j-- {
		key, _, _ := cp.rec(int(late[j]))
		up, _ := cp.parent(int(late[j]))
		if !ad.Adopt(key, chunk.Key{Scope: key.Scope, Hash: up}) {
			failed = append(failed, warmRec{key: key, up: up, hasUp: true})
		}
	}
	slices.Reverse(failed)
	return failed
}

// feedWarm hands the policy goroutine one segment's restored entries of
// the checkpoint, which the caller must not change afterwards.
func (x *index) feedWarm(recs []int32) {
	if len(recs) > 0 {
		x.warm.batches <- recs
	}
}

// endFeed tells the policy goroutine that no more batches come.
func (x *index) endFeed() {
	if w := x.warm; w != nil && w.feeding {
		w.feeding = false
		close(w.batches)
	}
}

// pol returns the policy once it has taken in the restored keys and the
// operations queued meanwhile: the only way to the policy for operations
// that need its answer. Not while Open still feeds it. It waits for the
// policy goroutine if that is not done, so after Open a caller holding
// the tier's lock must first make sure it is (policyReady,
// Tier.waitPolicyLocked).
func (x *index) pol() policy.Policy[chunk.Key] {
	if w := x.warm; w != nil {
		x.endFeed()
		<-w.done
		x.warm, x.warmEnd = nil, w.end
		x.full.Store(nil)
		for _, op := range w.queued {
			op.apply(x.order)
		}
		// What the goroutine could not link (a parent found in the log
		// past the checkpoint, or not on disk: two map probes each to
		// try again) and the log's own late records, fewer than the
		// records written since the last checkpoint. While Open still
		// indexes the log, their parents may be yet to come: recover
		// links them once it has (restoring).
		x.relink = append(w.late, x.relink...)
		if !x.restoring {
			x.adoptRestored()
		}
	}
	return x.order
}

// policyReady reports whether pol would return without waiting.
func (x *index) policyReady() bool { return x.warm == nil || x.warm.ready() }

// warming reports whether the policy is still taking in restored keys;
// an operation that need not wait for it then goes into the queue. It
// never waits: a full queue only makes the next callers wait, outside the
// lock (waitQueueRoom).
func (x *index) warming() bool {
	w := x.warm
	if w == nil {
		return false
	}
	if !w.ready() {
		if !w.feeding && len(w.queued) >= maxQueuedOps {
			x.full.Store(w)
		}
		return true
	}
	x.pol() // ready: apply the queue
	return false
}

// admit, access and remove are the policy operations that can be queued.
func (x *index) admit(k chunk.Key, up parent) {
	if x.warming() {
		x.warm.queued = append(x.warm.queued, polOp{kind: polAdmit, key: k, up: up.key, hasUp: up.ok})
		return
	}
	policy.AdmitAfter(x.order, k, up.key, up.ok)
}

func (x *index) access(k chunk.Key) {
	if x.warming() {
		x.warm.queued = append(x.warm.queued, polOp{kind: polAccess, key: k})
		return
	}
	x.order.Access(k)
}

func (x *index) remove(k chunk.Key) {
	if x.warming() {
		x.warm.queued = append(x.warm.queued, polOp{kind: polRemove, key: k})
		return
	}
	x.order.Remove(k)
}

func (op polOp) apply(p policy.Policy[chunk.Key]) {
	switch op.kind {
	case polAdmit:
		policy.AdmitAfter(p, op.key, op.up, op.hasUp)
	case polAccess:
		p.Access(op.key)
	case polRemove:
		p.Remove(op.key)
	case polAdopt:
		if ad, ok := p.(policy.Adopter[chunk.Key]); ok {
			ad.Adopt(op.key, op.up)
		}
	}
}

// waitPolicyLocked waits, with t.mu let go, until the policy has taken in
// what Open restored, so that the caller can then ask it for a victim
// without holding everyone else up. It reports whether it let go of the
// lock: then the caller, which holds it again, must look at the tier
// afresh.
func (t *Tier) waitPolicyLocked() bool {
	w := t.idx.warm
	if w == nil || w.ready() {
		return false
	}
	t.mu.Unlock()
	if warmWaiting != nil {
		warmWaiting()
	}
	<-w.done
	t.mu.Lock()
	return true
}

// waitQueueRoom waits, before the caller takes t.mu, while the policy is
// warming with its queue full.
func (t *Tier) waitQueueRoom() {
	if w := t.idx.full.Load(); w != nil {
		if warmWaiting != nil {
			warmWaiting()
		}
		<-w.done
	}
}

// WaitPolicy waits until the eviction policy has taken in the records Open
// restored from a checkpoint, and linked those that came before their
// parents, and returns how long after Open began that was: Open itself
// returns once reads can be served (Recovery.Duration); evictions wait for
// the policy.
func (t *Tier) WaitPolicy() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.waitPolicyLocked()
	t.idx.pol()
	end := t.idx.warmEnd // set where the fill ended, whoever waited for it
	if end.IsZero() {
		return t.rec.Duration
	}
	return max(end.Sub(t.recStart), t.rec.Duration)
}
