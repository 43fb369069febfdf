package client

import (
	"context"
	"encoding/binary"
	"fmt"

	"kvtier/wire"
)

// ReceiveLayers sends m's chunks, chunks[j] under m.Keys.Raw[j], as the
// byte ranges of m.Ranges, in that order, each range followed by its
// checksum: sums[i] when sums is not nil (a test sends wrong ones), else
// the XXH3-64 of the range's bytes. m.Sizes is set from chunks. Before
// range i is written, ready(i) (when not nil) may wait until its bytes
// are final — a producer whose connector is still saving later layers —
// and an error from it abandons the request and the connection. It
// returns how many leading chunks the daemon stored. A daemon older than
// RECEIVE_LAYERS answers in a way IsUnknownOp recognizes.
func (c *Client) ReceiveLayers(ctx context.Context, m *wire.ReceiveLayers, chunks [][]byte, ready func(i int) error, sums []uint64) (int, error) {
	n, _, err := c.receiveLayers(ctx, m, chunks, ready, sums)
	return n, err
}

// receiveLayers is ReceiveLayers that also returns the budget a reply to
// a request of no chunks names.
func (c *Client) receiveLayers(ctx context.Context, m *wire.ReceiveLayers, chunks [][]byte, ready func(i int) error, sums []uint64) (int, int64, error) {
	if (sums != nil && len(m.Ranges) != len(sums)) || len(chunks) > len(m.Keys.Raw) {
		return 0, 0, fmt.Errorf("kvtier client: %d ranges, %d checksums, %d chunks, %d keys", len(m.Ranges), len(sums), len(chunks), len(m.Keys.Raw))
	}
	m.Sizes = m.Sizes[:0]
	for _, ch := range chunks {
		m.Sizes = append(m.Sizes, uint32(len(ch)))
	}
	for _, r := range m.Ranges {
		if int(r.Key) >= len(chunks) || r.From >= r.To || int(r.To) > len(chunks[r.Key]) {
			return 0, 0, fmt.Errorf("kvtier client: range %+v outside the chunks", r)
		}
	}
	b, err := c.begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.end()
	flags := wire.Flags(0)
	if len(m.Ranges) > 0 {
		flags = wire.FlagMore
	}
	c.out = wire.Finish(m.Append(b), wire.OpReceiveLayers, flags, c.id, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return 0, 0, c.breakConn(err)
	}
	for i, r := range m.Ranges {
		if ready != nil {
			if err := ready(i); err != nil {
				c.breakConn(err)
				return 0, 0, err
			}
		}
		flags := wire.FlagMore
		if i == len(m.Ranges)-1 {
			flags = 0
		}
		if err := c.writeSummed(wire.OpReceiveLayers, flags, chunks[r.Key][r.From:r.To], sums, i); err != nil {
			return 0, 0, c.breakConn(err)
		}
	}
	_, body, err := c.readReply(wire.OpReceiveLayers)
	if err != nil {
		return 0, 0, err
	}
	// A request of no chunks is answered with the daemon's budget too.
	if len(body) != 4 && (len(m.Sizes) > 0 || len(body) != 12) {
		return 0, 0, c.breakConn(fmt.Errorf("RECEIVE_LAYERS reply of %d bytes", len(body)))
	}
	var budget int64
	if len(body) == 12 {
		budget = int64(binary.LittleEndian.Uint64(body[4:]))
	}
	return int(binary.LittleEndian.Uint32(body)), budget, nil
}

// ReceiveLayersBudget sends a RECEIVE_LAYERS of no chunks, which stores
// nothing, and returns the daemon's receive budget (pd_receive_bytes): a
// RECEIVE_LAYERS whose chunks are larger in all is refused at once. A
// daemon older than RECEIVE_LAYERS answers in a way IsUnknownOp
// recognizes; one that names no budget answers 0.
func (c *Client) ReceiveLayersBudget(ctx context.Context, transfer uint64) (int64, error) {
	probe := wire.ReceiveLayers{Receive: wire.Receive{Transfer: transfer, Keys: wire.Keys{Kind: wire.KindRaw}}}
	_, budget, err := c.receiveLayers(ctx, &probe, nil, nil, nil)
	return budget, err
}

// PushStore is Push of chunks of store lease lease, which this connection
// holds and is still filling: the daemon sends each layer of them as
// StoreLayer says it is final (the lease's chunks already cached go as
// they are), and the rest at the commit. A daemon older than this answers
// BAD_REQUEST (an unknown flag); push after the commit then.
func (c *Client) PushStore(ctx context.Context, id uint64, dest string, k wire.Keys, timeoutMS uint32, last bool, lease uint64) (int, error) {
	if lease == 0 {
		return 0, fmt.Errorf("kvtier client: PushStore without a store lease")
	}
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	m := wire.Push{Transfer: id, TimeoutMS: timeoutMS, Last: last, Dest: dest, Keys: k, StoreLease: lease}
	_, body, err := c.roundTrip(m.Append(b), wire.OpPush, 0)
	if err != nil {
		return 0, err
	}
	if len(body) != 4 {
		return 0, c.breakConn(fmt.Errorf("PUSH reply of %d bytes", len(body)))
	}
	return int(binary.LittleEndian.Uint32(body)), nil
}

// WaitInProgress is Wait that also counts chunks still arriving by
// RECEIVE_LAYERS, which PrepareRetrieveLayers can take before they are
// complete (LayerWait then follows their layers as they arrive). A daemon
// older than this refuses the frame's flag (IsUnknownOp).
func (c *Client) WaitInProgress(ctx context.Context, k wire.Keys, least, timeoutMS uint32) (wire.WaitReply, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.WaitReply{}, err
	}
	defer c.end()
	m := wire.Wait{TimeoutMS: timeoutMS, MinChunks: least, Keys: k}
	_, body, err := c.roundTrip(m.Append(b), wire.OpWait, wire.FlagInProgress)
	if err != nil {
		return wire.WaitReply{}, err
	}
	var r wire.WaitReply
	if err := r.Decode(body); err != nil {
		return r, c.breakConn(err)
	}
	return r, nil
}
