package wire

import (
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"

	"kvtier/chunk"
)

// Each message type has Append, which encodes it after b and returns the
// extended slice, and Decode, which parses a whole body into the receiver,
// reusing its slices so a connection that decodes into the same value
// again and again allocates nothing once warm.

// Hello opens every connection.
//
//	0 4 magic "KVT1"
//	4 2 version
//	6 2 flags, zero
//	8 . token (string): the shared secret of a TCP listener, else empty
//	. . client name (string), for logs
type Hello struct {
	Version uint16
	Token   string
	Name    string
}

func (m *Hello) Append(b []byte) []byte {
	b = append(b, Magic...)
	b = appendU16(b, m.Version)
	b = appendU16(b, 0)
	b = appendStr(b, m.Token)
	return appendStr(b, m.Name)
}

func (m *Hello) Decode(body []byte) error {
	d := decoder{b: body}
	if string(d.take(4, "hello magic")) != Magic && d.err == nil {
		d.fail("hello: bad magic")
	}
	m.Version = d.u16("hello version")
	d.zero(2, "hello flags")
	m.Token = d.str("hello token")
	m.Name = d.str("hello name")
	return d.end("hello")
}

// HelloReply answers Hello. On the local socket the arena's memfd rides
// along as SCM_RIGHTS ancillary data of the reply's first byte, and
// HasArena is set.
//
//	 0 2 version
//	 2 2 flags: bit 0 = an arena fd is attached
//	 4 4 chunk size in tokens
//	 8 8 arena size in bytes (map this many bytes of the fd)
//	16 4 default lease in milliseconds
//	20 4 largest chunk in bytes the daemon accepts
type HelloReply struct {
	Version     uint16
	HasArena    bool
	ChunkTokens uint32
	ArenaBytes  uint64
	LeaseMS     uint32
	MaxChunk    uint32
}

func (m *HelloReply) Append(b []byte) []byte {
	b = appendU16(b, m.Version)
	var flags uint16
	if m.HasArena {
		flags = 1
	}
	b = appendU16(b, flags)
	b = appendU32(b, m.ChunkTokens)
	b = appendU64(b, m.ArenaBytes)
	b = appendU32(b, m.LeaseMS)
	return appendU32(b, m.MaxChunk)
}

func (m *HelloReply) Decode(body []byte) error {
	d := decoder{b: body}
	m.Version = d.u16("hello reply version")
	flags := d.u16("hello reply flags")
	if flags&^1 != 0 {
		d.fail("hello reply: unknown flags %#x", flags)
	}
	m.HasArena = flags&1 != 0
	m.ChunkTokens = d.u32("hello reply chunk tokens")
	m.ArenaBytes = d.u64("hello reply arena bytes")
	m.LeaseMS = d.u32("hello reply lease")
	m.MaxChunk = d.u32("hello reply max chunk")
	return d.end("hello reply")
}

// Scope registers a cache scope on the connection; the reply's body is the
// u32 handle that keyed requests name it by. Handles are per connection
// and never 0.
//
//	0 4 world size
//	4 4 rank
//	8 . model, format, namespace (strings)
type Scope struct {
	WorldSize uint32
	Rank      uint32
	Model     string
	Format    string
	Namespace string
}

func (m *Scope) Append(b []byte) []byte {
	b = appendU32(b, m.WorldSize)
	b = appendU32(b, m.Rank)
	b = appendStr(b, m.Model)
	b = appendStr(b, m.Format)
	return appendStr(b, m.Namespace)
}

func (m *Scope) Decode(body []byte) error {
	d := decoder{b: body}
	m.WorldSize = d.u32("scope world size")
	m.Rank = d.u32("scope rank")
	m.Model = d.str("scope model")
	m.Format = d.str("scope format")
	m.Namespace = d.str("scope namespace")
	return d.end("scope")
}

// Chunk returns the scope as the chunk package's type.
func (m *Scope) Chunk() chunk.Scope {
	return chunk.Scope{Model: m.Model, WorldSize: int(m.WorldSize), Rank: int(m.Rank),
		Format: m.Format, Namespace: m.Namespace}
}

