package server

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/tenant"
	"kvtier/wire"
)

// readBuffer is the size of a connection's read buffer.
const readBuffer = 64 << 10

// session serves one connection. Its goroutine owns all of it.
type session struct {
	svc   *Service
	conn  net.Conn
	local bool // Unix socket
	arena bool // the arena is shared: local, and not a tenant's (tenant.go)
	br    *bufio.Reader
	rd    *wire.Reader
	// charge is the body pool's handle, with the current frame's
	// deadline; armed says a frame deadline is set on conn (see armFrame).
	charge frameCharge
	armed  bool
	out    []byte
	busy   atomic.Bool
	// reqBuf is the connection's request buffer (REQUEST_BUFFER), mapped
	// read-only, or nil; see shared.go.
	reqBuf []byte

	writeDeadline time.Time // the deadline set on conn, see extendWriteDeadline
	epoch         time.Time // when serve began: clock reads are durations since (see now)
	writeCapped   bool      // a reply has a fixed write deadline (ranges.go): leave it

	scopes []scopeEntry // handle h is scopes[h-1]

	// tenant is the tenant whose token the connection presented, nil for
	// full access; pushed the transfers it started (see tenant.go).
	tenant *tenant.Tenant
	pushed map[uint64]struct{}

	// leases are the engine leases this connection holds: only it may
	// release, renew or commit them, and they end when it closes.
	leases map[engine.LeaseID]struct{}

	// Scratch reused by every request.
	keys     []chunk.Key
	writes   engine.Writes
	reads    engine.Reads
	eslots   []engine.Slot
	sizes    []uint32
	byTier   []uint32
	slots    wire.Slots
	vec      [2][]byte
	bufs     net.Buffers // over vec, kept here so that WriteTo does not allocate per chunk
	hdr      [wire.HeaderSize]byte
	lookup   wire.Lookup
	batch    wire.LookupBatch
	prepS    wire.PrepareStore
	prepR    wire.PrepareRetrieve
	prepL    wire.PrepareRetrieveLayers
	keysOnly wire.KeysOnly
	hashIn   []byte   // a chunk's hash input, for tokens in the request buffer (lookup.go)
	sums     []uint64 // checksums of a peer's RETRIEVE or of RETRIEVE_RANGES
	ranges   wire.RetrieveRanges
	rreads   engine.RangeReads // RETRIEVE_RANGES's chunks (ranges.go)
	rdata    [][]byte          // the bytes of each range served
	store    wire.Store
	digests  [][32]byte // vLLM block hashes, for the event publisher
	blocks   []uint64
	pd       pdScratch
	pdl      layerScratch // RECEIVE_LAYERS, see pd_layers.go
}

type scopeEntry struct {
	scope   chunk.Scope
	id      uint64
	chunker *chunk.Chunker // the scope's, once a lookup asked for it (lookup.go)
}

// newSession returns a session of c; its buffers are made by serve, so a
// connection refused for being over the cap costs nothing.
func newSession(svc *Service, c net.Conn, local bool) *session {
	return &session{svc: svc, conn: c, local: local}
}

// requestError is a failed request: the status and message to reply with,
// and whether the connection must close (the stream can no longer be
// trusted to be at a frame boundary, or the peer is not allowed in).
type requestError struct {
	status wire.Status
	err    error
	fatal  bool
	// noReply: writing the reply failed (timed out, or the peer went),
	// maybe in the middle of a frame, so nothing more is written, not
	// even an error frame: the connection closes (fatal is set too).
	noReply bool
}

func (e *requestError) Error() string { return e.err.Error() }

func fail(status wire.Status, format string, args ...any) *requestError {
	return &requestError{status: status, err: fmt.Errorf(format, args...)}
}

func fatal(status wire.Status, format string, args ...any) *requestError {
	return &requestError{status: status, err: fmt.Errorf(format, args...), fatal: true}
}

