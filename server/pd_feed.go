package server

import (
	"context"
	"errors"
	"time"

	"kvtier/client"
	"kvtier/tier"
	"kvtier/wire"
)

// Pushes of chunks still being saved (PUSH with a store lease,
// docs/disaggregation.md): the producer sends a batch of them with one
// RECEIVE_LAYERS, layer by layer, each layer's ranges as soon as the
// client's STORE_LAYER says that layer is final. A consumer older than
// RECEIVE_LAYERS gets the chunks whole once they are committed, with
// RECEIVE, as before.

// layerProbeTTL is how long a destination found without RECEIVE_LAYERS is
// sent whole chunks before it is asked again (it may have been upgraded);
// at most maxNoLayers such destinations are remembered.
const (
	layerProbeTTL = time.Minute
	maxNoLayers   = 1024
)

// sweepNoLayersLocked forgets the destinations found without
// RECEIVE_LAYERS whose answer is past layerProbeTTL (they are asked
// again), under p.pushMu.
func (p *pd) sweepNoLayersLocked(now time.Time) {
	for dest, at := range p.noLayers {
		if now.Sub(at) >= layerProbeTTL {
			delete(p.noLayers, dest)
		}
	}
}

// noteNoLayers remembers dest as without RECEIVE_LAYERS; with the table
// full, the answers past their time go first, and then any one (it is
// only asked again).
func (p *pd) noteNoLayers(dest string, now time.Time) {
	p.pushMu.Lock()
	defer p.pushMu.Unlock()
	if _, ok := p.noLayers[dest]; !ok && len(p.noLayers) >= maxNoLayers {
		p.sweepNoLayersLocked(now)
		for d := range p.noLayers {
			if len(p.noLayers) < maxNoLayers {
				break
			}
			delete(p.noLayers, d)
		}
	}
	p.noLayers[dest] = now
}

// noLayersLen returns how many destinations are remembered without
// RECEIVE_LAYERS.
func (p *pd) noLayersLen() int {
	p.pushMu.Lock()
	defer p.pushMu.Unlock()
	return len(p.noLayers)
}

// pushConn is a connection to a consumer with what the consumer answered
// to an empty RECEIVE_LAYERS on it. The answer — op 27 known, and the
// budget — is the consumer process's, fixed for its life, so it holds for
// the connection's: it is asked once per connection and kept with it in
// the pool, and a batch costs no extra round trip. A restarted consumer
// is a new connection, asked anew; a connection whose request failed or
// got an error reply is closed, never pooled.
type pushConn struct {
	c        *client.Client
	answered bool   // it answered an empty RECEIVE_LAYERS: it takes op 27
	budget   int64  // the receive budget it named (0: none)
	lastID   uint64 // the transfer it carried last, set as it is pooled
}

// receiveFed sends the leading chunks of the batch in ps, chunks of one
// store lease in progress, and returns how many it sent and how many the
// consumer stored. A batch by layers is cut to half the consumer's
// receive budget (batchBudget), which it takes all at once; whole chunks
// stream one by one. A
// pooled connection used on its earlier answer, without asking, and found
// closed by its first request (the consumer restarted, or closed it while
// it sat in the pool) is replaced once, and the new one asked again; one
// closed mid-transfer fails the transfer (see pusher.pooled).
func (p *pd) receiveFed(t *transfer, ps *pusher, n int) (int, int, error) {
	for attempt := 0; ; attempt++ {
		sent, stored, trusted, err := p.receiveFedOnce(t, ps, n)
		if err == nil || !trusted || attempt > 0 || !errors.Is(err, client.ErrClosed) || t.ctx.Err() != nil {
			return sent, stored, err
		}
		if ps.c != nil {
			ps.dropConn()
		}
		p.dropConns(t.dest)
	}
}