// KeyKind says how a request names its chunks.
type KeyKind uint8

const (
	// KindTokens: the prompt's token ids; the daemon cuts them into chunks
	// and hashes them under the request's scope.
	KindTokens KeyKind = 0
	// KindHashes: one 16-byte hash per chunk, computed by the engine (for
	// example SGLang's page hashes, cut to 16 bytes), under the request's
	// scope. The engine is responsible for chaining them.
	KindHashes KeyKind = 1
	// KindRaw: whole 24-byte chunk keys (u64 scope id, 16-byte hash), as
	// one daemon sends them to another; the scope handle must be 0.
	KindRaw KeyKind = 2
)

// Keys names the chunks of a keyed request.
//
//	 0 4 scope handle (0 only with KindRaw)
//	 4 1 kind
//	 5 3 reserved, zero
//	 8 4 skip: with KindTokens, leading tokens the engine already holds, a
//	       multiple of the chunk size (they are neither stored nor
//	       retrieved); zero otherwise
//	12 4 count of tokens or keys
//	16 . count × u32 tokens | count × 16-byte hashes | count × (u64 scope, 16-byte hash)
//	     | with KindShared, a u64 byte offset into the request buffer
type Keys struct {
	Scope  uint32
	Kind   KeyKind
	Skip   uint32
	Tokens []uint32
	Hashes []chunk.Hash
	Raw    []chunk.Key
	// Shared names KindShared tokens: where in the request buffer.
	Shared SharedTokens
	// Encoded is set instead of Tokens or Hashes by the decoders that
	// leave keys where they lie (Lookup.DecodeView, LookupBatch.DecodeView):
	// the keys as they are in the body, their 16 bytes of fixed fields
	// followed, for KindTokens, by the tokens' little-endian ids — the
	// layout chunk.Chunker.KeysInPlace hashes without a copy — or, for
	// KindHashes, by the 16-byte hashes (HashBytes), which the daemon turns
	// into chunk keys with one copy. It aliases the body. Append writes it
	// as it is, so a request can be sent from it.
	Encoded []byte
}

// keysFixed is the size of the keys' fixed fields, before the tokens or
// keys.
const keysFixed = 16

// TokenBytes returns the tokens' little-endian bytes in Encoded, or nil.
func (k *Keys) TokenBytes() []byte {
	if len(k.Encoded) < keysFixed {
		return nil
	}
	return k.Encoded[keysFixed:]
}

// HashBytes returns the hashes' bytes in Encoded, 16 per chunk, or nil.
func (k *Keys) HashBytes() []byte { return k.TokenBytes() }

// Len is the number of tokens (KindTokens, KindShared) or keys.
func (k *Keys) Len() int {
	switch k.Kind {
	case KindTokens:
		if k.Encoded != nil {
			return len(k.TokenBytes()) / 4
		}
		return len(k.Tokens)
	case KindHashes:
		if k.Encoded != nil {
			return len(k.HashBytes()) / chunk.HashSize
		}
		return len(k.Hashes)
	case KindShared:
		return int(k.Shared.Count)
	}
	return len(k.Raw)
}

func (k *Keys) Append(b []byte) []byte {
	b = appendU32(b, k.Scope)
	b = append(b, byte(k.Kind), 0, 0, 0)
	b = appendU32(b, k.Skip)
	b = appendU32(b, uint32(k.Len()))
	switch k.Kind {
	case KindTokens:
		if k.Encoded != nil {
			return append(b, k.TokenBytes()...)
		}
		b = appendU32Array(b, k.Tokens)
	case KindHashes:
		if k.Encoded != nil {
			return append(b, k.HashBytes()...)
		}
		for i := range k.Hashes {
			b = append(b, k.Hashes[i][:]...)
		}
	case KindShared:
		b = appendU64(b, k.Shared.Offset)
	default:
		for i := range k.Raw {
			b = appendU64(b, k.Raw[i].Scope)
			b = append(b, k.Raw[i].Hash[:]...)
		}
	}
	return b
}

