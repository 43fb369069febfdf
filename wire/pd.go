package wire

// Messages of prefill/decode transfer (docs/disaggregation.md): a connector asks its
// daemon to PUSH chunks to another daemon and polls PUSH_STATUS; the
// producer daemon sends them with RECEIVE; the consumer's connector WAITs
// for them to land.

// Push asks the daemon to send chunks it holds to another daemon's TCP
// protocol, under a transfer id the caller chose. Several PUSH requests
// with one transfer id add chunks to it in order; the one with PushLast
// says no more follow. The reply's body is the u32 number of chunks the
// transfer has queued in all.
//
// With StoreLease set (flag bit 1), the chunks are those of that store
// lease of the same connection, pushed while the client still fills them:
// each layer goes out once STORE_LAYER says it is final (pd_feed.go).
//
//	 0 8 transfer id, not 0
//	 8 4 timeout in milliseconds for the whole transfer (0: the daemon's default)
//	12 1 flags: bit 0 = last, bit 1 = from a store lease
//	13 3 reserved, zero
//	16 . destination host:port (string)
//	 . . keys
//	 . 8 store lease id, not 0 (only with flag bit 1)
type Push struct {
	Transfer   uint64
	TimeoutMS  uint32
	Last       bool
	Dest       string
	Keys       Keys
	StoreLease uint64
}

func (m *Push) Append(b []byte) []byte {
	b = appendU64(b, m.Transfer)
	b = appendU32(b, m.TimeoutMS)
	var flags byte
	if m.Last {
		flags = 1
	}
	if m.StoreLease != 0 {
		flags |= 2
	}
	b = append(b, flags, 0, 0, 0)
	b = appendStr(b, m.Dest)
	b = m.Keys.Append(b)
	if m.StoreLease != 0 {
		b = appendU64(b, m.StoreLease)
	}
	return b
}

func (m *Push) Decode(body []byte) error {
	d := decoder{b: body}
	m.Transfer = d.u64("push transfer")
	m.TimeoutMS = d.u32("push timeout")
	flags := d.u8("push flags")
	if flags&^3 != 0 {
		d.fail("push: unknown flags %#x", flags)
	}
	m.Last = flags&1 != 0
	d.zero(3, "push reserved")
	m.Dest = d.str("push destination")
	m.Keys.decode(&d)
	m.StoreLease = 0
	if flags&2 != 0 {
		if m.StoreLease = d.u64("push store lease"); m.StoreLease == 0 && d.err == nil {
			d.fail("push: store lease 0")
		}
	}
	if d.err == nil && m.Transfer == 0 {
		d.fail("push: transfer id 0")
	}
	return d.end("push")
}

// TransferState is where a transfer stands.
type TransferState uint8

const (
	TransferPending TransferState = 0 // chunks queued or being sent, or more may follow
	TransferDone    TransferState = 1 // every chunk of a last-flagged transfer is in the destination
	TransferFailed  TransferState = 2 // given up; Message says why
	transferLimit   TransferState = 3
)

func (s TransferState) String() string {
	switch s {
	case TransferPending:
		return "pending"
	case TransferDone:
		return "done"
	case TransferFailed:
		return "failed"
	}
	return "state(?)"
}

// PushStatus asks where transfer Transfer stands; the reply is a
// PushStatusReply. The body is the u64 transfer id.
type PushStatus struct{ Transfer uint64 }

func (m *PushStatus) Append(b []byte) []byte { return appendU64(b, m.Transfer) }

func (m *PushStatus) Decode(body []byte) error {
	d := decoder{b: body}
	m.Transfer = d.u64("push status transfer")
	return d.end("push status")
}

// PushStatusReply is a transfer's state and counts.
//
//	0 1 state
//	1 3 reserved, zero
//	4 4 chunks queued in all
//	8 4 chunks the destination has stored
//	12 . message (string): why it failed, else empty
type PushStatusReply struct {
	State   TransferState
	Queued  uint32
	Pushed  uint32
	Message string
}

func (m *PushStatusReply) Append(b []byte) []byte {
	b = append(b, byte(m.State), 0, 0, 0)
	b = appendU32(b, m.Queued)
	b = appendU32(b, m.Pushed)
	return appendStr(b, m.Message)
}