// writeFailed is a request whose reply could not be written. An error
// frame after it would land in the middle of the frame cut short, and
// would wait for a reader that has stopped reading for a fresh
// WriteTimeout, holding the session (and a reply of ranges' scratch
// memory, ranges.go, was to be cut off well before that).
func writeFailed(format string, args ...any) *requestError {
	return &requestError{status: wire.StatusInternal, err: fmt.Errorf(format, args...), fatal: true, noReply: true}
}

// statusOf maps an engine or tier error to the status a client sees.
func statusOf(err error) *requestError {
	switch {
	case errors.Is(err, engine.ErrNoSpace), errors.Is(err, engine.ErrTooLarge), errors.Is(err, engine.ErrQuota):
		return fail(wire.StatusNoSpace, "%v", err)
	case errors.Is(err, chunk.ErrSkip):
		return fail(wire.StatusBadRequest, "%v", err)
	case errors.Is(err, engine.ErrClosed):
		return fail(wire.StatusShuttingDown, "%v", err)
	}
	return fail(wire.StatusInternal, "%v", err)
}

func (s *session) serve() {
	defer s.svc.remove(s)
	defer s.conn.Close()
	defer s.releaseAll()
	defer s.releaseRequestBuffer()
	// 64 KiB holds a LOOKUP of a 16k-token prompt, or hundreds of small
	// requests a client pipelines, so that one read takes a request in and
	// its body is decoded where it lies (BodyView); larger reads (chunk
	// bytes) bypass the buffer. 1,024 idle connections hold 64 MiB.
	s.br = bufio.NewReaderSize(s.conn, readBuffer)
	s.rd = wire.NewReader(s.br)
	s.charge.pool = s.svc.bodies
	s.rd.Pool = &s.charge
	s.epoch = time.Now()
	defer s.settle()
	peer := s.conn.RemoteAddr().String()
	if err := s.handshake(); err != nil {
		s.svc.logs.Log(s.svc.log, slog.LevelInfo, "handshake refused", "peer", peer, "local", s.local, "err", err)
		return
	}
	for {
		// Lifting the frame deadline must come before going idle, or it
		// could undo the deadline Shutdown sets to wake an idle session.
		s.settle()
		s.busy.Store(false)
		if s.svc.isClosing() {
			return
		}
		h, err := s.rd.Header()
		s.busy.Store(true)
		if err != nil {
			if !errors.Is(err, io.EOF) && !isClosedErr(err) {
				s.svc.logs.Log(s.svc.log, slog.LevelInfo, "closing connection", "peer", peer, "local", s.local, "err", err)
				s.replyError(h.Op, h.ID, &requestError{status: wire.StatusBadRequest, err: err})
			}
			return
		}
		start := s.now()
		s.armFrame(h.Len)
		rerr := s.handle(h)
		s.svc.metrics.observe(h.Op, start, rerr)
		if rerr != nil {
			// A one-way request gets no reply, not even to an error: the
			// client reads nothing for it, and a stray frame would pass for
			// the reply to its next call. Nor does one whose reply failed
			// to be written.
			if h.Op != wire.OpStoreLayer && !rerr.noReply {
				s.replyError(h.Op, h.ID, rerr)
			}
			if rerr.fatal {
				s.svc.logs.Log(s.svc.log, slog.LevelInfo, "closing connection", "peer", peer, "local", s.local, "op", h.Op, "err", rerr.err)
				return
			}
		}
	}
}

func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded)
}

// wakeIfIdle makes a connection that waits for its next request notice
// shutdown; a busy one notices when its request is done.
func (s *session) wakeIfIdle() {
	if !s.busy.Load() {
		s.conn.SetReadDeadline(time.Now())
	}
}

// maxHelloBody bounds what a peer may send before it is authenticated.
const maxHelloBody = 8 + 2*(2+wire.MaxString)

