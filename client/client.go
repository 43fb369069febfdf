// Package client is the Go client of kvtier's cache protocol (package
// wire, docs/protocol.md). DialUnix connects to the node daemon's local
// socket and maps its arena, so chunk bytes are written and read in place;
// DialTCP connects over the network, where chunk bytes travel in frames.
//
// A Client runs one request at a time; use one Client per goroutine (or a
// pool) for parallelism. Leases handed out by PrepareStore,
// PrepareRetrieve and Lookup belong to the connection: closing it releases
// them all.
package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/wire"
)

// Options configure a connection.
type Options struct {
	Token   string        // the daemon's TCP token, if it has one
	TLS     *tls.Config   // TCP over TLS when not nil
	Name    string        // reported to the daemon, for its logs
	Timeout time.Duration // per request when the context has no deadline (default 30 s)
	// Populate maps the shared arena with MAP_POPULATE: connecting takes
	// longer (the page tables of the whole arena are filled), but the first
	// write into each slot does not page-fault. For long-lived connectors.
	Populate bool
	// RequestBuffer, on the local socket, asks the daemon for a request
	// buffer of this many bytes (wire.MinRequestBuffer to
	// wire.MaxRequestBuffer; 0: none): shared memory where Lookup and
	// LookupBatch leave a prompt's token ids instead of sending them
	// through the socket (wire.KindShared). 4 bytes hold a token.
	RequestBuffer int
	// Peer marks the client as another daemon's P2P tier (wire.FlagPeer):
	// LOOKUP, SIZES and RETRIEVE are answered from the daemon's RAM and
	// node-local tiers only, and Retrieve checks every chunk against the
	// checksum the daemon sends with it.
	Peer bool
}

// ErrChecksum is returned by a peer client's Retrieve when a chunk's bytes
// do not match the checksum the daemon sent: the chunks before it are good,
// the connection is closed.
var ErrChecksum = errors.New("kvtier client: chunk checksum mismatch")

// StatusError is a request the daemon refused.
type StatusError struct {
	Op      wire.Op
	Status  wire.Status
	Message string
	// Header is set when the daemon refused the request's frame header
	// itself, which its reply shows by naming another operation: a daemon
	// that does not know Op replies BAD_REQUEST on op PING and closes the
	// connection (the client is closed too then).
	Header bool
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kvtier %s: %s: %s", e.Op, e.Status, e.Message)
}

// IsStatus reports whether err is a StatusError with status st.
func IsStatus(err error, st wire.Status) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == st
}

// IsUnknownOp reports whether err says the daemon does not know the
// request's operation: it answered UNKNOWN_OP, or, built before the
// operation existed, refused the frame's header (StatusError.Header).
// Such a daemon answers the same way every time.
func IsUnknownOp(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.Status == wire.StatusUnknownOp || se.Header)
}

// ErrClosed is returned by calls on a closed client, or after a transport
// failure closed it: the stream's position is unknown then, so the
// connection cannot be reused. Dial again.
var ErrClosed = errors.New("kvtier client: connection closed")

// Client is one connection to a daemon.
type Client struct {
	opts  Options
	conn  net.Conn
	rd    *wire.Reader
	hello wire.HelloReply
	arena []byte // the shared arena, local connections only
	// reqBuf is the request buffer (Options.RequestBuffer) and reqTokens
	// the same memory as token ids; nil without one.
	reqBuf    []byte
	reqTokens []uint32

	mu          sync.Mutex
	setDeadline time.Time // deadline on conn when set by deadline() without a ctx deadline
	out         []byte
	id          uint32
	broken      error
	hdr         [wire.HeaderSize]byte
	vec         [2][]byte
	bufs        net.Buffers  // over vec; a field, so that WriteTo's pointer does not make it escape per call
	gather      wire.Gather  // a lookup's tokens, sent from the caller's slices (gather.go)
	gvec        [][]byte     // the pieces of a gathered frame
	hasher      *xxh3.Hasher // checksums of RECEIVE data frames, made on first use

	sizes       []uint32 // Store's chunk sizes, reused
	lookupReply wire.LookupReply
	shared      []wire.Lookup // a batch's lookups, rewritten to name the request buffer
	batchReply  wire.LookupBatchReply
	slots       wire.Slots
	dataHeader  wire.DataHeader
	peerHeader  wire.PeerDataHeader
	rangeReq    wire.RetrieveRanges
	rangeHeader wire.RangeDataHeader
}