func (k *Keys) decode(d *decoder) {
	at := d.off
	k.Scope = d.u32("keys scope")
	k.Kind = KeyKind(d.u8("keys kind"))
	d.zero(3, "keys reserved")
	k.Skip = d.u32("keys skip")
	k.Tokens, k.Hashes, k.Raw, k.Shared, k.Encoded = k.Tokens[:0], k.Hashes[:0], k.Raw[:0], SharedTokens{}, nil
	switch k.Kind {
	case KindTokens:
		n := d.count(4, "keys tokens")
		p := d.take(4*n, "keys tokens")
		switch {
		case p == nil:
		case d.view:
			k.Encoded = d.b[at:d.off:d.off]
		default:
			k.Tokens = decodeU32Array(k.Tokens, p, n)
		}
	case KindHashes:
		n := d.count(16, "keys hashes")
		switch p := d.take(16*n, "keys hashes"); {
		case p == nil:
		case d.view:
			k.Encoded = d.b[at:d.off:d.off]
		default:
			k.Hashes = slices.Grow(k.Hashes, n)[:n]
			for i := range k.Hashes {
				k.Hashes[i] = chunk.Hash(p[16*i : 16*i+16])
			}
		}
	case KindRaw:
		n := d.count(24, "keys raw")
		p := d.take(24*n, "keys raw")
		for i := 0; i < n && p != nil; i++ {
			e := p[24*i:]
			k.Raw = append(k.Raw, chunk.Key{Scope: binary.LittleEndian.Uint64(e), Hash: chunk.Hash(e[8:24])})
		}
	case KindShared:
		k.Shared.decode(d)
	default:
		d.fail("keys: unknown kind %d", k.Kind)
	}
	if d.err == nil && k.Kind != KindTokens && k.Kind != KindShared && k.Skip != 0 {
		d.fail("keys: skip %d is only allowed with token keys", k.Skip)
	}
	if d.err == nil && (k.Kind == KindRaw) != (k.Scope == 0) {
		d.fail("keys: scope handle %d with kind %d (handle 0 goes with raw keys only)", k.Scope, k.Kind)
	}
}

// Lookup asks how long a prompt's cached prefix is. With LeaseMS > 0 the
// reply's lease keeps the hit chunks resident until it is released, it
// expires, or the connection closes.
//
//	0 4 lease in milliseconds (0: no lease)
//	4 . keys
type Lookup struct {
	LeaseMS uint32
	Keys    Keys
}

func (m *Lookup) Append(b []byte) []byte {
	return m.Keys.Append(appendU32(b, m.LeaseMS))
}

func (m *Lookup) Decode(body []byte) error {
	return m.decode(decoder{b: body})
}

// DecodeView is Decode that leaves token ids and kind-1 hashes in body:
// such keys come back in Keys.Encoded, not Tokens or Hashes, so m is valid
// only as long as body is. The daemon answers a LOOKUP from the bytes it
// read, with no copy.
func (m *Lookup) DecodeView(body []byte) error {
	return m.decode(decoder{b: body, view: true})
}

func (m *Lookup) decode(d decoder) error {
	m.LeaseMS = d.u32("lookup lease")
	m.Keys.decode(&d)
	return d.end("lookup")
}

// LookupReply says how much is cached. Tokens and chunks count from the
// prompt's first token (from the first key for hash keys, where Tokens is
// zero); ByTier[i] is the number of those chunks tier i (0 = RAM) would
// serve: each chunk counts once, for the fastest tier holding it.
//
//	 0 4 hit tokens
//	 4 4 hit chunks
//	 8 8 lease id (0: none)
//	16 1 tier count n (≤ 8)
//	17 . n × u32 chunks per tier
type LookupReply struct {
	Tokens uint32
	Chunks uint32
	Lease  uint64
	ByTier []uint32
}

func (m *LookupReply) Append(b []byte) []byte {
	b = appendU32(b, m.Tokens)
	b = appendU32(b, m.Chunks)
	b = appendU64(b, m.Lease)
	n := min(len(m.ByTier), MaxTiers)
	b = append(b, byte(n))
	for _, c := range m.ByTier[:n] {
		b = appendU32(b, c)
	}
	return b
}