// handshake reads HELLO, checks version and token, and replies; on the
// local socket the reply carries the arena's memfd.
func (s *session) handshake() error {
	s.conn.SetReadDeadline(time.Now().Add(s.svc.opts.HandshakeTimeout))
	h, err := s.rd.Header()
	if err == nil && h.Len > maxHelloBody {
		err = fmt.Errorf("a HELLO of %d bytes", h.Len)
	}
	var body []byte
	if err == nil {
		body, err = s.rd.Body(h)
	}
	if err != nil {
		// Before HELLO a peer learns nothing but that it must authenticate.
		if !errors.Is(err, io.EOF) {
			s.replyError(wire.OpHello, h.ID, fatal(wire.StatusUnauthorized, "expected HELLO: %v", err))
		}
		return err
	}
	s.conn.SetReadDeadline(time.Time{})
	var hello wire.Hello
	var rerr *requestError
	switch {
	case h.Op != wire.OpHello:
		rerr = fatal(wire.StatusUnauthorized, "the first frame must be HELLO, got %s", h.Op)
	case h.Flags != 0:
		rerr = fatal(wire.StatusBadRequest, "HELLO with flags %#x", h.Flags)
	}
	if rerr == nil {
		if err := hello.Decode(body); err != nil {
			rerr = fatal(wire.StatusBadRequest, "%v", err)
		}
	}
	switch {
	case rerr != nil:
	case hello.Version != wire.Version:
		rerr = fatal(wire.StatusBadRequest, "protocol version %d; this daemon speaks %d", hello.Version, wire.Version)
	default:
		rerr = s.authenticate(hello.Token)
	}
	if rerr != nil {
		s.replyError(h.Op, h.ID, rerr)
		return rerr
	}
	s.arena = s.local && s.tenant == nil
	eng := s.svc.eng
	reply := wire.HelloReply{Version: wire.Version, HasArena: s.arena,
		ChunkTokens: uint32(eng.ChunkSize()), ArenaBytes: uint64(eng.ArenaBytes()),
		LeaseMS: uint32(eng.LeaseTTL(0) / time.Millisecond), MaxChunk: wire.MaxChunkBody}
	s.out = wire.Finish(reply.Append(wire.Begin(s.out)), wire.OpHello, wire.FlagReply, h.ID, wire.StatusOK)
	if !s.arena {
		return s.send(s.out)
	}
	uc, ok := s.conn.(*net.UnixConn)
	if !ok {
		return errors.New("local session without a Unix connection")
	}
	s.extendWriteDeadline()
	_, _, err = uc.WriteMsgUnix(s.out, unix.UnixRights(eng.ArenaFd()), nil)
	return err
}

// tokenMatches compares in constant time. An empty configured token lets
// everyone in: ListenTCP only allows that on loopback.
func tokenMatches(want, got string) bool {
	if want == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}

func (s *session) send(frame []byte) error {
	s.extendWriteDeadline()
	_, err := s.conn.Write(frame)
	return err
}

// extendWriteDeadline keeps a write deadline of about WriteTimeout ahead,
// moving it only once half of it has passed: arming the runtime's timer on
// every small reply costs more than the reply itself.
func (s *session) extendWriteDeadline() {
	if s.writeCapped {
		return
	}
	now := s.now()
	if s.writeDeadline.Sub(now) > s.svc.opts.WriteTimeout/2 {
		return
	}
	s.writeDeadline = now.Add(s.svc.opts.WriteTimeout)
	s.conn.SetWriteDeadline(s.writeDeadline)
}

// now is time.Now for a session's own timing, with one read of the
// monotonic clock where time.Now makes two (wall and monotonic): a small
// request reads the clock three times (its start, the write deadline, its
// latency), which were a visible part of its cost. Its wall reading is the
// epoch's plus the monotonic time since, so it serves comparisons and
// deadlines (which Go takes by the monotonic clock), not wall-clock display.
func (s *session) now() time.Time {
	if s.epoch.IsZero() { // a session that serve did not start
		return time.Now()
	}
	return s.epoch.Add(time.Since(s.epoch))
}

func (s *session) replyError(op wire.Op, id uint32, e *requestError) {
	if !op.Valid() {
		op = wire.OpPing
	}
	b := append(wire.Begin(s.out), e.err.Error()...)
	s.out = wire.Finish(b, op, wire.FlagReply, id, e.status)
	if s.send(s.out) != nil {
		s.conn.Close()
	}
}

