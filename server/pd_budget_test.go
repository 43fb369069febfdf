package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/server"
)

// The consumer's receive budget serves waiting requests in arrival order:
// a large request waiting for room is not starved by a stream of smaller
// transfers that arrive after it and would fit.

// pushed is a RECEIVE or RECEIVE_LAYERS sent to the consumer on a
// goroutine, and its outcome once collected.
type pushed struct {
	keys      []chunk.Key
	done      chan error
	collected bool
	err       error
}

// budgetStream drives a consumer's budget: it sends requests, waits until
// each has been answered or waits for room (by the consumer's own count,
// not by sleeping), and frees room by reading the oldest chunk held.
type budgetStream struct {
	t    *testing.T
	cons *daemon
	reqs []*pushed
	held []chunk.Key // stored on the consumer and not yet read, oldest first
	want map[chunk.Key][]byte
}

// send starts a request that stores chunks under keys with do.
func (b *budgetStream) send(keys []chunk.Key, chunks [][]byte, do func() (int, error)) *pushed {
	for j, k := range keys {
		b.want[k] = chunks[j]
	}
	p := &pushed{keys: keys, done: make(chan error, 1)}
	go func() {
		n, err := do()
		if err == nil && n != len(keys) {
			err = fmt.Errorf("stored %d of %d chunks", n, len(keys))
		}
		p.done <- err
	}()
	b.reqs = append(b.reqs, p)
	return p
}

// settle waits until every request has been answered or waits for budget,
// and collects the answers.
func (b *budgetStream) settle() {
	b.t.Helper()
	waitFor(b.t, "every request answered or waiting for budget", func() bool {
		open := 0
		for _, p := range b.reqs {
			if !p.collected && len(p.done) > 0 {
				p.err, p.collected = <-p.done, true
				if p.err == nil {
					b.held = append(b.held, p.keys...)
				}
			}
			if !p.collected {
				open++
			}
		}
		return b.cons.svc.ReceiveWaiting() == open
	})
}

// readOldest reads the oldest chunk held, which ends its hold, and checks
// its bytes.
func (b *budgetStream) readOldest(c *client.Client) {
	b.t.Helper()
	k := b.held[0]
	b.held = b.held[1:]
	dst := [][]byte{make([]byte, len(b.want[k]))}
	if n, _, err := c.Retrieve(context.Background(), client.Raw([]chunk.Key{k}), dst); err != nil || n != 1 || !bytes.Equal(dst[0], b.want[k]) {
		b.t.Fatalf("reading a held chunk: %d, %v (or wrong bytes)", n, err)
	}
}

// TestReceiveBudgetIsFirstComeFirstServed: with 3 of 4 units of the
// budget held, a request for all 4 waits; then, round by round, a
// transfer of one unit arrives and one held chunk is read. Served by
// whoever fits, the single units would take each unit freed and the large
// request would fail at its deadline (NO_SPACE); served in order, it gets
// the budget once the 3 units it waited behind are read, and the single
// units follow it. Both kinds of large request: a RECEIVE_LAYERS batch of
// 4 chunks and a whole RECEIVE of one chunk of 4 units.
func TestReceiveBudgetIsFirstComeFirstServed(t *testing.T) {
	const u = feedSize
	for _, kind := range []string{"layers", "whole"} {
		t.Run(kind, func(t *testing.T) {
			cons := startService(t, 64<<20, server.ServiceOptions{PDReceiveBytes: 4 * u})
			cc, ctx := cons.local(t), context.Background()
			b := &budgetStream{t: t, cons: cons, want: map[chunk.Key][]byte{}}
			hk, hc := pdKeys(3, 100), [][]byte{chunkData(0, 100, u), chunkData(1, 100, u), chunkData(2, 100, u)}
			hcl := cons.remote(t)
			b.send(hk, hc, func() (int, error) { return hcl.Receive(ctx, 1, 60000, hk, hc, nil) })
			b.settle()
			lc := cons.remote(t)
			var large *pushed
			if kind == "layers" {
				m, chunks := layered(t, 4, 101, u)
				m.Transfer, m.HoldMS = 2, 10000
				large = b.send(m.Keys.Raw, chunks, func() (int, error) { return lc.ReceiveLayers(ctx, m, chunks, nil, nil) })
			} else {
				lk, lch := pdKeys(1, 101), [][]byte{chunkData(0, 101, 4*u)}
				large = b.send(lk, lch, func() (int, error) { return lc.Receive(ctx, 2, 10000, lk, lch, nil) })
			}
			waitFor(t, "the large request waiting for budget", func() bool { return cons.svc.ReceiveWaiting() == 1 })
			for k := 0; k < 8 && !large.collected; k++ {
				sk, sch := pdKeys(1, byte(110+k)), [][]byte{chunkData(0, uint32(110+k), u)}
				sc := cons.remote(t)
				b.send(sk, sch, func() (int, error) { return sc.Receive(ctx, uint64(10+k), 60000, sk, sch, nil) })
				b.settle()
				if len(b.held) > 0 {
					b.readOldest(cc)
				}
				b.settle()
			}
			if !large.collected {
				large.err = <-large.done // served by whoever fits: NO_SPACE at its deadline
			}
			if large.err != nil {
				t.Fatalf("the large request, behind which single units kept arriving: %v", large.err)
			}
			for round, open := 0, true; open; round++ {
				if round > 100 {
					t.Fatal("the transfers left do not progress as held chunks are read")
				}
				open = false
				for _, p := range b.reqs {
					open = open || !p.collected
				}
				if len(b.held) > 0 {
					b.readOldest(cc)
				}
				b.settle()
			}
			for _, p := range b.reqs {
				if p.err != nil {
					t.Fatalf("a transfer of %d chunks: %v", len(p.keys), p.err)
				}
			}
			for len(b.held) > 0 {
				b.readOldest(cc)
			}
			waitFreed(t, cons, cc, 0)
		})
	}
}

