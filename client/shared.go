package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvtier/wire"
)

// mapRequestBuffer asks the daemon for a request buffer of n bytes
// (REQUEST_BUFFER) and maps the memfd its reply carries.
func (c *Client) mapRequestBuffer(ctx context.Context, n int) error {
	if n < wire.MinRequestBuffer || n > wire.MaxRequestBuffer {
		return fmt.Errorf("kvtier client: a request buffer of %d bytes; %d to %d are allowed", n, wire.MinRequestBuffer, wire.MaxRequestBuffer)
	}
	if !hostLittleEndian {
		return errors.New("kvtier client: a request buffer holds little-endian tokens; this host is not little-endian")
	}
	b, err := c.begin(ctx)
	if err != nil {
		return err
	}
	defer c.end()
	m := wire.RequestBuffer{Bytes: uint32(n)}
	c.out = wire.Finish(m.Append(b), wire.OpRequestBuffer, 0, c.id, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return c.breakConn(err)
	}
	fd, err := c.readFd()
	if err != nil {
		return c.breakConn(err)
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	_, body, err := c.readReply(wire.OpRequestBuffer)
	if err != nil {
		return err
	}
	if len(body) != 4 || fd < 0 {
		return c.breakConn(fmt.Errorf("REQUEST_BUFFER reply of %d bytes, fd %d", len(body), fd))
	}
	size := int(binary.LittleEndian.Uint32(body))
	if size < n || size > wire.MaxRequestBuffer+(64<<10) {
		return c.breakConn(fmt.Errorf("REQUEST_BUFFER granted %d bytes for %d asked", size, n))
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("kvtier client: mapping the request buffer: %w", err)
	}
	c.reqBuf = mem
	c.reqTokens = unsafe.Slice((*uint32)(unsafe.Pointer(&mem[0])), size/4)
	return nil
}

var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// shareTokens moves the token ids of k into the request buffer from token
// index at, when there is a buffer and they fit, and makes k name them
// there (wire.KindShared); it returns the index after them, or at if k
// stays as it is. The caller holds c.mu: no other request can overwrite
// the buffer before the daemon has read it, which it has once it replies.
func (c *Client) shareTokens(k *wire.Keys, at int) int {
	if c.reqTokens == nil || k.Kind != wire.KindTokens || len(k.Tokens) > len(c.reqTokens)-at {
		return at
	}
	n := copy(c.reqTokens[at:], k.Tokens)
	*k = wire.Keys{Scope: k.Scope, Kind: wire.KindShared, Skip: k.Skip,
		Shared: wire.SharedTokens{Offset: 4 * uint64(at), Count: uint32(n)}}
	return at + n
}

// SharesTokens reports whether the connection has a request buffer
// (Options.RequestBuffer).
func (c *Client) SharesTokens() bool { return c.reqBuf != nil }
