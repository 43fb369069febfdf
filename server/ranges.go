package server

import (
	"context"
	"time"

	"kvtier/engine"
	"kvtier/wire"
)

// handleRetrieveRanges serves RETRIEVE_RANGES: the DataHeader of the
// leading cached chunks, a checksum per range served, then each range's
// bytes. RAM chunks are sent from the arena by reference; chunks held
// only on a lower tier that reads ranges (the disk) are not promoted:
// their ranges are read from that tier, piece checksums verified, into
// scratch buffers (engine.RangeReads). With the PEER flag only RAM and
// node-local tiers answer, as for RETRIEVE. The chunks are held only
// while their ranges are being written.
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
	rd := &s.rreads
	peer := h.Flags&wire.FlagPeer != 0
	ctx := context.Background()
	n, err := s.svc.eng.AcquireRanges(ctx, keys, peer, rd)
	defer rd.Release()
	if err != nil && n == 0 {
		return statusOf(err)
	}
	served := m.Ranges[:wire.Served(m.Ranges, n)]
	if rerr := checkRanges(served, rd, n); rerr != nil {
		return rerr
	}
	n, served = s.readRanges(ctx, rd, n, served)
	rh := wire.RangeDataHeader{DataHeader: wire.DataHeader{Tokens: r.tokensAfter(n), Sizes: s.sizes[:0]}, Sums: s.sums[:0]}
	for j := range n {
		rh.Sizes = append(rh.Sizes, uint32(rd.Size(j)))
	}
	for _, data := range s.rdata {
		// The checksum of the very bytes about to be sent, held by this
		// request: the reader proves each range with it.
		rh.Sums = append(rh.Sums, wire.Checksum(data))
	}
	s.sizes, s.sums = rh.Sizes, rh.Sums
	if !peer {
		s.svc.pd.consumed(keys[:n])
	}
	if rd.Scratch() {
		s.capWrites(served)
		defer s.uncapWrites()
	}
	s.out = rh.Append(wire.Begin(s.out))
	flags := wire.Flags(0)
	if len(served) > 0 {
		flags = wire.FlagMore
	}
	if rerr := s.reply(h, flags); rerr != nil {
		return rerr
	}
	for i, data := range s.rdata {
		flags := wire.FlagReply | wire.FlagMore
		if i == len(served)-1 {
			flags = wire.FlagReply
		}
		wire.Header{Len: uint32(len(data)), Op: h.Op, Flags: flags, ID: h.ID}.Put(s.hdr[:])
		s.vec[0], s.vec[1] = s.hdr[:], data
		s.bufs = s.vec[:]
		s.extendWriteDeadline()
		if _, err := s.bufs.WriteTo(s.conn); err != nil {
			return writeFailed("writing range %d: %v", i, err)
		}
	}
	return nil
}

// rangeWriteRate is the rate below which a reply holding a scratch buffer
// is cut off (with RangeWriteTimeout on top).
const rangeWriteRate = 64 << 20 // bytes per second

// capWrites gives the reply of the served ranges one write deadline,
// which no frame of it pushes back: the engine's scratch memory is
// bounded (engine.RangeScratchBytes), and a reader that stops reading
// would otherwise hold some for WriteTimeout per frame, up to 65,536 frames,
// sending the requests of every other reader of a disk chunk to whole
// promotions meanwhile. Past the deadline the write fails, the
// connection closes with nothing more written to it (no error frame:
// writeFailed) and the memory is released.
func (s *session) capWrites(served []wire.ByteRange) {
	var total int64
	for _, br := range served {
		total += int64(br.To - br.From)
	}
	d := s.svc.opts.RangeWriteTimeout + time.Duration(total/(rangeWriteRate/1000))*time.Millisecond
	s.writeDeadline = time.Now().Add(d)
	s.conn.SetWriteDeadline(s.writeDeadline)
	s.writeCapped = true
}

// uncapWrites lets the next reply set its own deadline.
func (s *session) uncapWrites() {
	s.writeCapped = false
	s.writeDeadline = time.Time{}
}

// checkRanges refuses a range past the end of its chunk, and ranges that
// add up to more than the n chunks hold.
func checkRanges(served []wire.ByteRange, rd *engine.RangeReads, n int) *requestError {
	var held, asked int // bytes of the served chunks, and of the ranges asked of them
	for j := range n {
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
	}
	return nil
}

// readRanges gathers the bytes of the served ranges into s.rdata. A range
// of a lower-tier chunk that cannot be read (a damaged piece, which the
// tier drops; the tier failing) ends the prefix before that chunk, as a
// miss would: it returns the shorter chunk count and ranges.
func (s *session) readRanges(ctx context.Context, rd *engine.RangeReads, n int, served []wire.ByteRange) (int, []wire.ByteRange) {
	s.rdata = s.rdata[:0]
	for _, br := range served {
		data, err := rd.Range(ctx, int(br.Key), int(br.From), int(br.To))
		if err != nil {
			n = int(br.Key)
			served = served[:wire.Served(served, n)]
			s.rdata = s.rdata[:len(served)]
			break
		}
		s.rdata = append(s.rdata, data)
	}
	return n, served
}
