package disk

import (
	"context"
	"sync"

	"kvtier/chunk"
)

// The scheduler feeds a fixed set of I/O goroutines from one priority queue
// per class. A worker always takes the oldest operation of the most urgent
// non-empty class: reads first (a reader is waiting for KV right now), then
// deletes (they return space that writes are waiting for), then writes
// (asynchronous at the tier manager's level, so they can wait). Within a
// class, operations run in submission order.

// class is an operation's priority; lower runs first.
type class uint8

const (
	classRead class = iota
	classDelete
	classWrite
	numClasses
)

// opKind is what an operation does.
type opKind uint8

const (
	opRead   opKind = iota // read a record's header and/or part of its payload into buf
	opWrite                // write a record's payload from buf
	opPunch                // free a record's byte range
	opRetire               // close and delete a segment with no records left
)

func (k opKind) class() class {
	switch k {
	case opRead:
		return classRead
	case opPunch, opRetire:
		return classDelete
	default:
		return classWrite
	}
}

// op is one unit of work for an I/O goroutine. Ops are pooled: the done
// channel is made once and reused, so submitting work allocates nothing.
type op struct {
	kind   opKind
	async  bool // nobody waits: the worker returns the op to the pool
	seg    *segment
	key    chunk.Key // punch: whose copy is freed
	off    int64     // record offset in seg
	length int64     // punch: bytes to free
	from   int64     // read: offset of buf in the payload; 0 reads the header too
	buf    []byte    // read: destination (part of the payload); write: source payload
	hdr    header    // read: the header found
	block  []byte    // write: one aligned block for the caller's header
	hdrErr error     // read: why the header block was rejected
	err    error     // I/O error
	done   chan struct{}
}

// opPool recycles ops. Unlike a sync.Pool it is not emptied by garbage
// collections, so ops (and the header blocks they carry) are made only as
// many times as there are operations in flight at once.
type opPool struct {
	mu   sync.Mutex
	free []*op
}

func (p *opPool) get() *op {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		o := p.free[n-1]
		p.free = p.free[:n-1]
		return o
	}
	return &op{done: make(chan struct{}, 1)}
}

func (p *opPool) put(o *op) {
	*o = op{done: o.done, block: o.block}
	p.mu.Lock()
	p.free = append(p.free, o)
	p.mu.Unlock()
}

// ring is a FIFO of ops that reuses its storage.
type ring struct {
	buf  []*op
	head int
	n    int
}

func (r *ring) push(o *op) {
	if r.n == len(r.buf) {
		grown := make([]*op, max(8, 2*len(r.buf)))
		for i := range r.n {
			grown[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = grown, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = o
	r.n++
}

func (r *ring) pop() *op {
	if r.n == 0 {
		return nil
	}
	o := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return o
}

// remove takes o out of the queue and reports whether it was there.
func (r *ring) remove(o *op) bool {
	for i := range r.n {
		if r.buf[(r.head+i)%len(r.buf)] != o {
			continue
		}
		for j := i; j < r.n-1; j++ {
			r.buf[(r.head+j)%len(r.buf)] = r.buf[(r.head+j+1)%len(r.buf)]
		}
		r.buf[(r.head+r.n-1)%len(r.buf)] = nil
		r.n--
		return true
	}
	return false
}

// sched owns the queues and the I/O goroutines.
type sched struct {
	mu     sync.Mutex
	wake   sync.Cond
	queues [numClasses]ring
	closed bool
	exec   func(*worker, *op)
	wg     sync.WaitGroup
}

// newSched starts n I/O goroutines, each with its own aligned scratch
// buffers (bounce bytes for unaligned callers), running exec for every op.
// exec must finish the op: signal done, or recycle it when async.
func newSched(n, bounce int, exec func(*worker, *op)) *sched {
	s := &sched{exec: exec}
	s.wake.L = &s.mu
	s.wg.Add(n)
	for range n {
		w := newWorker(bounce)
		go s.run(w)
	}
	return s
}

func (s *sched) submit(o *op) {
	s.mu.Lock()
	s.queues[o.kind.class()].push(o)
	s.mu.Unlock()
	s.wake.Signal()
}

// do submits o and waits for it. If ctx ends while o is still queued, o is
// withdrawn and do returns ctx.Err(); once a worker has it, do waits for it
// to finish, because the worker may be using the caller's buffer.
func (s *sched) do(ctx context.Context, o *op) error {
	s.submit(o)
	return s.wait(ctx, o)
}

// wait is the second half of do, for callers with work to overlap.
func (s *sched) wait(ctx context.Context, o *op) error {
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		if s.cancel(o) {
			return ctx.Err()
		}
		return nil
	}
}

// cancel withdraws o if it is still queued and reports whether it did;
// otherwise a worker has it, and cancel waits for it to finish.
func (s *sched) cancel(o *op) (withdrawn bool) {
	s.mu.Lock()
	withdrawn = s.queues[o.kind.class()].remove(o)
	s.mu.Unlock()
	if !withdrawn {
		<-o.done
	}
	return withdrawn
}

// close lets the workers drain every queued op, then stops them.
func (s *sched) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wake.Broadcast()
	s.wg.Wait()
}

func (s *sched) run(w *worker) {
	defer s.wg.Done()
	for {
		o := s.next()
		if o == nil {
			return
		}
		s.exec(w, o)
	}
}

// next blocks until there is work and returns the most urgent op, or nil
// once the scheduler is closed and drained.
func (s *sched) next() *op {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for c := range s.queues {
			if o := s.queues[c].pop(); o != nil {
				return o
			}
		}
		if s.closed {
			return nil
		}
		s.wake.Wait()
	}
}
