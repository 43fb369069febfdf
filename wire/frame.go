// Package wire is kvtier's binary protocol: the frames a connector or a
// remote daemon exchanges with `kvtier serve`, over the local Unix socket
// and over TCP alike. docs/protocol.md describes every byte; this package
// is the one implementation of that description, shared by the server and
// the Go client.
//
// A frame is a 16-byte header and a body. Requests carry a client-chosen id
// that the reply echoes. Bodies are fixed little-endian fields, counted
// arrays and length-prefixed strings; nothing is self-describing, so every
// decoder checks each length against what is left and against the limits
// below, and a malformed body is an error, never a panic or a large
// allocation.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderSize is the size of a frame header.
const HeaderSize = 16

// Limits every peer enforces. Metadata bodies (everything but chunk bytes)
// are read into a reused buffer, so their bound is what one connection may
// make the other side hold; chunk bytes are read straight into arena
// objects of the size announced beforehand.
const (
	MaxMetaBody  = 8 << 20 // bytes of a non-data frame body: 2M tokens
	MaxChunkBody = 1 << 30 // bytes of one chunk in a data frame
	MaxString    = 1 << 10 // bytes of a string field
	MaxTiers     = 8       // per-tier counts in a lookup reply
	Magic        = "KVT1"  // first bytes of a HELLO body
	Version      = 1       // protocol version this package speaks
	maxBodyLimit = 1<<32 - 1
)

// Op is a frame's operation.
type Op uint8

// Operations. Values are part of the protocol and never reused.
const (
	OpHello           Op = 1
	OpPing            Op = 2
	OpScope           Op = 3
	OpLookup          Op = 4
	OpPrepareStore    Op = 5
	OpCommitStore     Op = 6
	OpPrepareRetrieve Op = 7
	OpRelease         Op = 8
	OpRenew           Op = 9
	OpPrefetch        Op = 10
	OpClear           Op = 11
	OpStats           Op = 12
	OpStore           Op = 13
	OpRetrieve        Op = 14
	OpSizes           Op = 15
	OpFlush           Op = 16
	OpPush            Op = 17 // see pd.go
	OpPushStatus      Op = 18
	OpReceive         Op = 19
	OpWait            Op = 20
	// OpLookupBatch    Op = 21, see batch.go
	// OpRequestBuffer  Op = 22, see shared.go
	// OpPrepareRetrieveLayers Op = 23, OpLayerWait Op = 24, see layers.go
	// OpRetrieveRanges Op = 25, see ranges.go
	// OpStoreLayer Op = 26, see store_layer.go
	// OpReceiveLayers Op = 27, see pd_layers.go
	opLimit Op = 28

	// MaxOp is the highest operation of this version.
	MaxOp = opLimit - 1
)

var opNames = [...]string{"", "HELLO", "PING", "SCOPE", "LOOKUP", "PREPARE_STORE",
	"COMMIT_STORE", "PREPARE_RETRIEVE", "RELEASE", "RENEW", "PREFETCH", "CLEAR",
	"STATS", "STORE", "RETRIEVE", "SIZES", "FLUSH", "PUSH", "PUSH_STATUS", "RECEIVE", "WAIT", "LOOKUP_BATCH", "REQUEST_BUFFER",
	"PREPARE_RETRIEVE_LAYERS", "LAYER_WAIT", "RETRIEVE_RANGES", "STORE_LAYER", "RECEIVE_LAYERS"}