// DialUnix connects to the daemon's local socket at path and maps the
// arena it shares.
func DialUnix(ctx context.Context, path string, o Options) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: %w", err)
	}
	c := newClient(conn, o)
	err = c.handshake(ctx, true)
	if err == nil && o.RequestBuffer > 0 {
		err = c.mapRequestBuffer(ctx, o.RequestBuffer)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// DialTCP connects to the daemon's TCP listener at addr.
func DialTCP(ctx context.Context, addr string, o Options) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kvtier client: %w", err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if o.TLS != nil {
		tconn := tls.Client(conn, o.TLS)
		if err := tconn.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("kvtier client: TLS: %w", err)
		}
		conn = tconn
	}
	c := newClient(conn, o)
	// The handshake applies ctx's deadline only; closing the connection
	// makes it honour cancellation too.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	err = c.handshake(ctx, false)
	if !stop() {
		err = fmt.Errorf("kvtier client: handshake: %w", ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func newClient(conn net.Conn, o Options) *Client {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	return &Client{opts: o, conn: conn, rd: wire.NewReader(bufio.NewReaderSize(conn, 64<<10))}
}

// peerFlag is the flag of a keyed read: FlagPeer on a peer client.
func (c *Client) peerFlag() wire.Flags {
	if c.opts.Peer {
		return wire.FlagPeer
	}
	return 0
}

func (c *Client) handshake(ctx context.Context, local bool) error {
	c.deadline(ctx)
	hello := wire.Hello{Version: wire.Version, Token: c.opts.Token, Name: c.opts.Name}
	c.out = wire.Finish(hello.Append(wire.Begin(c.out)), wire.OpHello, 0, 0, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return fmt.Errorf("kvtier client: sending HELLO: %w", err)
	}
	var fd = -1
	if local {
		var err error
		if fd, err = c.readFd(); err != nil {
			return err
		}
	}
	h, body, err := c.rd.Next()
	if err == nil {
		err = replyError(h, wire.OpHello, 0, body)
	}
	if err == nil {
		err = c.hello.Decode(body)
	}
	if err == nil && local && c.hello.HasArena && fd < 0 {
		err = errors.New("the daemon did not share its arena")
	}
	// A tenant's local connection gets no arena (docs/security.md):
	// Local() is false and the client copies, as over TCP.
	if err == nil && fd >= 0 {
		flags := unix.MAP_SHARED
		if c.opts.Populate {
			flags |= unix.MAP_POPULATE
		}
		c.arena, err = unix.Mmap(fd, 0, int(c.hello.ArenaBytes), unix.PROT_READ|unix.PROT_WRITE, flags)
	}
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		return fmt.Errorf("kvtier client: handshake: %w", err)
	}
	return nil
}

// readFd peeks the first byte of a reply with recvmsg, which is where the
// daemon attaches a memfd (the arena's to HELLO's reply, a request
// buffer's to REQUEST_BUFFER's), and returns the fd (-1 when none came,
// as in an error reply). The byte itself is left for the frame reader by
// reading it with MSG_PEEK; nothing else may be buffered yet.
func (c *Client) readFd() (int, error) {
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		return -1, errors.New("kvtier client: not a Unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var opErr error
	oob := make([]byte, unix.CmsgSpace(4))
	var b [1]byte
	err = raw.Read(func(s uintptr) bool {
		_, oobn, _, _, rerr := unix.Recvmsg(int(s), b[:], oob, unix.MSG_PEEK|unix.MSG_CMSG_CLOEXEC)
		if rerr == unix.EAGAIN {
			return false
		}
		if rerr != nil {
			opErr = rerr
			return true
		}
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil && len(msgs) > 0 {
			if fds, ferr := unix.ParseUnixRights(&msgs[0]); ferr == nil && len(fds) > 0 {
				fd = fds[0]
				for _, extra := range fds[1:] {
					unix.Close(extra)
				}
			}
		}
		return true
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return -1, fmt.Errorf("kvtier client: reading a reply's file descriptor: %w", err)
	}
	return fd, nil
}

// Close closes the connection (releasing its leases on the daemon) and
// unmaps the arena. Slices returned by Slot are invalid afterwards.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = ErrClosed
	}
	err := c.conn.Close()
	if c.arena != nil {
		unix.Munmap(c.arena)
		c.arena = nil
	}
	if c.reqBuf != nil {
		unix.Munmap(c.reqBuf)
		c.reqBuf = nil
	}
	return err
}

// Interrupt closes the connection under a request in progress, which
// then fails; the client is of no further use but to Close. Unlike Close
// it does not wait for the request, so another goroutine may call it to
// end a call that ignores its context's cancellation (calls apply only
// the context's deadline).
func (c *Client) Interrupt() { c.conn.Close() }

// ChunkTokens is the daemon's chunk size in tokens.
func (c *Client) ChunkTokens() int { return int(c.hello.ChunkTokens) }

// Local reports whether the connection shares the daemon's arena.
func (c *Client) Local() bool { return c.arena != nil }

// Slot returns the arena bytes of a slot from PrepareStore or
// PrepareRetrieve, to write or read in place. It fails on a TCP
// connection, or if the daemon handed out a slot outside the arena.
func (c *Client) Slot(s wire.Slot) ([]byte, error) {
	end := s.Offset + uint64(s.Len)
	if c.arena == nil || end < s.Offset || end > uint64(len(c.arena)) {
		return nil, fmt.Errorf("kvtier client: slot [%d, +%d) is not in the shared arena of %d bytes", s.Offset, s.Len, len(c.arena))
	}
	return c.arena[s.Offset:end:end], nil
}

// deadline applies ctx's deadline to the connection or, without one,
// keeps a deadline of about Options.Timeout ahead, moving it only once
// half of it has passed (re-arming it on every small request costs more
// than the request).
func (c *Client) deadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok {
		c.conn.SetDeadline(d)
		c.setDeadline = time.Time{} // forget: the next call sets its own
		return
	}
	now := time.Now()
	if c.setDeadline.Sub(now) > c.opts.Timeout/2 {
		return
	}
	c.setDeadline = now.Add(c.opts.Timeout)
	c.conn.SetDeadline(c.setDeadline)
}

