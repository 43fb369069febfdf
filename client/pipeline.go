package client

import (
	"context"

	"kvtier/wire"
)

// Pipelined range reads. The daemon answers a connection's requests one
// after the other, in order, so a caller that alone uses a connection
// may send the next RETRIEVE_RANGES before the reply to the last has
// arrived: the daemon starts on it as soon as it has sent that reply,
// instead of waiting a round trip for it. A peer's layerwise stream
// (tier/p2p) keeps two in flight per chunk this way.

// SendRetrieveRanges writes a RETRIEVE_RANGES request for ranges of the
// chunks named by k and returns its id, without reading the reply.
// RecvRetrieveRanges reads the replies, in the order their requests were
// sent; no other request may be made on the connection until every reply
// has been read. Keep the requests in flight few and their frames small:
// the caller does not read while it sends.
func (c *Client) SendRetrieveRanges(ctx context.Context, k wire.Keys, ranges []wire.ByteRange) (uint32, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	c.rangeReq.Keys, c.rangeReq.Ranges = k, ranges
	c.out = wire.Finish(c.rangeReq.Append(b), wire.OpRetrieveRanges, c.peerFlag(), c.id, wire.StatusOK)
	c.rangeReq = wire.RetrieveRanges{}
	if _, err := c.conn.Write(c.out); err != nil {
		return 0, c.breakConn(err)
	}
	return c.id, nil
}

// RecvRetrieveRanges reads the reply to request id from
// SendRetrieveRanges, which asked for ranges, as RetrieveRanges does:
// range i lands in dst[ranges[i].Key][From:To], checked against its
// checksum. A reply that answers another request breaks the connection.
func (c *Client) RecvRetrieveRanges(ctx context.Context, id uint32, ranges []wire.ByteRange, dst [][]byte) (sizes []uint32, read int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, 0, c.broken
	}
	c.deadline(ctx)
	h, body, err := c.readReplyTo(wire.OpRetrieveRanges, id)
	if err != nil {
		return nil, 0, err
	}
	return c.rangeData(h, body, id, ranges, dst, false)
}