func (m *LookupReply) Decode(body []byte) error {
	d := decoder{b: body}
	m.decode(&d)
	return d.end("lookup reply")
}

func (m *LookupReply) decode(d *decoder) {
	m.Tokens = d.u32("lookup reply tokens")
	m.Chunks = d.u32("lookup reply chunks")
	m.Lease = d.u64("lookup reply lease")
	n := int(d.u8("lookup reply tiers"))
	if n > MaxTiers {
		d.fail("lookup reply: %d tiers, limit %d", n, MaxTiers)
	}
	m.ByTier = m.ByTier[:0]
	for i := 0; i < n && d.err == nil; i++ {
		m.ByTier = append(m.ByTier, d.u32("lookup reply tier"))
	}
}

// PrepareStore reserves arena space for chunks the client will write in
// place. Sizes[j] is the byte length of the j-th chunk after the skip (for
// token keys) or of key j; a client may store fewer chunks than the keys
// name, never more.
//
//	0 4 lease in milliseconds (0: the daemon's default)
//	4 . keys
//	. 4 size count n
//	. . n × u32 sizes
type PrepareStore struct {
	LeaseMS uint32
	Keys    Keys
	Sizes   []uint32
}

func (m *PrepareStore) Append(b []byte) []byte {
	b = m.Keys.Append(appendU32(b, m.LeaseMS))
	return appendU32s(b, m.Sizes)
}

func (m *PrepareStore) Decode(body []byte) error {
	d := decoder{b: body}
	m.LeaseMS = d.u32("prepare store lease")
	m.Keys.decode(&d)
	m.Sizes = decodeU32s(&d, m.Sizes, "prepare store sizes")
	return d.end("prepare store")
}

// SlotState says what a client should do with a slot.
type SlotState uint8

const (
	SlotWrite  SlotState = 0 // write the chunk's bytes at Offset
	SlotStored SlotState = 1 // already cached: nothing to write
)

// Slot is a place in the arena.
//
//	 0 8 offset in the arena
//	 8 4 length
//	12 1 state
//	13 3 reserved, zero
type Slot struct {
	Offset uint64
	Len    uint32
	State  SlotState
}

// Slots is the reply to PREPARE_STORE and PREPARE_RETRIEVE: a lease over
// the leading chunks that got a slot.
//
//	0 8 lease id (0 when there are no slots)
//	8 4 tokens the slots cover (PREPARE_RETRIEVE with token keys; else 0)
//	. 4 slot count n
//	. . n × slot
type Slots struct {
	Lease  uint64
	Tokens uint32
	Slots  []Slot
}

func (m *Slots) Append(b []byte) []byte {
	b = appendU64(b, m.Lease)
	b = appendU32(b, m.Tokens)
	b = appendU32(b, uint32(len(m.Slots)))
	for _, s := range m.Slots {
		b = appendU64(b, s.Offset)
		b = appendU32(b, s.Len)
		b = append(b, byte(s.State), 0, 0, 0)
	}
	return b
}

func (m *Slots) Decode(body []byte) error {
	d := decoder{b: body}
	m.Lease = d.u64("slots lease")
	m.Tokens = d.u32("slots tokens")
	n := d.count(16, "slots")
	m.Slots = m.Slots[:0]
	for i := 0; i < n && d.err == nil; i++ {
		s := Slot{Offset: d.u64("slot offset"), Len: d.u32("slot length"), State: SlotState(d.u8("slot state"))}
		d.zero(3, "slot reserved")
		if s.State > SlotStored {
			d.fail("slot: unknown state %d", s.State)
		}
		m.Slots = append(m.Slots, s)
	}
	return d.end("slots")
}

// Commit makes the first Count slots of a PREPARE_STORE lease visible and
// releases the lease; slots past Count are dropped unseen. The reply's body
// is the u32 number of chunks committed.
//
//	0 8 lease id
//	8 4 count
type Commit struct {
	Lease uint64
	Count uint32
}

func (m *Commit) Append(b []byte) []byte { return appendU32(appendU64(b, m.Lease), m.Count) }

func (m *Commit) Decode(body []byte) error {
	d := decoder{b: body}
	m.Lease = d.u64("commit lease")
	m.Count = d.u32("commit count")
	return d.end("commit")
}