// reply sends the frame built in s.out since wire.Begin.
func (s *session) reply(h wire.Header, flags wire.Flags) *requestError {
	s.out = wire.Finish(s.out, h.Op, wire.FlagReply|flags, h.ID, wire.StatusOK)
	if err := s.send(s.out); err != nil {
		return writeFailed("writing the reply: %v", err)
	}
	return nil
}

func (s *session) handle(h wire.Header) *requestError {
	if h.Flags&wire.FlagReply != 0 {
		return fatal(wire.StatusBadRequest, "a client sent a reply frame")
	}
	if h.Flags&wire.FlagInProgress != 0 && h.Op != wire.OpWait {
		// Fatal, as a reply frame is: the request's body is not read.
		return fatal(wire.StatusBadRequest, "the in-progress flag is WAIT's, not %s's", h.Op)
	}
	if rerr := s.tenantOp(h.Op); rerr != nil {
		return rerr
	}
	switch h.Op {
	case wire.OpStore:
		return s.handleStore(h)
	case wire.OpReceive:
		return s.handleReceive(h)
	case wire.OpReceiveLayers:
		return s.handleReceiveLayers(h)
	}
	if h.Flags&wire.FlagMore != 0 {
		return fatal(wire.StatusBadRequest, "%s does not take data frames", h.Op)
	}
	if h.Op == wire.OpLookup || h.Op == wire.OpLookupBatch {
		// Answered before the stream is read again: decode in place.
		body, err := s.rd.BodyView(h)
		if err != nil {
			return bodyError(err)
		}
		if h.Op == wire.OpLookup {
			return s.handleLookup(h, body)
		}
		return s.handleLookupBatch(h, body)
	}
	body, err := s.rd.Body(h)
	if err != nil {
		return bodyError(err)
	}
	switch h.Op {
	case wire.OpPing:
		s.out = append(wire.Begin(s.out), body...)
		return s.reply(h, 0)
	case wire.OpScope:
		return s.handleScope(h, body)
	case wire.OpLookup:
		return s.handleLookup(h, body)
	case wire.OpPrepareStore:
		return s.handlePrepareStore(h, body)
	case wire.OpCommitStore:
		return s.handleCommit(h, body)
	case wire.OpPrepareRetrieve:
		return s.handlePrepareRetrieve(h, body)
	case wire.OpRelease, wire.OpRenew:
		return s.handleLease(h, body)
	case wire.OpPrefetch:
		return s.handlePrefetch(h, body)
	case wire.OpClear:
		return s.handleClear(h, body)
	case wire.OpStats:
		return s.handleStats(h)
	case wire.OpRetrieve:
		return s.handleRetrieve(h, body)
	case wire.OpSizes:
		return s.handleSizes(h, body)
	case wire.OpFlush:
		return s.handleFlush(h, body)
	case wire.OpPush:
		return s.handlePush(h, body)
	case wire.OpPushStatus:
		return s.handlePushStatus(h, body)
	case wire.OpWait:
		return s.handleWait(h, body)
	case wire.OpRequestBuffer:
		return s.handleRequestBuffer(h, body)
	case wire.OpPrepareRetrieveLayers:
		return s.handlePrepareRetrieveLayers(h, body)
	case wire.OpLayerWait:
		return s.handleLayerWait(h, body)
	case wire.OpRetrieveRanges:
		return s.handleRetrieveRanges(h, body)
	case wire.OpStoreLayer:
		return s.handleStoreLayer(body)
	}
	return fail(wire.StatusUnknownOp, "%s is not a request", h.Op)
}

// bodyError is the reply to a metadata body that could not be read: too
// large, cut short, or not complete by its deadline. Either way the
// stream is no longer at a frame boundary.
func bodyError(err error) *requestError {
	if errors.Is(err, wire.ErrTooBig) {
		return fatal(wire.StatusTooLarge, "%v", err)
	}
	return fatal(wire.StatusBadRequest, "%v", frameErr(err))
}

