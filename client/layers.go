package client

import (
	"context"

	"kvtier/wire"
)

// PrepareRetrieveLayers is PrepareRetrieve for reading chunks layer by
// layer (docs/layerwise.md): the daemon replies before it has read the
// chunks its lower tiers hold, and fills their slots behind the reply;
// LayerWait says when a layer of every slot is in place. layers and parts
// describe the chunks (wire.PrepareRetrieveLayers); 0 and 0 take them from
// the scope's format tag. Local connections only, like PrepareRetrieve.
func (c *Client) PrepareRetrieveLayers(ctx context.Context, k wire.Keys, layers, parts int, leaseMS uint32) (wire.Slots, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.Slots{}, err
	}
	defer c.end()
	m := wire.PrepareRetrieveLayers{LeaseMS: leaseMS, Layers: uint16(layers), Parts: uint8(parts), Keys: k}
	return c.slotsReply(m.Append(b), wire.OpPrepareRetrieveLayers)
}

// LayerWait waits until layer is in place in every usable slot of a
// PrepareRetrieveLayers lease (at most until the lease's deadline) and
// returns how many slots, from the first, are usable — the rest failed to
// load and must be recomputed — and how many layers are ready in all of
// them; fewer than layer+1 means the wait ran out.
func (c *Client) LayerWait(ctx context.Context, lease uint64, layer int) (wire.LayerReady, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.LayerReady{}, err
	}
	defer c.end()
	m := wire.LayerWait{Lease: lease, Layer: uint32(layer)}
	_, body, err := c.roundTrip(m.Append(b), wire.OpLayerWait, 0)
	if err != nil {
		return wire.LayerReady{}, err
	}
	var r wire.LayerReady
	if err := r.Decode(body); err != nil {
		return wire.LayerReady{}, c.breakConn(err)
	}
	return r, nil
}