// PrepareRetrieve promotes the keys' chunks into RAM and leases them; the
// reply (Slots) gives their offsets. RELEASE ends the lease.
//
//	0 4 lease in milliseconds (0: the daemon's default)
//	4 . keys
type PrepareRetrieve struct {
	LeaseMS uint32
	Keys    Keys
}

func (m *PrepareRetrieve) Append(b []byte) []byte {
	return m.Keys.Append(appendU32(b, m.LeaseMS))
}

func (m *PrepareRetrieve) Decode(body []byte) error {
	d := decoder{b: body}
	m.LeaseMS = d.u32("prepare retrieve lease")
	m.Keys.decode(&d)
	return d.end("prepare retrieve")
}

// Lease names a lease: the body of RELEASE, and of RENEW with a new
// duration.
//
//	0 8 lease id
//	8 4 milliseconds (RENEW only)
type Lease struct {
	ID uint64
	MS uint32
}

func (m *Lease) Append(b []byte, renew bool) []byte {
	b = appendU64(b, m.ID)
	if renew {
		b = appendU32(b, m.MS)
	}
	return b
}

func (m *Lease) Decode(body []byte, renew bool) error {
	d := decoder{b: body}
	m.ID = d.u64("lease id")
	if renew {
		m.MS = d.u32("lease milliseconds")
	}
	return d.end("lease")
}

// KeysOnly is the body of PREFETCH, RETRIEVE and SIZES: just keys.
// PREFETCH's reply is one byte, 1 if the prefetch was queued; RETRIEVE's is
// a DataHeader followed by the chunks' data frames; SIZES's is a DataHeader
// alone, with the sizes of the leading cached chunks and no data frames.
type KeysOnly struct{ Keys Keys }

func (m *KeysOnly) Append(b []byte) []byte { return m.Keys.Append(b) }

func (m *KeysOnly) Decode(body []byte) error {
	d := decoder{b: body}
	m.Keys.decode(&d)
	return d.end("keys")
}

// Store carries chunks inline, for connections without the shared arena:
// this frame has FlagMore and is followed by one data frame per size, each
// body exactly that many bytes, the last without FlagMore. The reply's
// body is the u32 number of chunks stored.
//
//	0 . keys
//	. 4 size count n
//	. . n × u32 sizes
type Store struct {
	Keys  Keys
	Sizes []uint32
}

func (m *Store) Append(b []byte) []byte { return appendU32s(m.Keys.Append(b), m.Sizes) }

func (m *Store) Decode(body []byte) error {
	d := decoder{b: body}
	m.Keys.decode(&d)
	m.Sizes = decodeU32s(&d, m.Sizes, "store sizes")
	return d.end("store")
}

// DataHeader is the first frame of a RETRIEVE reply: the chunks found (a
// prefix of those asked for) and their sizes. With at least one chunk it
// has FlagMore and one data frame per size follows.
//
//	0 4 tokens covered (token keys; else 0)
//	4 4 size count n
//	8 . n × u32 sizes
type DataHeader struct {
	Tokens uint32
	Sizes  []uint32
}

func (m *DataHeader) Append(b []byte) []byte { return appendU32s(appendU32(b, m.Tokens), m.Sizes) }

func (m *DataHeader) Decode(body []byte) error {
	d := decoder{b: body}
	m.Tokens = d.u32("data header tokens")
	m.Sizes = decodeU32s(&d, m.Sizes, "data header sizes")
	return d.end("data header")
}

// PeerDataHeader is the metadata reply to a RETRIEVE sent with FlagPeer:
// the DataHeader, then a counted array of u64 checksums, one per chunk,
// each the XXH3-64 of the chunk's bytes (Checksum) taken from the
// daemon's own copy before it is sent.
//
//	0 …  DataHeader
//	… 4  count, equal to the number of sizes
//	… 8× checksums
type PeerDataHeader struct {
	DataHeader
	Sums []uint64
}