func (s *session) handleScope(h wire.Header, body []byte) *requestError {
	var m wire.Scope
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	sc := m.Chunk()
	if rerr := s.scopeAllowed(sc); rerr != nil {
		return rerr
	}
	handle := 0
	for i := range s.scopes {
		if s.scopes[i].scope == sc {
			handle = i + 1
		}
	}
	if handle == 0 {
		if len(s.scopes) >= s.svc.opts.MaxScopes {
			return fail(wire.StatusTooLarge, "a connection may register %d scopes", s.svc.opts.MaxScopes)
		}
		id, err := s.svc.eng.RegisterScope(sc)
		if err != nil {
			return fail(wire.StatusBadRequest, "%v", err)
		}
		s.scopes = append(s.scopes, scopeEntry{scope: sc, id: id})
		handle = len(s.scopes)
	}
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(handle))
	return s.reply(h, 0)
}

// resolved is a request's keys as chunk keys: all of them, the index of the
// first one to act on, and for token keys what is needed to count tokens.
type resolved struct {
	keys    []chunk.Key
	first   int
	chunker *chunk.Chunker // nil unless token keys
	tokens  int
	skip    int
}

// tokensAfter returns how many tokens the n chunks from r.first cover.
func (r *resolved) tokensAfter(n int) uint32 {
	if r.chunker == nil || n == 0 {
		return 0
	}
	return uint32(engine.TokensThrough(r.chunker, r.first+n, r.tokens) - r.skip)
}

func (s *session) resolve(k *wire.Keys) (resolved, *requestError) {
	s.keys = s.keys[:0]
	if k.Kind == wire.KindShared {
		return resolved{}, fail(wire.StatusBadRequest, "keys in the request buffer are for LOOKUP and LOOKUP_BATCH only")
	}
	if k.Kind == wire.KindRaw {
		if rerr := s.rawAllowed(k.Raw); rerr != nil {
			return resolved{}, rerr
		}
		s.keys = append(s.keys, k.Raw...)
		return resolved{keys: s.keys}, nil
	}
	if k.Scope == 0 || int(k.Scope) > len(s.scopes) {
		return resolved{}, fail(wire.StatusNotFound, "scope handle %d is not registered on this connection", k.Scope)
	}
	sc := &s.scopes[k.Scope-1]
	if k.Kind == wire.KindHashes {
		s.keys = hashKeys(s.keys, sc.id, k)
		return resolved{keys: s.keys}, nil
	}
	keys, first, c, err := s.svc.eng.Keys(s.keys, engine.Request{Scope: sc.scope, Tokens: k.Tokens, Skip: int(k.Skip)})
	if err != nil {
		return resolved{}, statusOf(err)
	}
	s.keys = keys
	return resolved{keys: keys, first: first, chunker: c, tokens: len(k.Tokens), skip: int(k.Skip)}, nil
}

