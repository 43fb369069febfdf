package ingest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// MaxFrameBytes bounds one ZMTP frame a peer may send us. zmq4 allocates a
// frame's body at the size the peer announces before reading it, so an
// unchecked 64-bit size from a wrong or hostile endpoint would end the
// process with a fatal out-of-memory error. vLLM's event batches are far
// smaller than this.
const MaxFrameBytes = 64 << 20

// Guarded transports: the same as zmq4's tcp and ipc, but every inbound
// byte passes through a frameGuard that refuses oversized frames before
// zmq4 sees their header. Endpoints are rewritten to them by guarded().
const (
	guardedTCP = "kvtier+tcp"
	guardedIPC = "kvtier+ipc"
)

var registerGuards = sync.OnceValue(func() error {
	for name, network := range map[string]string{guardedTCP: "tcp", guardedIPC: "unix"} {
		if err := zmq4.RegisterTransport(name, guardTransport{network: network, inner: transport.New(network)}); err != nil {
			return fmt.Errorf("ingest: registering transport %s: %w", name, err)
		}
	}
	return nil
})

// guarded rewrites a tcp:// or ipc:// endpoint to its guarded transport.
func guarded(endpoint string) (string, error) {
	if err := registerGuards(); err != nil {
		return "", err
	}
	switch {
	case strings.HasPrefix(endpoint, "tcp://"):
		return guardedTCP + endpoint[len("tcp"):], nil
	case strings.HasPrefix(endpoint, "ipc://"):
		return guardedIPC + endpoint[len("ipc"):], nil
	}
	return "", fmt.Errorf("%w: endpoint %q: want tcp:// or ipc://", ErrConfig, endpoint)
}

// guardTransport dials like zmq4's own transport and wraps the connection.
type guardTransport struct {
	network string
	inner   transport.Transport
}

func (g guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, g.network, addr)
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, guard: frameGuard{greetingLeft: zmtpGreetingBytes, limit: MaxFrameBytes}}, nil
}

func (g guardTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, fmt.Errorf("ingest: guarded transports only dial")
}

func (g guardTransport) Addr(ep string) (string, error) { return g.inner.Addr(ep) }

// guardConn checks what the peer sends before handing it to zmq4.
type guardConn struct {
	net.Conn
	guard frameGuard
}

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if gerr := c.guard.feed(p[:n]); gerr != nil {
		c.Conn.Close()
		return 0, gerr
	}
	return n, err
}

// zmtpGreetingBytes is the size of the ZMTP 3 greeting that precedes the
// frames.
const zmtpGreetingBytes = 64

// frameGuard follows the ZMTP 3 framing of a byte stream (greeting, then
// frames of flags byte, 1- or 8-byte size, body) and rejects any frame
// larger than limit, commands included.
type frameGuard struct {
	greetingLeft int
	limit        uint64

	inSize    bool   // reading a size field
	sizeBytes int    // bytes of the size field still to read
	size      uint64 // size read so far
	bodyLeft  uint64 // body bytes still to pass
}

const zmtpLongFrame = 0x02 // flags bit: the size field is 8 bytes

func (g *frameGuard) feed(b []byte) error {
	for len(b) > 0 {
		switch {
		case g.greetingLeft > 0:
			n := min(len(b), g.greetingLeft)
			g.greetingLeft -= n
			b = b[n:]
		case g.bodyLeft > 0:
			n := min(uint64(len(b)), g.bodyLeft)
			g.bodyLeft -= n
			b = b[n:]
		case !g.inSize: // flags byte
			g.inSize, g.sizeBytes, g.size = true, 1, 0
			if b[0]&zmtpLongFrame != 0 {
				g.sizeBytes = 8
			}
			b = b[1:]
		default: // size field, possibly split across reads
			n := min(len(b), g.sizeBytes)
			for _, x := range b[:n] {
				g.size = g.size<<8 | uint64(x)
			}
			g.sizeBytes -= n
			b = b[n:]
			if g.sizeBytes == 0 {
				if g.size > g.limit {
					return fmt.Errorf("ingest: peer announced a %d-byte ZMTP frame, more than the %d allowed", g.size, g.limit)
				}
				g.inSize, g.bodyLeft = false, g.size
			}
		}
	}
	return nil
}
