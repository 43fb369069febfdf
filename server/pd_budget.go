package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// budget bounds the bytes of pushed chunks being received or held
// (pd_receive_bytes). A receiver over it waits for readers to free some,
// which stalls the pushing daemon through TCP's own flow control.
//
// Requests that do not fit wait in a queue and are served in arrival
// order: bytes freed go to the queue's head, and a later request waits
// behind it even when it would fit. Without the queue whichever request
// looked first after a release and fit won, so a batch of a per-layer
// push (which takes its whole budget at once) could lose to a stream of
// small transfers until its deadline. A request larger than the whole
// budget is refused at once and never queues.
//
// One exception: a request of a transfer that already took budget on
// its connection (the next chunk or batch of a transfer in progress) may
// take free bytes past the queue. Its earlier chunks are held until read,
// and their reader may wait for the rest of the transfer before it reads
// any; queued behind a request that needs those very bytes, both would
// wait until the other's deadline. For the same reason bytes freed go to
// such requests first, even when the head would fit: a new transfer
// taking them would leave the one in progress waiting for bytes only the
// new one's reader frees. Transfers in progress end, and new ones queue,
// so the head still gets its turn.
type budget struct {
	limit int64

	mu    sync.Mutex
	inUse int64
	queue []*waiter // in arrival order
}

// waiter is a session's means of waiting for budget, made once and
// reused, so that a wait allocates nothing.
type waiter struct {
	wake  chan struct{} // capacity 1; the session's, shared with its other waits
	timer *time.Timer

	// Under budget.mu while queued:
	n       int64
	early   bool // of a transfer in progress: may be served past the head
	granted bool
}

var errBudget = errors.New("pd_receive_bytes is full")

// acquire takes n bytes, waiting until deadline for them. early says the
// request belongs to a transfer that took budget before on its connection.
func (b *budget) acquire(ctx context.Context, n int64, deadline time.Time, w *waiter, early bool) error {
	if n > b.limit {
		return fmt.Errorf("a chunk of %d bytes is larger than pd_receive_bytes (%d)", n, b.limit)
	}
	b.mu.Lock()
	if (early || len(b.queue) == 0) && b.inUse+n <= b.limit {
		b.inUse += n
		b.mu.Unlock()
		return nil
	}
	select { // a wake-up left from an earlier wait
	case <-w.wake:
	default:
	}
	w.n, w.early, w.granted = n, early, false
	b.queue = append(b.queue, w)
	b.mu.Unlock()
	if w.timer == nil {
		w.timer = time.NewTimer(time.Until(deadline))
	} else {
		w.timer.Reset(time.Until(deadline))
	}
	defer w.timer.Stop()
	for {
		select {
		case <-w.wake:
			if b.isGranted(w) {
				return nil
			}
		case <-w.timer.C:
			if b.leave(w) {
				return fmt.Errorf("%w: no room for %d more bytes before the transfer's deadline", errBudget, n)
			}
			return nil // granted as the deadline came
		case <-ctx.Done():
			if !b.leave(w) {
				b.release(n)
			}
			return ctx.Err()
		}
	}
}

func (b *budget) isGranted(w *waiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return w.granted
}

// leave takes w out of the queue and reports true, or false when it was
// granted meanwhile (its bytes are then taken).
func (b *budget) leave(w *waiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		return false
	}
	for i, q := range b.queue {
		if q == w {
			last := len(b.queue) - 1
			copy(b.queue[i:], b.queue[i+1:])
			b.queue[last] = nil
			b.queue = b.queue[:last]
			break
		}
	}
	b.grantLocked() // a head that gave up may have blocked others that fit
	return true
}

// grantLocked serves the queue: first the early requests that fit, in
// order, then the queue in order while each fits. Early requests go first
// because a new transfer at the head that fits would otherwise take bytes
// that a transfer in progress behind it needs to finish, while both
// readers wait for bytes only the other frees.
func (b *budget) grantLocked() {
	for _, w := range b.queue {
		if w.early && b.inUse+w.n <= b.limit {
			b.grant(w)
		}
	}
	kept := b.queue[:0]
	blocked := false
	for _, w := range b.queue {
		if w.granted {
			continue
		}
		if !blocked && b.inUse+w.n <= b.limit {
			b.grant(w)
			continue
		}
		blocked = true
		kept = append(kept, w)
	}
	clear(b.queue[len(kept):])
	b.queue = kept
}

func (b *budget) grant(w *waiter) {
	b.inUse += w.n
	w.granted = true
	select {
	case w.wake <- struct{}{}:
	default: // it has one pending already
	}
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.inUse -= n
	b.grantLocked()
	b.mu.Unlock()
}

func (b *budget) used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inUse
}

// waiting returns how many requests wait for room.
func (b *budget) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}