func (s *session) handleLookup(h wire.Header, body []byte) *requestError {
	m := &s.lookup
	if err := m.DecodeView(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	b, rerr := s.lookupOne(wire.Begin(s.out), m, h.Flags&wire.FlagPeer != 0)
	if rerr != nil {
		return rerr
	}
	s.out = b
	return s.reply(h, 0)
}

// lookupOne serves one lookup and appends its reply to b; on an error b is
// returned as it came.
func (s *session) lookupOne(b []byte, m *wire.Lookup, peer bool) ([]byte, *requestError) {
	r, rerr := s.lookupKeys(&m.Keys)
	if rerr != nil {
		return b, rerr
	}
	eng := s.svc.eng
	var n int
	var byTier [engine.MaxTiers]int
	if peer {
		n, byTier = eng.LookupKeysLocal(r.keys)
	} else {
		n, byTier = eng.LookupKeys(r.keys)
	}
	reply := wire.LookupReply{Chunks: uint32(n)}
	if r.chunker != nil {
		reply.Tokens = uint32(engine.TokensThrough(r.chunker, n, r.tokens))
	}
	s.byTier = s.byTier[:0]
	for i := range s.svc.tiers {
		s.byTier = append(s.byTier, uint32(byTier[i]))
	}
	reply.ByTier = s.byTier
	if m.LeaseMS > 0 && n > r.first {
		id := eng.PinHit(r.keys[r.first:n], leaseAsked(m.LeaseMS))
		if rerr := s.hold(id); rerr != nil {
			return b, rerr
		}
		reply.Lease = uint64(id)
	}
	return reply.Append(b), nil
}

// handleLookupBatch serves LOOKUP_BATCH: each lookup as LOOKUP would, in
// order, into one reply. A lookup that fails gets its status in its entry
// and the others go on; only a malformed frame fails the whole request.
func (s *session) handleLookupBatch(h wire.Header, body []byte) *requestError {
	m := &s.batch
	if err := m.DecodeView(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	peer := h.Flags&wire.FlagPeer != 0
	b := binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(len(m.Lookups)))
	for i := range m.Lookups {
		at := len(b)
		b = binary.LittleEndian.AppendUint32(b, uint32(wire.StatusOK))
		var rerr *requestError
		if b, rerr = s.lookupOne(b, &m.Lookups[i], peer); rerr != nil {
			res := wire.LookupResult{Status: rerr.status, Message: rerr.err.Error()}
			b = res.Append(b[:at])
		}
	}
	s.out = b
	return s.reply(h, 0)
}

func (s *session) requireArena(op wire.Op) *requestError {
	if !s.arena {
		return fail(wire.StatusUnsupported, "%s needs the shared arena of the local socket, which tenants do not get; use STORE and RETRIEVE", op)
	}
	return nil
}

func (s *session) handlePrepareStore(h wire.Header, body []byte) *requestError {
	if rerr := s.requireArena(h.Op); rerr != nil {
		return rerr
	}
	m := &s.prepS
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	keys := r.keys[r.first:]
	if len(m.Sizes) > len(keys) {
		return fail(wire.StatusBadRequest, "%d sizes for %d chunks", len(m.Sizes), len(keys))
	}
	s.noteBlocks(&r, m.Keys.Tokens, len(m.Sizes))
	slots, id, err := s.svc.eng.PrepareStore(keys, m.Sizes, leaseAsked(m.LeaseMS), s.eslots[:0])
	s.eslots = slots
	if err != nil {
		return statusOf(err)
	}
	return s.replySlots(h, id, 0)
}

// replySlots holds lease id (unless it is 0) and replies with s.eslots.
func (s *session) replySlots(h wire.Header, id engine.LeaseID, tokens uint32) *requestError {
	if rerr := s.hold(id); rerr != nil {
		return rerr
	}
	s.slots.Lease, s.slots.Tokens = uint64(id), tokens
	s.slots.Slots = s.slots.Slots[:0]
	for _, sl := range s.eslots {
		ws := wire.Slot{Offset: sl.Offset, Len: sl.Len}
		if sl.Stored {
			ws = wire.Slot{State: wire.SlotStored, Len: sl.Len}
		}
		s.slots.Slots = append(s.slots.Slots, ws)
	}
	s.out = s.slots.Append(wire.Begin(s.out))
	return s.reply(h, 0)
}

func (s *session) handleCommit(h wire.Header, body []byte) *requestError {
	var m wire.Commit
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	id := engine.LeaseID(m.Lease)
	if !s.owns(id) {
		return fail(wire.StatusNotFound, "lease %d is unknown, expired or released", m.Lease)
	}
	delete(s.leases, id)
	n, err := s.svc.eng.CommitStore(id, int(m.Count))
	switch {
	case errors.Is(err, engine.ErrUnknownLease):
		return fail(wire.StatusNotFound, "lease %d is unknown, expired or released", m.Lease)
	case errors.Is(err, engine.ErrNotStoreLease):
		return fail(wire.StatusBadRequest, "lease %d is not a store lease", m.Lease)
	case err != nil:
		return statusOf(err)
	}
	s.out = binary.LittleEndian.AppendUint32(wire.Begin(s.out), uint32(n))
	return s.reply(h, 0)
}

func (s *session) handlePrepareRetrieve(h wire.Header, body []byte) *requestError {
	if rerr := s.requireArena(h.Op); rerr != nil {
		return rerr
	}
	m := &s.prepR
	if err := m.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&m.Keys)
	if rerr != nil {
		return rerr
	}
	slots, id, err := s.svc.eng.PrepareRetrieve(context.Background(), r.keys[r.first:], leaseAsked(m.LeaseMS), s.eslots[:0])
	s.eslots = slots
	if err != nil {
		return statusOf(err)
	}
	s.svc.pd.consumed(r.keys[r.first : r.first+len(slots)])
	return s.replySlots(h, id, r.tokensAfter(len(slots)))
}