// TestReceiveBudgetLetsATransferInProgressGoOn: the next chunk of a
// transfer that has taken budget on its connection takes free room past a
// waiting request (its reader may be waiting for the rest before it reads
// anything); a new transfer's chunk that would fit waits its turn.
func TestReceiveBudgetLetsATransferInProgressGoOn(t *testing.T) {
	const u = feedSize
	cons := startService(t, 64<<20, server.ServiceOptions{PDReceiveBytes: 4 * u})
	cc, ctx := cons.local(t), context.Background()
	b := &budgetStream{t: t, cons: cons, want: map[chunk.Key][]byte{}}
	first := cons.remote(t) // the transfer in progress, on its connection
	for k := range 2 {
		keys, chunks := pdKeys(1, byte(120+k)), [][]byte{chunkData(0, uint32(120+k), u)}
		b.send(keys, chunks, func() (int, error) { return first.Receive(ctx, 1, 60000, keys, chunks, nil) })
		b.settle()
	}
	lk, lch := pdKeys(1, 122), [][]byte{chunkData(0, 122, 4*u)}
	lc := cons.remote(t)
	large := b.send(lk, lch, func() (int, error) { return lc.Receive(ctx, 2, 60000, lk, lch, nil) })
	b.settle()
	if !large.pending() || cons.svc.ReceiveWaiting() != 1 {
		t.Fatalf("the large request: pending %v, %d waiting", large.pending(), cons.svc.ReceiveWaiting())
	}
	nk, nch := pdKeys(1, 123), [][]byte{chunkData(0, 123, u)}
	next := b.send(nk, nch, func() (int, error) { return first.Receive(ctx, 1, 60000, nk, nch, nil) })
	b.settle()
	if next.pending() || next.err != nil || cons.svc.HeldBytes() != 3*u {
		t.Fatalf("the transfer in progress, past the waiter: pending %v, %v, %d bytes held", next.pending(), next.err, cons.svc.HeldBytes())
	}
	ok, och := pdKeys(1, 124), [][]byte{chunkData(0, 124, u)}
	oc := cons.remote(t)
	other := b.send(ok, och, func() (int, error) { return oc.Receive(ctx, 3, 60000, ok, och, nil) })
	b.settle()
	if !other.pending() || cons.svc.ReceiveWaiting() != 2 {
		t.Fatalf("a new transfer that would fit: pending %v, %d waiting; want it behind the large request", other.pending(), cons.svc.ReceiveWaiting())
	}
	for len(b.held) > 0 {
		b.readOldest(cc)
		b.settle()
	}
	for _, p := range b.reqs {
		if p.pending() || p.err != nil {
			t.Fatalf("a transfer of %d chunks: pending %v, %v", len(p.keys), p.pending(), p.err)
		}
	}
	waitFreed(t, cons, cc, 0)
}

// pending reports whether p has not been answered.
func (p *pushed) pending() bool { return !p.collected }