// replyError checks that a reply answers (op, id) and turns a non-OK
// status into a StatusError.
func replyError(h wire.Header, op wire.Op, id uint32, body []byte) error {
	if h.Status != wire.StatusOK {
		return &StatusError{Op: op, Status: h.Status, Message: string(body)}
	}
	if h.Op != op || h.ID != id || h.Flags&wire.FlagReply == 0 {
		return fmt.Errorf("%w: reply %s #%d to request %s #%d", wire.ErrFrame, h.Op, h.ID, op, id)
	}
	return nil
}

// begin starts a request: it takes the lock and returns the frame buffer.
// Every begin is paired with end.
func (c *Client) begin(ctx context.Context) ([]byte, error) {
	c.mu.Lock()
	if c.broken != nil {
		c.mu.Unlock()
		return nil, c.broken
	}
	c.deadline(ctx)
	c.id++
	return wire.Begin(c.out), nil
}

func (c *Client) end() { c.mu.Unlock() }

// roundTrip sends the request built in b and reads its one-frame reply.
// A transport failure breaks the connection for good.
func (c *Client) roundTrip(b []byte, op wire.Op, flags wire.Flags) (wire.Header, []byte, error) {
	c.out = wire.Finish(b, op, flags, c.id, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return wire.Header{}, nil, c.breakConn(err)
	}
	return c.readReply(op)
}