func (s *session) handleLease(h wire.Header, body []byte) *requestError {
	var m wire.Lease
	renew := h.Op == wire.OpRenew
	if err := m.Decode(body, renew); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	id := engine.LeaseID(m.ID)
	ok := s.owns(id)
	switch {
	case ok && renew:
		ok = s.svc.eng.Renew(id, leaseAsked(m.MS))
	case ok:
		delete(s.leases, id)
		ok = s.svc.eng.Release(id)
	}
	if !ok {
		delete(s.leases, id)
		return fail(wire.StatusNotFound, "lease %d is unknown, expired or released", m.ID)
	}
	s.out = wire.Begin(s.out)
	return s.reply(h, 0)
}

func (s *session) handlePrefetch(h wire.Header, body []byte) *requestError {
	if err := s.keysOnly.Decode(body); err != nil {
		return fail(wire.StatusBadRequest, "%v", err)
	}
	r, rerr := s.resolve(&s.keysOnly.Keys)
	if rerr != nil {
		return rerr
	}
	queued := byte(0)
	if s.svc.eng.PrefetchKeys(r.keys[r.first:]) {
		queued = 1
	}
	s.out = append(wire.Begin(s.out), queued)
	return s.reply(h, 0)
}

// handleClear drops the chunks of a registered scope, or of every scope
// for handle 0, from RAM and the disk tier (remote tiers keep theirs); the
// reply counts the RAM chunks dropped.
func (s *session) handleClear(h wire.Header, body []byte) *requestError {
	if len(body) != 4 {
		return fail(wire.StatusBadRequest, "clear: body of %d bytes, want 4", len(body))
	}
	handle := binary.LittleEndian.Uint32(body)
	var scope uint64
	if handle != 0 {
		if int(handle) > len(s.scopes) {
			return fail(wire.StatusNotFound, "scope handle %d is not registered on this connection", handle)
		}
		scope = s.scopes[handle-1].id
	}
	var n uint64
	if scope == 0 && s.tenant != nil {
		n = s.clearTenant()
	} else {
		removed, _ := s.svc.eng.Clear(scope)
		n = uint64(removed[0])
	}
	s.out = binary.LittleEndian.AppendUint64(wire.Begin(s.out), n)
	return s.reply(h, 0)
}

func (s *session) handleStats(h wire.Header) *requestError {
	body, err := json.Marshal(s.svc.eng.Stats())
	if err != nil {
		return fail(wire.StatusInternal, "%v", err)
	}
	s.out = append(wire.Begin(s.out), body...)
	return s.reply(h, 0)
}

// noteBlocks tells the event publisher, if there is one, the vLLM block
// hashes of the n chunks after the skip that a token-keyed store is about
// to write, so their admission can be announced in vLLM's terms.
func (s *session) noteBlocks(r *resolved, tokens []uint32, n int) {
	p := s.svc.opts.Events
	if p == nil || r.chunker == nil || n == 0 {
		return
	}
	bpc := p.BlocksPerChunk()
	end := min(len(tokens), (r.first+n)*r.chunker.Size())
	s.digests = p.Hasher().BlockHashes(s.digests[:0], tokens[:end], chunk.VLLMRequest{})
	s.blocks = s.blocks[:0]
	for i := range s.digests {
		s.blocks = append(s.blocks, chunk.EventHash(s.digests[i]))
	}
	for j := range n {
		c := r.first + j
		lo, hi := c*bpc, min((c+1)*bpc, len(s.blocks))
		if lo >= hi {
			return // a partial last chunk of less than one block
		}
		var parent uint64
		if lo > 0 {
			parent = s.blocks[lo-1]
		}
		p.Note(r.keys[c], s.blocks[lo:hi], parent, lo > 0)
	}
}
