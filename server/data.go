package server

import (
	"context"
	"encoding/binary"
	"errors"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/wire"
)

// handleStore serves STORE: a metadata frame, then one data frame per
// chunk whose body is read straight into RAM the engine reserved. Chunks
// the arena cannot take are read and discarded so the stream stays in
// step; only the leading chunks that were fully received are committed.
func (s *session) handleStore(h wire.Header) *requestError {
	body, err := s.rd.Body(h)
	if err != nil {
		return bodyError(err)
	}
	m := &s.store
	if err := m.Decode(body); err != nil {
		return fatal(wire.StatusBadRequest, "%v", err) // the data frames that follow cannot be skipped safely
	}
	if (h.Flags&wire.FlagMore != 0) != (len(m.Sizes) > 0) {
		return fatal(wire.StatusBadRequest, "STORE of %d chunks with the more-frames flag %v", len(m.Sizes), h.Flags&wire.FlagMore != 0)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		if err := s.skipData(h, len(m.Sizes)); err != nil {
			return fatal(wire.StatusBadRequest, "%v", err)
		}
		return rerr
	}
	keys := r.keys[r.first:]
	if len(m.Sizes) > len(keys) {
		return fatal(wire.StatusBadRequest, "%d sizes for %d chunks", len(m.Sizes), len(keys))
	}
	s.noteBlocks(&r, m.Keys.Tokens, len(m.Sizes))
	eng := s.svc.eng
	w := &s.writes
	w.Begin(eng)
	if m.Keys.Kind != wire.KindRaw {
		// Tokens and engine hashes name a prompt's prefix chain: commit
		// it as a run, each chunk its predecessor's child, so that the
		// prefix-aware policies evict it from its tail. Raw keys may
		// be anything.
		if r.first > 0 {
			w.After(r.keys[r.first-1], true)
		} else {
			w.After(chunk.Key{}, false)
		}
	}
	stored, full := 0, false
	var quota error // a tenant's quota refused a chunk: the reply says so
	for j, size := range m.Sizes {
		dh, err := s.dataHeader(h, j == len(m.Sizes)-1)
		if err != nil {
			w.Abort()
			return fatal(wire.StatusBadRequest, "%v", err)
		}
		if dh.Len != size {
			w.Abort()
			return fatal(wire.StatusBadRequest, "data frame %d of %d bytes, announced %d", j, dh.Len, size)
		}
		s.armFrame(dh.Len)
		var dst []byte
		reserved := false
		if !full && !eng.InRAM(keys[j]) {
			dst, err = w.Reserve(keys[j], int(size))
			reserved, full = err == nil, err != nil
			if errors.Is(err, engine.ErrQuota) {
				quota = err
			}
		}
		if !reserved {
			if err := s.rd.Discard(dh.Len); err != nil {
				w.Abort()
				return fatal(wire.StatusBadRequest, "%v", frameErr(err))
			}
			if !full {
				stored++ // already cached
				w.Skip(keys[j])
			}
			continue
		}
		if err := s.rd.ReadData(dh, dst); err != nil {
			w.Abort()
			return fatal(wire.StatusBadRequest, "%v", frameErr(err))
		}
		stored++
	}
	if err := w.Commit(); err != nil {
		return statusOf(err)
	}
	if quota != nil {
		return fail(wire.StatusNoSpace, "stored %d of %d chunks: %v", stored, len(m.Sizes), quota)
	}
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(stored))
	return s.reply(h, 0)
}

// dataHeader reads the header of the next data frame of request h.
func (s *session) dataHeader(h wire.Header, last bool) (wire.Header, error) {
	s.armFrame(wire.HeaderSize) // the request's frames are due: no idle wait between them
	dh, err := s.rd.Header()
	if err != nil {
		return dh, frameErr(err)
	}
	if dh.Op != h.Op || dh.ID != h.ID || (dh.Flags&wire.FlagMore == 0) != last || dh.Flags&wire.FlagReply != 0 {
		return dh, errOutOfOrder
	}
	return dh, nil
}