func (c *Client) readReply(op wire.Op) (wire.Header, []byte, error) {
	return c.readReplyTo(op, c.id)
}

// readReplyTo reads the reply to request id, which a pipelined caller
// sent before later ones (pipeline.go).
func (c *Client) readReplyTo(op wire.Op, id uint32) (wire.Header, []byte, error) {
	h, body, err := c.rd.Next()
	if err != nil {
		return h, nil, c.breakConn(err)
	}
	if err := replyError(h, op, id, body); err != nil {
		var se *StatusError
		if !errors.As(err, &se) {
			return h, nil, c.breakConn(err)
		}
		if h.Op != op {
			// The daemon could not parse the request's header and has
			// closed the connection after this reply.
			se.Header = true
			return h, nil, fmt.Errorf("%w: %w", c.breakConn(err), se)
		}
		return h, nil, err
	}
	return h, body, nil
}

func (c *Client) breakConn(err error) error {
	c.broken = fmt.Errorf("%w: %v", ErrClosed, err)
	c.conn.Close()
	return c.broken
}

// Ping round-trips an empty frame.
func (c *Client) Ping(ctx context.Context) error {
	b, err := c.begin(ctx)
	if err != nil {
		return err
	}
	defer c.end()
	_, _, err = c.roundTrip(b, wire.OpPing, 0)
	return err
}

// Scope registers s on the connection and returns its handle for Keys.
func (c *Client) Scope(ctx context.Context, s chunk.Scope) (uint32, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	m := wire.Scope{WorldSize: uint32(s.WorldSize), Rank: uint32(s.Rank), Model: s.Model, Format: s.Format, Namespace: s.Namespace}
	_, body, err := c.roundTrip(m.Append(b), wire.OpScope, 0)
	if err != nil {
		return 0, err
	}
	if len(body) != 4 {
		return 0, c.breakConn(fmt.Errorf("SCOPE reply of %d bytes", len(body)))
	}
	return binary.LittleEndian.Uint32(body), nil
}

// Tokens names a prompt's chunks by its token ids under a registered
// scope; skip leading tokens (a multiple of the chunk size) are not
// stored or retrieved.
func Tokens(scope uint32, tokens []uint32, skip int) wire.Keys {
	return wire.Keys{Scope: scope, Kind: wire.KindTokens, Tokens: tokens, Skip: uint32(skip)}
}

// Hashes names chunks by engine-computed hashes under a registered scope.
func Hashes(scope uint32, hashes []chunk.Hash) wire.Keys {
	return wire.Keys{Scope: scope, Kind: wire.KindHashes, Hashes: hashes}
}

// Raw names chunks by whole chunk keys.
func Raw(keys []chunk.Key) wire.Keys { return wire.Keys{Kind: wire.KindRaw, Raw: keys} }

// Lookup returns the cached prefix of keys. With leaseMS > 0 the hit is
// kept resident under the returned lease (Release it, or let it expire).
// The reply's slices are valid until the next call.
func (c *Client) Lookup(ctx context.Context, k wire.Keys, leaseMS uint32) (wire.LookupReply, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.LookupReply{}, err
	}
	defer c.end()
	m := wire.Lookup{LeaseMS: leaseMS, Keys: k}
	c.shareTokens(&m.Keys, 0)
	c.gather.Reset()
	_, body, err := c.roundTripGather(m.AppendGather(b, &c.gather), wire.OpLookup, c.peerFlag())
	if err == nil {
		if err = c.lookupReply.Decode(body); err != nil {
			err = c.breakConn(err)
		}
	}
	return c.lookupReply, err
}

