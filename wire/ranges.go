package wire

// RETRIEVE_RANGES reads parts of chunks: a layerwise reader on another
// daemon (a P2P tier) asks for the byte ranges of the layers it needs next
// and checks each range on its own, since it never holds the whole chunk
// before its first layer counts as ready.
const OpRetrieveRanges Op = 25

// ByteRange names bytes [From, To) of the chunk at index Key of a
// RetrieveRanges request's keys (counted after the skip).
type ByteRange struct {
	Key  uint32
	From uint32
	To   uint32
}

// MaxRanges bounds the ranges of one RETRIEVE_RANGES request.
const MaxRanges = 1 << 16

// RetrieveRanges asks for byte ranges of the keys' chunks. Ranges are in
// order: by key index, not decreasing, and each non-empty (From < To ≤
// MaxChunkBody). A key no range names is still looked up, so the reply's
// chunk count says how far the prefix is cached.
//
//	0 . keys
//	. 4 range count n (≤ MaxRanges)
//	. . n × (u32 key index, u32 from, u32 to)
type RetrieveRanges struct {
	Keys   Keys
	Ranges []ByteRange
}

func (m *RetrieveRanges) Append(b []byte) []byte {
	b = m.Keys.Append(b)
	b = appendU32(b, uint32(len(m.Ranges)))
	for _, r := range m.Ranges {
		b = appendU32(appendU32(appendU32(b, r.Key), r.From), r.To)
	}
	return b
}

func (m *RetrieveRanges) Decode(body []byte) error {
	d := decoder{b: body}
	m.Keys.decode(&d)
	n := d.count(12, "retrieve ranges")
	if n > MaxRanges {
		d.fail("retrieve ranges: %d ranges, limit %d", n, MaxRanges)
	}
	m.Ranges = m.Ranges[:0]
	keys := uint32(m.Keys.Len())
	for i := 0; i < n && d.err == nil; i++ {
		r := ByteRange{Key: d.u32("range key"), From: d.u32("range from"), To: d.u32("range to")}
		switch {
		case d.err != nil:
		case m.Keys.Kind != KindTokens && m.Keys.Kind != KindShared && r.Key >= keys:
			d.fail("range %d: key %d of %d", i, r.Key, keys)
		case r.From >= r.To || r.To > MaxChunkBody:
			d.fail("range %d: bytes [%d, %d)", i, r.From, r.To)
		case i > 0 && r.Key < m.Ranges[i-1].Key:
			d.fail("range %d: key %d after key %d", i, r.Key, m.Ranges[i-1].Key)
		}
		m.Ranges = append(m.Ranges, r)
	}
	return d.end("retrieve ranges")
}

// RangeDataHeader is the metadata reply to RETRIEVE_RANGES: the DataHeader
// of the leading cached chunks (tokens covered, whole-chunk sizes), then a
// counted array of u64 checksums, one per range served: the XXH3-64
// (Checksum) of that range's bytes. The ranges served are those of the
// request whose key index is below the chunk count, in order; one data
// frame per range follows, FlagMore on all but the last, and the metadata
// frame has FlagMore when there is at least one.
//
//	0 …  DataHeader
//	… 4  count m
//	… 8× checksums
type RangeDataHeader struct {
	DataHeader
	Sums []uint64
}

func (m *RangeDataHeader) Append(b []byte) []byte {
	b = m.DataHeader.Append(b)
	b = appendU32(b, uint32(len(m.Sums)))
	for _, x := range m.Sums {
		b = appendU64(b, x)
	}
	return b
}

func (m *RangeDataHeader) Decode(body []byte) error {
	d := decoder{b: body}
	m.Tokens = d.u32("range header tokens")
	m.Sizes = decodeU32s(&d, m.Sizes, "range header sizes")
	n := d.count(8, "range header checksums")
	if n > MaxRanges {
		d.fail("range header: %d checksums, limit %d", n, MaxRanges)
	}
	m.Sums = m.Sums[:0]
	for i := 0; i < n && d.err == nil; i++ {
		m.Sums = append(m.Sums, d.u64("range header checksum"))
	}
	return d.end("range header")
}

// Served is how many of ranges (sorted by key, as RetrieveRanges checks)
// name one of the first chunks chunks.
func Served(ranges []ByteRange, chunks int) int {
	n := 0
	for n < len(ranges) && int(ranges[n].Key) < chunks {
		n++
	}
	return n
}
