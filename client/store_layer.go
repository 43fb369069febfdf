package client

import (
	"context"

	"kvtier/wire"
)

// StoreLayer tells the daemon that layer of every slot of a PrepareStore
// lease is final, so it may write that layer to its disk tier before the
// commit (docs/layerwise.md). It is one-way: it returns once the frame is
// written, without a round trip, and the daemon never answers it (a notice
// it cannot use is dropped; CommitStore still stores the chunks). layers
// and parts describe the chunks as for PrepareRetrieveLayers; 0 and 0 take
// them from the scope's format tag.
func (c *Client) StoreLayer(ctx context.Context, lease uint64, layer, layers, parts int) error {
	b, err := c.begin(ctx)
	if err != nil {
		return err
	}
	defer c.end()
	m := wire.StoreLayer{Lease: lease, Layer: uint32(layer), Layers: uint16(layers), Parts: uint8(parts)}
	c.out = wire.Finish(m.Append(b), wire.OpStoreLayer, 0, c.id, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return c.breakConn(err)
	}
	return nil
}