// PrepareStore reserves arena slots for chunks of the given sizes. Write
// each SlotWrite slot's bytes (Slot), then CommitStore. Fewer slots than
// sizes means the arena could take only that many. The reply's slices are
// valid until the next call.
func (c *Client) PrepareStore(ctx context.Context, k wire.Keys, sizes []uint32, leaseMS uint32) (wire.Slots, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.Slots{}, err
	}
	defer c.end()
	m := wire.PrepareStore{LeaseMS: leaseMS, Keys: k, Sizes: sizes}
	return c.slotsReply(m.Append(b), wire.OpPrepareStore)
}

// PrepareRetrieve promotes the keys' chunks into RAM and leases the
// leading cached ones; read them in place (Slot), then Release.
func (c *Client) PrepareRetrieve(ctx context.Context, k wire.Keys, leaseMS uint32) (wire.Slots, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return wire.Slots{}, err
	}
	defer c.end()
	m := wire.PrepareRetrieve{LeaseMS: leaseMS, Keys: k}
	return c.slotsReply(m.Append(b), wire.OpPrepareRetrieve)
}

func (c *Client) slotsReply(b []byte, op wire.Op) (wire.Slots, error) {
	_, body, err := c.roundTrip(b, op, 0)
	if err == nil {
		if err = c.slots.Decode(body); err != nil {
			err = c.breakConn(err)
		}
	}
	return c.slots, err
}

// CommitStore makes the first count slots of a PrepareStore lease visible
// and ends the lease; it returns how many chunks are now stored.
func (c *Client) CommitStore(ctx context.Context, lease uint64, count int) (int, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	m := wire.Commit{Lease: lease, Count: uint32(count)}
	_, body, err := c.roundTrip(m.Append(b), wire.OpCommitStore, 0)
	if err != nil {
		return 0, err
	}
	if len(body) != 4 {
		return 0, c.breakConn(fmt.Errorf("COMMIT_STORE reply of %d bytes", len(body)))
	}
	return int(binary.LittleEndian.Uint32(body)), nil
}

// Release ends a lease (an uncommitted store's slots are dropped unseen).
func (c *Client) Release(ctx context.Context, lease uint64) error {
	return c.leaseOp(ctx, wire.OpRelease, wire.Lease{ID: lease})
}

// Renew extends a lease to ms milliseconds from now.
func (c *Client) Renew(ctx context.Context, lease uint64, ms uint32) error {
	return c.leaseOp(ctx, wire.OpRenew, wire.Lease{ID: lease, MS: ms})
}

func (c *Client) leaseOp(ctx context.Context, op wire.Op, m wire.Lease) error {
	b, err := c.begin(ctx)
	if err != nil {
		return err
	}
	defer c.end()
	_, _, err = c.roundTrip(m.Append(b, op == wire.OpRenew), op, 0)
	return err
}

// Prefetch asks the daemon to promote the keys' chunks into RAM in the
// background; it reports whether the request was queued.
func (c *Client) Prefetch(ctx context.Context, k wire.Keys) (bool, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return false, err
	}
	defer c.end()
	m := wire.KeysOnly{Keys: k}
	_, body, err := c.roundTrip(m.Append(b), wire.OpPrefetch, 0)
	if err != nil {
		return false, err
	}
	return len(body) == 1 && body[0] == 1, nil
}

// Clear drops the RAM chunks of a registered scope (every scope for 0)
// and returns how many it dropped.
func (c *Client) Clear(ctx context.Context, scope uint32) (uint64, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	_, body, err := c.roundTrip(binary.LittleEndian.AppendUint32(b, scope), wire.OpClear, 0)
	if err != nil {
		return 0, err
	}
	if len(body) != 8 {
		return 0, c.breakConn(fmt.Errorf("CLEAR reply of %d bytes", len(body)))
	}
	return binary.LittleEndian.Uint64(body), nil
}

