package server

import (
	"context"

	"kvtier/wire"
)

// handleRetrieveRanges serves RETRIEVE_RANGES: the DataHeader of the
// leading cached chunks, a checksum per range served, then each range's
// bytes written straight from the arena (RAM by reference). With the PEER
// flag only RAM and node-local tiers answer, as for RETRIEVE. The chunks
// are held only while their ranges are being written.
func (s *session) handleRetrieveRanges(h wire.Header, body []byte) *requestError {
	m := &s.ranges
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	keys := r.keys[r.first:]
	if k := len(m.Ranges); k > 0 && int(m.Ranges[k-1].Key) >= len(keys) {
		return fail(wire.StatusBadRequest, "range of key %d, %d keys after the skip", m.Ranges[k-1].Key, len(keys))
	}
	rd := &s.reads
	peer := h.Flags&wire.FlagPeer != 0
	var n int
	var err error
	if peer {
		n, err = s.svc.eng.AcquireLocal(context.Background(), keys, rd)
	} else {
		n, err = s.svc.eng.Acquire(context.Background(), keys, rd)
	}
	defer rd.Release()
	if err != nil && n == 0 {
		return statusOf(err)
	}
	served := m.Ranges[:wire.Served(m.Ranges, n)]
	rh := wire.RangeDataHeader{DataHeader: wire.DataHeader{Tokens: r.tokensAfter(n), Sizes: s.sizes[:0]}, Sums: s.sums[:0]}
	var held, asked int // bytes of the served chunks, and of the ranges asked of them
	for j := range n {
		rh.Sizes = append(rh.Sizes, uint32(rd.Size(j)))
		held += rd.Size(j)
	}
	for i, br := range served {
		if int(br.To) > rd.Size(int(br.Key)) {
			return fail(wire.StatusBadRequest, "range %d: bytes [%d, %d) of a %d-byte chunk", i, br.From, br.To, rd.Size(int(br.Key)))
		}
		// Ranges may overlap, but never add up to more than the chunks
		// hold: a small frame must not ask for gigabytes of the same bytes.
		if asked += int(br.To - br.From); asked > held {
			return fail(wire.StatusBadRequest, "ranges of %d bytes or more from chunks of %d bytes", asked, held)
		}
		// The checksum of the very bytes about to be sent, held by this
		// request's references: the reader proves each range with it.
		rh.Sums = append(rh.Sums, wire.Checksum(rd.Bytes(int(br.Key))[br.From:br.To]))
	}
	s.sizes, s.sums = rh.Sizes, rh.Sums
	if !peer {
		s.svc.pd.consumed(keys[:n])
	}
	s.out = rh.Append(wire.Begin(s.out))
	flags := wire.Flags(0)
	if len(served) > 0 {
		flags = wire.FlagMore
	}
	if rerr := s.reply(h, flags); rerr != nil {
		return rerr
	}
	for i, br := range served {
		flags := wire.FlagReply | wire.FlagMore
		if i == len(served)-1 {
			flags = wire.FlagReply
		}
		data := rd.Bytes(int(br.Key))[br.From:br.To]
		wire.Header{Len: uint32(len(data)), Op: h.Op, Flags: flags, ID: h.ID}.Put(s.hdr[:])
		s.vec[0], s.vec[1] = s.hdr[:], data
		s.bufs = s.vec[:]
		s.extendWriteDeadline()
		if _, err := s.bufs.WriteTo(s.conn); err != nil {
			return fatal(wire.StatusInternal, "writing range %d: %v", i, err)
		}
	}
	return nil
}