var errOutOfOrder = errors.New("a data frame is out of order (wrong op, id or more-frames flag)")

// skipData discards the n data frames of a request that failed early.
func (s *session) skipData(h wire.Header, n int) error {
	for j := range n {
		dh, err := s.dataHeader(h, j == n-1)
		if err != nil {
			return err
		}
		s.armFrame(dh.Len)
		if err := s.rd.Discard(dh.Len); err != nil {
			return frameErr(err)
		}
	}
	return nil
}

// handleRetrieve serves RETRIEVE: a DataHeader with the sizes of the
// leading cached chunks, then each chunk's bytes written straight from the
// arena. The chunks are held only while they are being written.
func (s *session) handleRetrieve(h wire.Header, body []byte) *requestError {
	if err := s.keysOnly.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&s.keysOnly.Keys)
	if rerr != nil {
		return rerr
	}
	rd := &s.reads
	peer := h.Flags&wire.FlagPeer != 0
	var n int
	var err error
	if peer {
		n, err = s.svc.eng.AcquireLocal(context.Background(), r.keys[r.first:], rd)
	} else {
		n, err = s.svc.eng.Acquire(context.Background(), r.keys[r.first:], rd)
	}
	defer rd.Release()
	if err != nil && n == 0 {
		return statusOf(err)
	}
	if !peer {
		s.svc.pd.consumed(r.keys[r.first : r.first+n])
	}
	dh := wire.DataHeader{Tokens: r.tokensAfter(n), Sizes: s.sizes[:0]}
	for j := range n {
		dh.Sizes = append(dh.Sizes, uint32(rd.Size(j)))
	}
	s.sizes = dh.Sizes
	if peer {
		// Checksums of the very bytes about to be sent, held by this
		// request's references: the reader proves each chunk with them.
		ph := wire.PeerDataHeader{DataHeader: dh, Sums: s.sums[:0]}
		for j := range n {
			ph.Sums = append(ph.Sums, wire.Checksum(rd.Bytes(j)))
		}
		s.sums = ph.Sums
		s.out = ph.Append(wire.Begin(s.out))
	} else {
		s.out = dh.Append(wire.Begin(s.out))
	}
	flags := wire.Flags(0)
	if n > 0 {
		flags = wire.FlagMore
	}
	if rerr := s.reply(h, flags); rerr != nil {
		return rerr
	}
	for j := range n {
		flags := wire.FlagReply | wire.FlagMore
		if j == n-1 {
			flags = wire.FlagReply
		}
		data := rd.Bytes(j)
		wire.Header{Len: uint32(len(data)), Op: h.Op, Flags: flags, ID: h.ID}.Put(s.hdr[:])
		s.vec[0], s.vec[1] = s.hdr[:], data
		s.bufs = s.vec[:]
		s.extendWriteDeadline()
		if _, err := s.bufs.WriteTo(s.conn); err != nil {
			return writeFailed("writing chunk %d: %v", j, err)
		}
	}
	return nil
}

// handleSizes serves SIZES: the lengths of the leading cached chunks, read
// from whichever tier holds each, without promoting anything. A daemon
// using this one as its remote tier sizes its RAM reservation with it.
func (s *session) handleSizes(h wire.Header, body []byte) *requestError {
	if err := s.keysOnly.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&s.keysOnly.Keys)
	if rerr != nil {
		return rerr
	}
	dh := wire.DataHeader{Sizes: s.sizes[:0]}
	size := s.svc.eng.Size
	if h.Flags&wire.FlagPeer != 0 {
		size = s.svc.eng.SizeLocal
	}
	for _, k := range r.keys[r.first:] {
		n, ok := size(k)
		if !ok {
			break
		}
		dh.Sizes = append(dh.Sizes, uint32(n))
	}
	s.sizes = dh.Sizes
	dh.Tokens = r.tokensAfter(len(dh.Sizes))
	s.out = dh.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}
