package wire

// OpRequestBuffer gives a local connection a request buffer: memory that
// the client and the daemon share (a memfd the reply carries, as HELLO's
// carries the arena), where a LOOKUP or LOOKUP_BATCH may leave its token
// ids (KindShared keys) instead of sending them through the socket. A
// prompt's tokens are most of a lookup's bytes; in the buffer they are
// copied once, by the client, and hashed where they lie by the daemon.
const OpRequestBuffer Op = 22

// KindShared keys are token ids that lie in the connection's request
// buffer (OpRequestBuffer): Shared.Count u32s from byte Shared.Offset,
// which is a multiple of 4. They are for LOOKUP and LOOKUP_BATCH only.
const KindShared KeyKind = 3

// Limits of a request buffer.
const (
	MinRequestBuffer = 4 << 10
	MaxRequestBuffer = MaxMetaBody
)

// SharedTokens says where KindShared tokens lie in the request buffer; the
// count is the keys' count field.
type SharedTokens struct {
	Offset uint64
	Count  uint32
}

// decode reads the count, which Keys.decode has not consumed, and the
// offset.
func (s *SharedTokens) decode(d *decoder) {
	s.Count = d.u32("keys shared count")
	s.Offset = d.u64("keys shared offset")
	if d.err == nil && s.Offset%4 != 0 {
		d.fail("keys: shared tokens at offset %d, not a multiple of 4", s.Offset)
	}
}

// RequestBuffer asks for a request buffer of Bytes bytes (MinRequestBuffer
// to MaxRequestBuffer); the reply's body is the same u32 with the memfd
// attached to its first byte. A connection has at most one.
//
//	0 4 bytes
type RequestBuffer struct {
	Bytes uint32
}

func (m *RequestBuffer) Append(b []byte) []byte { return appendU32(b, m.Bytes) }

func (m *RequestBuffer) Decode(body []byte) error {
	d := decoder{b: body}
	m.Bytes = d.u32("request buffer bytes")
	if d.err == nil && (m.Bytes < MinRequestBuffer || m.Bytes > MaxRequestBuffer) {
		d.fail("request buffer of %d bytes; %d to %d are allowed", m.Bytes, MinRequestBuffer, MaxRequestBuffer)
	}
	return d.end("request buffer")
}