func (m *PeerDataHeader) Append(b []byte) []byte {
	b = m.DataHeader.Append(b)
	b = appendU32(b, uint32(len(m.Sums)))
	for _, x := range m.Sums {
		b = appendU64(b, x)
	}
	return b
}

func (m *PeerDataHeader) Decode(body []byte) error {
	d := decoder{b: body}
	m.Tokens = d.u32("data header tokens")
	m.Sizes = decodeU32s(&d, m.Sizes, "data header sizes")
	n := d.count(8, "data header checksums")
	m.Sums = m.Sums[:0]
	for i := 0; i < n && d.err == nil; i++ {
		m.Sums = append(m.Sums, d.u64("data header checksum"))
	}
	if d.err == nil && len(m.Sums) != len(m.Sizes) {
		d.fail("%d checksums for %d chunks", len(m.Sums), len(m.Sizes))
	}
	return d.end("peer data header")
}

// Checksum is the checksum of a chunk's bytes in a PeerDataHeader.
func Checksum(data []byte) uint64 { return xxh3.Hash(data) }

func appendU32s(b []byte, v []uint32) []byte {
	b = appendU32(b, uint32(len(v)))
	for _, x := range v {
		b = appendU32(b, x)
	}
	return b
}

// decodeU32s reads a counted u32 array into dst and checks each value
// against MaxChunkBody, since these are always chunk sizes.
func decodeU32s(d *decoder, dst []uint32, what string) []uint32 {
	n := d.count(4, what)
	dst = dst[:0]
	for i := 0; i < n && d.err == nil; i++ {
		v := d.u32(what)
		if v > MaxChunkBody {
			d.fail("%s: %d bytes, limit %d", what, v, MaxChunkBody)
		}
		dst = append(dst, v)
	}
	return dst
}

// Flush asks the daemon to make everything stored before it durable in the
// tiers below RAM; the reply is a FlushReply.
//
//	0 4 longest wait in milliseconds; 0 means the daemon's default
type Flush struct {
	TimeoutMS uint32
}

func (m *Flush) Append(b []byte) []byte { return appendU32(b, m.TimeoutMS) }

func (m *Flush) Decode(body []byte) error {
	d := decoder{b: body}
	m.TimeoutMS = d.u32("flush timeout")
	return d.end("flush")
}

// FlushReply reports, for each tier below RAM, fastest first, what of the
// chunks stored before the FLUSH it does not hold yet. Every such chunk is
// in every listed tier when all counts are 0.
//
//	0 1 tier count n, at most MaxTiers
//	1 . n times: name (string), u32 pending, u32 redone, u32 missing
type FlushReply struct {
	Tiers []FlushTier
}

// FlushTier is one tier's part of a FlushReply (tier.TierSync).
type FlushTier struct {
	Name    string
	Pending uint32 // writes still queued when the wait ended
	Redone  uint32 // dropped or refused writes written again
	Missing uint32 // chunks the tier lacks for good
}

// Durable reports whether every tier holds everything stored before the
// FLUSH: no write pending, none missing.
func (m *FlushReply) Durable() bool {
	for _, t := range m.Tiers {
		if t.Pending != 0 || t.Missing != 0 {
			return false
		}
	}
	return true
}

func (m *FlushReply) Append(b []byte) []byte {
	n := min(len(m.Tiers), MaxTiers)
	b = append(b, byte(n))
	for _, t := range m.Tiers[:n] {
		b = appendStr(b, t.Name)
		b = appendU32(b, t.Pending)
		b = appendU32(b, t.Redone)
		b = appendU32(b, t.Missing)
	}
	return b
}

func (m *FlushReply) Decode(body []byte) error {
	d := decoder{b: body}
	n := int(d.u8("flush reply tiers"))
	if n > MaxTiers {
		d.fail("flush reply: %d tiers, limit %d", n, MaxTiers)
	}
	m.Tiers = m.Tiers[:0]
	for i := 0; i < n && d.err == nil; i++ {
		m.Tiers = append(m.Tiers, FlushTier{Name: d.str("flush reply tier name"),
			Pending: d.u32("flush reply pending"), Redone: d.u32("flush reply redone"),
			Missing: d.u32("flush reply missing")})
	}
	return d.end("flush reply")
}