func (o Op) String() string {
	if o > 0 && o < opLimit {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is an operation of this protocol version.
func (o Op) Valid() bool { return o > 0 && o < opLimit }

// Flags are a frame's flag bits.
type Flags uint8

const (
	// FlagReply marks a frame sent by the server.
	FlagReply Flags = 1 << 0
	// FlagMore says more frames of the same request or reply follow: the
	// chunk bytes of STORE and RETRIEVE travel in their own frames.
	FlagMore Flags = 1 << 1
	// FlagPeer on a LOOKUP, SIZES or RETRIEVE request says the client is
	// another daemon's P2P tier: the daemon answers from its RAM and
	// node-local tiers only (never its remote stores or its own peers, so
	// two daemons that are each other's peers cannot ask each other in a
	// loop), and RETRIEVE's metadata reply carries a checksum per chunk
	// (PeerDataHeader) so that the reader can prove the bytes it got.
	FlagPeer Flags = 1 << 2
	// FlagInProgress on a WAIT request counts, besides the chunks in RAM,
	// those still arriving by RECEIVE_LAYERS, which a layerwise reader can
	// take before they are complete (docs/disaggregation.md). A daemon
	// refuses it on any other op (BAD_REQUEST, the connection closed).
	FlagInProgress Flags = 1 << 3
	flagsKnown           = FlagReply | FlagMore | FlagPeer | FlagInProgress
)

// Status is a reply's outcome. A reply with a status other than OK has a
// UTF-8 message as its body.
type Status uint32

// Statuses. Values are part of the protocol.
const (
	StatusOK           Status = 0
	StatusBadRequest   Status = 1 // malformed or out-of-order frame
	StatusUnknownOp    Status = 2
	StatusNotFound     Status = 3 // unknown lease or scope handle
	StatusNoSpace      Status = 4 // the arena cannot hold the request
	StatusUnauthorized Status = 5 // missing or wrong token
	StatusUnsupported  Status = 6 // not possible on this connection
	StatusShuttingDown Status = 7
	StatusInternal     Status = 8
	StatusTooLarge     Status = 9 // a frame or field over a limit
	statusLimit        Status = 10
)

var statusNames = [...]string{"ok", "bad request", "unknown operation", "not found",
	"no space", "unauthorized", "unsupported", "shutting down", "internal error", "too large"}

func (s Status) String() string {
	if s < statusLimit {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// Header is a decoded frame header.
//
//	offset size field
//	     0    4 body length in bytes (the header not included)
//	     4    1 op
//	     5    1 flags
//	     6    2 reserved, zero
//	     8    4 request id, chosen by the client and echoed by the reply
//	    12    4 status: zero in requests, the outcome in replies
type Header struct {
	Len    uint32
	Op     Op
	Flags  Flags
	ID     uint32
	Status Status
}

// Errors of this package, wrapped with details.
var (
	ErrFrame   = errors.New("wire: malformed frame")
	ErrTooBig  = errors.New("wire: over a protocol limit")
	ErrVersion = errors.New("wire: unsupported protocol version")
)

// Put writes h into b[:HeaderSize].
func (h Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint32(b[0:], h.Len)
	b[4] = byte(h.Op)
	b[5] = byte(h.Flags)
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint32(b[8:], h.ID)
	binary.LittleEndian.PutUint32(b[12:], uint32(h.Status))
}

// ParseHeader decodes a header. It checks the fields a header can check
// alone; the body's length is checked by the reader, which knows whether a
// data or a metadata body is due.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header of %d bytes", ErrFrame, len(b))
	}
	h := Header{
		Len:    binary.LittleEndian.Uint32(b[0:]),
		Op:     Op(b[4]),
		Flags:  Flags(b[5]),
		ID:     binary.LittleEndian.Uint32(b[8:]),
		Status: Status(binary.LittleEndian.Uint32(b[12:])),
	}
	switch {
	case !h.Op.Valid():
		return h, fmt.Errorf("%w: unknown op %d", ErrFrame, b[4])
	case h.Flags&^flagsKnown != 0:
		return h, fmt.Errorf("%w: unknown flags %#x", ErrFrame, b[5])
	case b[6] != 0 || b[7] != 0:
		return h, fmt.Errorf("%w: reserved header bytes are not zero", ErrFrame)
	case h.Status >= statusLimit:
		return h, fmt.Errorf("%w: unknown status %d", ErrFrame, h.Status)
	}
	return h, nil
}