func (m *PushStatusReply) Decode(body []byte) error {
	d := decoder{b: body}
	m.State = TransferState(d.u8("push status state"))
	if m.State >= transferLimit {
		d.fail("push status: unknown state %d", m.State)
	}
	d.zero(3, "push status reserved")
	m.Queued = d.u32("push status queued")
	m.Pushed = d.u32("push status pushed")
	m.Message = d.str("push status message")
	return d.end("push status reply")
}

// Receive carries pushed chunks from one daemon into another, like STORE
// with checksums: this metadata frame (FlagMore when there are chunks),
// then one data frame per size whose body is the chunk's bytes followed
// by their XXH3-64 (Checksum) as a u64 trailer, ChecksumSize bytes: the
// frame is size+ChecksumSize bytes long. The sender hashes a chunk while
// its bytes are on the way and the receiver while they arrive, instead
// of one after the other; the receiver checks each chunk before it
// becomes visible. It holds each chunk in RAM for up to HoldMS or until a
// client reads it. The reply's body is the u32 number of chunks stored.
//
//	0 8 transfer id
//	8 4 hold in milliseconds
//	12 . keys (raw)
//	 . 4 size count n, then n × u32 sizes
type Receive struct {
	Transfer uint64
	HoldMS   uint32
	Keys     Keys
	Sizes    []uint32
}

// ChecksumSize is the length of the checksum trailer of a RECEIVE data
// frame.
const ChecksumSize = 8

func (m *Receive) Append(b []byte) []byte {
	b = appendU64(b, m.Transfer)
	b = appendU32(b, m.HoldMS)
	b = m.Keys.Append(b)
	return appendU32s(b, m.Sizes)
}

func (m *Receive) Decode(body []byte) error {
	d := decoder{b: body}
	m.decode(&d)
	return d.end("receive")
}

// decode reads the fields of m, for Receive and ReceiveLayers.
func (m *Receive) decode(d *decoder) {
	m.Transfer = d.u64("receive transfer")
	m.HoldMS = d.u32("receive hold")
	m.Keys.decode(d)
	if d.err == nil && m.Keys.Kind != KindRaw {
		d.fail("receive: keys of kind %d, want raw keys", m.Keys.Kind)
	}
	m.Sizes = decodeU32s(d, m.Sizes, "receive sizes")
	for _, sz := range m.Sizes {
		if sz > MaxChunkBody-ChecksumSize && d.err == nil {
			d.fail("receive: a chunk of %d bytes, limit %d", sz, MaxChunkBody-ChecksumSize)
		}
	}
	if d.err == nil && len(m.Sizes) > len(m.Keys.Raw) {
		d.fail("receive: %d sizes for %d keys", len(m.Sizes), len(m.Keys.Raw))
	}
}

// Wait blocks until at least MinChunks of the chunks the keys name
// (after the skip, a leading run) are in the daemon's RAM — all of them
// when MinChunks is 0 or more than there are — or TimeoutMS passes; the
// reply is a WaitReply. A consumer's connector sends it before loading
// pushed chunks; with MinChunks it loads them as they come, which a
// receive budget smaller than the prompt requires.
//
//	0 4 timeout in milliseconds (capped by the daemon)
//	4 4 least chunks to wait for (0: all)
//	8 . keys
type Wait struct {
	TimeoutMS uint32
	MinChunks uint32
	Keys      Keys
}

func (m *Wait) Append(b []byte) []byte {
	return m.Keys.Append(appendU32(appendU32(b, m.TimeoutMS), m.MinChunks))
}

func (m *Wait) Decode(body []byte) error {
	d := decoder{b: body}
	m.TimeoutMS = d.u32("wait timeout")
	m.MinChunks = d.u32("wait least chunks")
	m.Keys.decode(&d)
	return d.end("wait")
}

// WaitReply says how many of the waited-for chunks are in RAM: the
// leading run after the skip, and the tokens they cover (token keys;
// else 0).
//
//	0 4 chunks
//	4 4 tokens
type WaitReply struct {
	Chunks uint32
	Tokens uint32
}

func (m *WaitReply) Append(b []byte) []byte { return appendU32(appendU32(b, m.Chunks), m.Tokens) }

func (m *WaitReply) Decode(body []byte) error {
	d := decoder{b: body}
	m.Chunks = d.u32("wait reply chunks")
	m.Tokens = d.u32("wait reply tokens")
	return d.end("wait reply")
}
