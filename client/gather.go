package client

import "kvtier/wire"

// roundTripGather is roundTrip for a frame built in b and c.gather: the
// tokens c.gather holds are sent from where they lie, with the rest of
// the frame, in one writev (net.Buffers), so a LOOKUP of a long prompt
// costs the client no copy of its tokens.
func (c *Client) roundTripGather(b []byte, op wire.Op, flags wire.Flags) (wire.Header, []byte, error) {
	g := &c.gather
	if len(g.Tokens) == 0 {
		return c.roundTrip(b, op, flags)
	}
	wire.Header{Len: uint32(len(b) - wire.HeaderSize + g.Bytes()), Op: op, Flags: flags, ID: c.id, Status: wire.StatusOK}.Put(b)
	c.out = b
	c.gvec = c.gvec[:0]
	at := 0
	for i, cut := range g.Cuts {
		c.gvec = append(c.gvec, b[at:cut], g.Tokens[i])
		at = cut
	}
	c.gvec = append(c.gvec, b[at:])
	c.bufs = c.gvec
	_, err := c.bufs.WriteTo(c.conn)
	clear(c.gvec) // not kept past the call: they hold the caller's slices
	g.Reset()
	if err != nil {
		return wire.Header{}, nil, c.breakConn(err)
	}
	return c.readReply(op)
}