// receiveFedOnce is one attempt of receiveFed; trusted says it sent by
// layers on a pooled connection's earlier answer, without asking, as the
// connection's first request of this transfer.
func (p *pd) receiveFedOnce(t *transfer, ps *pusher, n int) (sent, stored int, trusted bool, err error) {
	feed := ps.fed[0].Feed
	geo, err := feed.Geometry(t.ctx)
	if err != nil {
		return n, 0, false, err
	}
	layered := geo.Valid()
	if layered {
		var budget int64
		if layered, budget, trusted, err = p.takesLayers(t, ps); err != nil {
			return n, 0, false, err
		}
		if layered && budget > 0 {
			n = fitBudget(ps.bufs[:n], batchBudget(budget))
		}
	}
	m := &ps.layers
	m.Receive = wire.Receive{Transfer: t.id, HoldMS: uint32(t.timeout / time.Millisecond),
		Keys: wire.Keys{Kind: wire.KindRaw, Raw: ps.keys[:n]}, Sizes: m.Sizes[:0]}
	for _, b := range ps.bufs[:n] {
		m.Sizes = append(m.Sizes, uint32(len(b)))
	}
	layered = layered && m.RangesFor(geo.Layers, geo.Parts, 1) && len(m.Ranges) <= wire.MaxRanges
	if !layered {
		// Whole chunks, once the lease committed them.
		for _, f := range ps.fed[:n] {
			if err := feed.WaitLayer(t.ctx, f.Index, tier.MaxLayers+1); err != nil {
				return n, 0, false, err
			}
		}
		stored, err = p.receive(t, ps, n)
		return n, stored, false, err
	}
	perLayer := n * geo.Parts
	ready := func(i int) error {
		return feed.WaitLayer(t.ctx, ps.fed[m.Ranges[i].Key].Index, i/perLayer+1)
	}
	trusted = trusted && ps.pooled
	ps.pooled = false // it carries a request of this transfer now
	stop := context.AfterFunc(t.ctx, ps.c.Interrupt)
	stored, err = ps.c.ReceiveLayers(t.ctx, m, ps.bufs[:n], ready, nil)
	if !stop() {
		ps.dropConn()
		if err == nil {
			err = t.ctx.Err()
		}
	}
	return n, stored, trusted, err
}

// batchBudget is how many bytes of a consumer's receive budget of limit
// bytes one batch by layers may take: half. The consumer serves a batch
// only once all its bytes are free; one sized to the whole budget would
// wait until nothing at all is held there (holds nobody reads included),
// and every new transfer would queue behind it with nearly all of the
// budget free.
func batchBudget(limit int64) int64 {
	return max(limit/2, 1)
}

// fitBudget returns how many leading chunks of bufs fit in budget bytes
// together, at least one (a chunk larger than the budget is refused as
// RECEIVE would refuse it).
func fitBudget(bufs [][]byte, budget int64) int {
	var sum int64
	for j, b := range bufs {
		if sum += int64(len(b)); sum > budget && j > 0 {
			return j
		}
	}
	return len(bufs)
}

// takesLayers makes sure ps has a connection to t's destination and
// reports whether the destination takes RECEIVE_LAYERS, with the receive
// budget it names (0: none named): the connection's earlier answer
// (cached), or else the answer to a request of no chunks. A pooled
// connection found closed by that request is dialled again once.
func (p *pd) takesLayers(t *transfer, ps *pusher) (layers bool, budget int64, cached bool, err error) {
	p.pushMu.Lock()
	at, found := p.noLayers[t.dest]
	p.pushMu.Unlock()
	if found && time.Since(at) < layerProbeTTL {
		return false, 0, false, nil
	}
	for attempt := 0; ; attempt++ {
		if ps.c == nil {
			if err := ps.dial(p, t); err != nil {
				return false, 0, false, err
			}
		}
		if ps.answered {
			return true, ps.budget, true, nil
		}
		pooled := ps.pooled
		ps.pooled = false // it carries a request of this transfer now
		stop := context.AfterFunc(t.ctx, ps.c.Interrupt)
		budget, err := ps.c.ReceiveLayersBudget(t.ctx, t.id)
		interrupted := !stop()
		switch {
		case err == nil && !interrupted:
			ps.answered, ps.budget = true, budget
			return true, budget, false, nil
		case client.IsUnknownOp(err):
			p.noteNoLayers(t.dest, time.Now())
			ps.dropConn() // an older daemon may have closed it; dial anew for RECEIVE
			return false, 0, false, nil
		}
		ps.dropConn()
		if err == nil {
			err = t.ctx.Err()
		}
		if !pooled || attempt > 0 || !errors.Is(err, client.ErrClosed) || t.ctx.Err() != nil {
			return false, 0, false, err
		}
		p.dropConns(t.dest)
	}
}