// defaultFlushWait is how long the daemon waits on a FLUSH that names no
// bound (engine.DefaultFlushWait).
const defaultFlushWait = time.Minute

// Flush returns once every chunk stored before it, by any client, is in
// each of the daemon's tiers below RAM — the disk tier, whose writes are
// durable when they complete, and remote tiers — or reports per tier what
// is not; reply.Durable says whether everything is. The daemon waits
// until shortly before ctx's deadline, or without one up to its default
// of a minute.
func (c *Client) Flush(ctx context.Context) (wire.FlushReply, error) {
	var m wire.Flush
	if d, ok := ctx.Deadline(); ok {
		// Leave a tenth of the time for the reply to come back.
		m.TimeoutMS = uint32(max(1, min(time.Until(d)*9/10, time.Hour).Milliseconds()))
	}
	b, err := c.begin(ctx)
	if err != nil {
		return wire.FlushReply{}, err
	}
	defer c.end()
	if m.TimeoutMS == 0 {
		c.conn.SetDeadline(time.Now().Add(defaultFlushWait + c.opts.Timeout))
		c.setDeadline = time.Time{} // the next request sets its own
	}
	_, body, err := c.roundTrip(m.Append(b), wire.OpFlush, 0)
	if err != nil {
		return wire.FlushReply{}, err
	}
	var reply wire.FlushReply
	if err := reply.Decode(body); err != nil {
		return wire.FlushReply{}, c.breakConn(err)
	}
	return reply, nil
}

// Stats returns the daemon's statistics as JSON (the shape of GET
// /api/v1/stats on the admin server).
func (c *Client) Stats(ctx context.Context) (json.RawMessage, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer c.end()
	_, body, err := c.roundTrip(b, wire.OpStats, 0)
	if err != nil {
		return nil, err
	}
	return append(json.RawMessage(nil), body...), nil
}

// Store sends chunks[j] as the j-th chunk named by k (after the skip) and
// returns how many leading chunks the daemon stored.
func (c *Client) Store(ctx context.Context, k wire.Keys, chunks [][]byte) (int, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer c.end()
	c.sizes = c.sizes[:0]
	for j, ch := range chunks {
		if len(ch) > wire.MaxChunkBody {
			return 0, fmt.Errorf("kvtier client: chunk %d of %d bytes, limit %d", j, len(ch), wire.MaxChunkBody)
		}
		c.sizes = append(c.sizes, uint32(len(ch)))
	}
	m := wire.Store{Keys: k, Sizes: c.sizes}
	flags := wire.Flags(0)
	if len(chunks) > 0 {
		flags = wire.FlagMore
	}
	c.out = wire.Finish(m.Append(b), wire.OpStore, flags, c.id, wire.StatusOK)
	if _, err := c.conn.Write(c.out); err != nil {
		return 0, c.breakConn(err)
	}
	for j, ch := range chunks {
		flags := wire.FlagMore
		if j == len(chunks)-1 {
			flags = 0
		}
		if err := c.writeData(wire.OpStore, flags, ch); err != nil {
			return 0, c.breakConn(err)
		}
	}
	_, body, err := c.readReply(wire.OpStore)
	if err != nil {
		return 0, err
	}
	if len(body) != 4 {
		return 0, c.breakConn(fmt.Errorf("STORE reply of %d bytes", len(body)))
	}
	return int(binary.LittleEndian.Uint32(body)), nil
}

// writeData writes one data frame with a single writev.
func (c *Client) writeData(op wire.Op, flags wire.Flags, data []byte) error {
	wire.Header{Len: uint32(len(data)), Op: op, Flags: flags, ID: c.id}.Put(c.hdr[:])
	c.vec[0], c.vec[1] = c.hdr[:], data
	c.bufs = c.vec[:]
	_, err := c.bufs.WriteTo(c.conn)
	return err
}

