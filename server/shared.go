package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvtier/wire"
)

// A request buffer (REQUEST_BUFFER) is memory a local connection shares
// with the daemon for the token ids of its lookups: the client writes a
// prompt there and names it by offset (wire.KindShared), so the tokens,
// most of a lookup's bytes, cross no socket and are copied by no one but
// the client. The daemon maps the buffer read-only and hashes the tokens
// from there, each chunk copied behind its parent's hash (lookup.go). The
// client may change them while the daemon reads:
// that can only make its own lookup's answer wrong. It cannot make the
// buffer shorter (it is sealed), so every read stays inside the mapping.

func (s *session) handleRequestBuffer(h wire.Header, body []byte) *requestError {
	if !s.local {
		return fail(wire.StatusUnsupported, "%s shares memory: it is for the local socket only", h.Op)
	}
	if !hostLittleEndian {
		return fail(wire.StatusUnsupported, "%s: this daemon's host is not little-endian, so it cannot read tokens in place", h.Op)
	}
	var m wire.RequestBuffer
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	if s.reqBuf != nil {
		return fail(wire.StatusBadRequest, "this connection has a request buffer already")
	}
	uc, ok := s.conn.(*net.UnixConn)
	if !ok {
		return fail(wire.StatusUnsupported, "%s on a connection that is not a Unix socket", h.Op)
	}
	page := os.Getpagesize()
	size := (int(m.Bytes) + page - 1) / page * page
	fd, mem, err := newRequestBuffer(size)
	if err != nil {
		return fail(wire.StatusInternal, "request buffer: %v", err)
	}
	defer unix.Close(fd) // the mapping, and the client's, keep the memory
	s.reqBuf = mem
	s.out = wire.Finish(binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(size)), h.Op, wire.FlagReply, h.ID, wire.StatusOK)
	s.extendWriteDeadline()
	if _, _, err := uc.WriteMsgUnix(s.out, unix.UnixRights(fd), nil); err != nil {
		return writeFailed("writing the reply: %v", err)
	}
	return nil
}

// newRequestBuffer makes a sealed memfd of size bytes and maps it
// read-only.
func newRequestBuffer(size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate("kvtier-requests", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(err error) (int, []byte, error) {
		unix.Close(fd)
		return -1, nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("ftruncate: %w", err))
	}
	// Without F_SEAL_SHRINK a client could cut the file under the
	// daemon's mapping, and the daemon's next read would be a SIGBUS.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail(fmt.Errorf("sealing: %w", err))
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("mmap: %w", err))
	}
	return fd, mem, nil
}

// releaseRequestBuffer unmaps the connection's request buffer.
func (s *session) releaseRequestBuffer() {
	if s.reqBuf != nil {
		unix.Munmap(s.reqBuf)
		s.reqBuf = nil
	}
}

// hostLittleEndian: the protocol's tokens are little-endian, so only such
// a host can read them in place.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

var errNoRequestBuffer = errors.New("keys in the request buffer, but this connection has none (REQUEST_BUFFER)")

// sharedTokens returns the tokens k names in the request buffer, in
// place: a view of the daemon's read-only mapping, valid until the
// connection closes, which must never be written to nor decoded into.
func (s *session) sharedTokens(k *wire.SharedTokens) ([]uint32, *requestError) {
	if s.reqBuf == nil {
		return nil, fail(wire.StatusBadRequest, "%v", errNoRequestBuffer)
	}
	end := k.Offset + 4*uint64(k.Count)
	if k.Offset%4 != 0 || end > uint64(len(s.reqBuf)) {
		return nil, fail(wire.StatusBadRequest, "%d tokens at byte %d of a %d-byte request buffer", k.Count, k.Offset, len(s.reqBuf))
	}
	if k.Count == 0 {
		return nil, nil
	}
	// The mapping is page-aligned and the offset a multiple of 4; tokens
	// are little-endian on the wire, as on every host engines run on.
	return unsafe.Slice((*uint32)(unsafe.Pointer(&s.reqBuf[k.Offset])), k.Count), nil
}
