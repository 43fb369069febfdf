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
// sent whole chunks before it is asked again (it may have been upgraded).
const layerProbeTTL = time.Minute

// receiveFed sends the batch in ps, chunks of one store lease in progress.
func (p *pd) receiveFed(t *transfer, ps *pusher, n int) (int, error) {
	feed := ps.fed[0].Feed
	geo, err := feed.Geometry(t.ctx)
	if err != nil {
		return 0, err
	}
	m := &ps.layers
	m.Receive = wire.Receive{Transfer: t.id, HoldMS: uint32(t.timeout / time.Millisecond),
		Keys: wire.Keys{Kind: wire.KindRaw, Raw: ps.keys[:n]}, Sizes: m.Sizes[:0]}
	for _, b := range ps.bufs[:n] {
		m.Sizes = append(m.Sizes, uint32(len(b)))
	}
	layered := geo.Valid() && m.RangesFor(geo.Layers, geo.Parts, 1) && len(m.Ranges) <= wire.MaxRanges
	if layered {
		if layered, err = p.takesLayers(t, ps); err != nil {
			return 0, err
		}
	}
	if !layered {
		// Whole chunks, once the lease committed them.
		for _, f := range ps.fed[:n] {
			if err := feed.WaitLayer(t.ctx, f.Index, tier.MaxLayers+1); err != nil {
				return 0, err
			}
		}
		return p.receive(t, ps, n)
	}
	perLayer := n * geo.Parts
	ready := func(i int) error {
		return feed.WaitLayer(t.ctx, ps.fed[m.Ranges[i].Key].Index, i/perLayer+1)
	}
	stop := context.AfterFunc(t.ctx, ps.c.Interrupt)
	stored, err := ps.c.ReceiveLayers(t.ctx, m, ps.bufs[:n], ready, nil)
	if !stop() {
		ps.c.Close()
		ps.c, ps.pooled = nil, false
		if err == nil {
			err = t.ctx.Err()
		}
	}
	return stored, err
}

// takesLayers makes sure ps has a connection to t's destination and
// reports whether the destination takes RECEIVE_LAYERS, asking it (a
// request of no chunks) when it is not known. A pooled connection found
// closed is dialled again once.
func (p *pd) takesLayers(t *transfer, ps *pusher) (bool, error) {
	p.pushMu.Lock()
	at, found := p.noLayers[t.dest]
	p.pushMu.Unlock()
	if found && time.Since(at) < layerProbeTTL {
		return false, nil
	}
	for attempt := 0; ; attempt++ {
		if ps.c == nil {
			var err error
			if ps.c, ps.pooled, err = p.conn(t); err != nil {
				return false, err
			}
		}
		var probe wire.ReceiveLayers
		probe.Keys.Kind = wire.KindRaw
		probe.Transfer = t.id
		stop := context.AfterFunc(t.ctx, ps.c.Interrupt)
		_, err := ps.c.ReceiveLayers(t.ctx, &probe, nil, nil, nil)
		interrupted := !stop()
		switch {
		case err == nil && !interrupted:
			return true, nil
		case client.IsUnknownOp(err):
			p.pushMu.Lock()
			p.noLayers[t.dest] = time.Now()
			p.pushMu.Unlock()
			ps.c.Close() // an older daemon may have closed it; dial anew for RECEIVE
			ps.c, ps.pooled = nil, false
			return false, nil
		}
		pooled := ps.pooled
		ps.c.Close()
		ps.c, ps.pooled = nil, false
		if err == nil {
			err = t.ctx.Err()
		}
		if !pooled || attempt > 0 || !errors.Is(err, client.ErrClosed) || t.ctx.Err() != nil {
			return false, err
		}
		p.dropConns(t.dest)
	}
}