// Retrieve reads the leading cached chunks named by k (after the skip)
// into dst, reslicing dst[j] to chunk j's length; it returns how many
// chunks and tokens it read. A dst[j] too small is an error that closes
// the connection (the bytes already on the wire cannot be skipped
// cheaply), so size dst for the largest chunk.
func (c *Client) Retrieve(ctx context.Context, k wire.Keys, dst [][]byte) (chunks, tokens int, err error) {
	b, err := c.begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.end()
	m := wire.KeysOnly{Keys: k}
	h, body, err := c.roundTrip(m.Append(b), wire.OpRetrieve, c.peerFlag())
	if err != nil {
		return 0, 0, err
	}
	dh := &c.dataHeader
	var sums []uint64
	if c.opts.Peer {
		err = c.peerHeader.Decode(body)
		dh, sums = &c.peerHeader.DataHeader, c.peerHeader.Sums
	} else {
		err = dh.Decode(body)
	}
	if err != nil {
		return 0, 0, c.breakConn(err)
	}
	n := len(dh.Sizes)
	if (h.Flags&wire.FlagMore != 0) != (n > 0) {
		return 0, 0, c.breakConn(fmt.Errorf("RETRIEVE reply with %d chunks and flags %#x", n, h.Flags))
	}
	for j, size := range dh.Sizes {
		dataHdr, err := c.rd.Header()
		if err != nil {
			return 0, 0, c.breakConn(err)
		}
		last := j == n-1
		if dataHdr.Op != wire.OpRetrieve || dataHdr.ID != c.id || (dataHdr.Flags&wire.FlagMore == 0) != last || dataHdr.Len != size {
			return 0, 0, c.breakConn(fmt.Errorf("%w: data frame %d out of order", wire.ErrFrame, j))
		}
		if j >= len(dst) || cap(dst[j]) < int(size) {
			return 0, 0, c.breakConn(fmt.Errorf("chunk %d of %d bytes does not fit its buffer", j, size))
		}
		dst[j] = dst[j][:size]
		if err := c.rd.ReadData(dataHdr, dst[j]); err != nil {
			return 0, 0, c.breakConn(err)
		}
		if sums != nil && wire.Checksum(dst[j]) != sums[j] {
			// The frames after this one are still on the wire: closing
			// the connection is the cheap way to stay in step.
			c.breakConn(fmt.Errorf("%w: chunk %d", ErrChecksum, j))
			return j, 0, fmt.Errorf("%w: chunk %d of %d", ErrChecksum, j, n)
		}
	}
	return n, int(dh.Tokens), nil
}

// Sizes returns the byte sizes of the leading cached chunks named by k
// (after the skip), without moving them. The slice is valid until the
// next call.
func (c *Client) Sizes(ctx context.Context, k wire.Keys) ([]uint32, error) {
	b, err := c.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer c.end()
	m := wire.KeysOnly{Keys: k}
	_, body, err := c.roundTrip(m.Append(b), wire.OpSizes, c.peerFlag())
	if err != nil {
		return nil, err
	}
	if err := c.dataHeader.Decode(body); err != nil {
		return nil, c.breakConn(err)
	}
	return c.dataHeader.Sizes, nil
}

var _ io.Closer = (*Client)(nil)

// rangeBuf returns where range i (br) lands: dst[i] from its start when
// perRange, else dst[br.Key] at the range's own offsets.
func rangeBuf(dst [][]byte, i int, br wire.ByteRange, perRange bool) ([]byte, bool) {
	j, from := int(br.Key), int(br.From)
	if perRange {
		j, from = i, 0
	}
	to := from + int(br.To-br.From)
	if j >= len(dst) || len(dst[j]) < to {
		return nil, false
	}
	return dst[j][from:to], true
}

// RetrieveRanges reads byte ranges of the leading cached chunks named by k
// (RETRIEVE_RANGES): range i lands in dst[ranges[i].Key][From:To], checked
// against the checksum the daemon sends for it, so dst[j] must be at
// least as long as the ranges of chunk j reach. It returns the sizes of
// the leading cached chunks (valid until the next call) and how many
// ranges were read: those naming one of them. A range that does not match
// its checksum gives ErrChecksum, with the ranges before it read; that and
// a range that does not fit dst close the connection.
func (c *Client) RetrieveRanges(ctx context.Context, k wire.Keys, ranges []wire.ByteRange, dst [][]byte) (sizes []uint32, read int, err error) {
	return c.retrieveRanges(ctx, k, ranges, dst, false)
}

// RetrieveRangesTo is RetrieveRanges with one buffer per range: range i
// lands in dst[i][:To-From], for a reader that keeps a range apart from
// the rest of its chunk (a remote tier's range read).
func (c *Client) RetrieveRangesTo(ctx context.Context, k wire.Keys, ranges []wire.ByteRange, dst [][]byte) (sizes []uint32, read int, err error) {
	return c.retrieveRanges(ctx, k, ranges, dst, true)
}

// retrieveRanges is RetrieveRanges, or RetrieveRangesTo when perRange.
func (c *Client) retrieveRanges(ctx context.Context, k wire.Keys, ranges []wire.ByteRange, dst [][]byte, perRange bool) (sizes []uint32, read int, err error) {
	b, err := c.begin(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer c.end()
	c.rangeReq.Keys, c.rangeReq.Ranges = k, ranges
	h, body, err := c.roundTrip(c.rangeReq.Append(b), wire.OpRetrieveRanges, c.peerFlag())
	c.rangeReq = wire.RetrieveRanges{}
	if err != nil {
		return nil, 0, err
	}
	return c.rangeData(h, body, c.id, ranges, dst, perRange)
}

// rangeData reads the data frames of request id's RETRIEVE_RANGES reply,
// whose metadata frame (h, body) has been read.
func (c *Client) rangeData(h wire.Header, body []byte, id uint32, ranges []wire.ByteRange, dst [][]byte, perRange bool) (sizes []uint32, read int, err error) {
	rh := &c.rangeHeader
	if err := rh.Decode(body); err != nil {
		return nil, 0, c.breakConn(err)
	}
	n := wire.Served(ranges, len(rh.Sizes))
	if len(rh.Sums) != n || (h.Flags&wire.FlagMore != 0) != (n > 0) {
		return nil, 0, c.breakConn(fmt.Errorf("%w: RETRIEVE_RANGES reply with %d checksums for %d ranges, flags %#x", wire.ErrFrame, len(rh.Sums), n, h.Flags))
	}
	for i, br := range ranges[:n] {
		if br.To > rh.Sizes[br.Key] {
			return nil, 0, c.breakConn(fmt.Errorf("%w: range %d ends at %d in a %d-byte chunk", wire.ErrFrame, i, br.To, rh.Sizes[br.Key]))
		}
		dataHdr, err := c.rd.Header()
		if err != nil {
			return nil, i, c.breakConn(err)
		}
		last := i == n-1
		if dataHdr.Op != wire.OpRetrieveRanges || dataHdr.ID != id || (dataHdr.Flags&wire.FlagMore == 0) != last || dataHdr.Len != br.To-br.From {
			return nil, i, c.breakConn(fmt.Errorf("%w: data frame %d out of order", wire.ErrFrame, i))
		}
		part, ok := rangeBuf(dst, i, br, perRange)
		if !ok {
			return nil, i, c.breakConn(fmt.Errorf("range %d of chunk %d does not fit its buffer", i, br.Key))
		}
		if err := c.rd.ReadData(dataHdr, part); err != nil {
			return nil, i, c.breakConn(err)
		}
		if wire.Checksum(part) != rh.Sums[i] {
			c.breakConn(fmt.Errorf("%w: range %d", ErrChecksum, i))
			return nil, i, fmt.Errorf("%w: range %d of %d", ErrChecksum, i, n)
		}
	}
	return rh.Sizes, n, nil
}
