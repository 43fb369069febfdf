package wire

import (
	"cmp"
	"slices"
)

// RECEIVE_LAYERS is RECEIVE with each chunk sent as byte ranges, each
// range followed by its own checksum: a producer sends a chunk layer by
// layer (K_0, V_0, K_1, V_1, …) so that the consumer can count layer 0 as
// arrived and verified long before the chunk's last byte.
const OpReceiveLayers Op = 27

// ReceiveLayers is a Receive whose chunks arrive as ranges. The body is
// Receive's, then the range table: the ranges in the order their data
// frames follow, each naming a chunk by its index in Sizes. The ranges of
// each chunk must cover it exactly once (no gap, no overlap), in any order,
// so that a chunk whose ranges all arrived and matched their checksums has
// every byte written once; every chunk has at least one range.
//
//	0 . Receive body (transfer, hold, raw keys, sizes)
//	. 4 range count n (≤ MaxRanges; 0 only with no sizes)
//	. . n × (u32 chunk index, u32 from, u32 to)
//
// Each range's data frame (op RECEIVE_LAYERS, FlagMore on all but the
// last) holds to − from bytes and then their XXH3-64 (Checksum) as a u64,
// as a RECEIVE data frame does for a whole chunk. The reply is a u32: how
// many leading chunks were stored.
type ReceiveLayers struct {
	Receive
	Ranges []ByteRange

	sorted []ByteRange // Decode's scratch for the coverage check
}

func (m *ReceiveLayers) Append(b []byte) []byte {
	b = m.Receive.Append(b)
	b = appendU32(b, uint32(len(m.Ranges)))
	for _, r := range m.Ranges {
		b = appendU32(appendU32(appendU32(b, r.Key), r.From), r.To)
	}
	return b
}

func (m *ReceiveLayers) Decode(body []byte) error {
	d := decoder{b: body}
	m.Receive.decode(&d)
	n := d.count(12, "receive ranges")
	if n > MaxRanges {
		d.fail("receive ranges: %d ranges, limit %d", n, MaxRanges)
	}
	for j, sz := range m.Sizes {
		if sz == 0 && d.err == nil {
			d.fail("receive ranges: chunk %d is empty", j)
		}
	}
	m.Ranges = m.Ranges[:0]
	chunks := uint32(len(m.Sizes))
	for i := 0; i < n && d.err == nil; i++ {
		r := ByteRange{Key: d.u32("range chunk"), From: d.u32("range from"), To: d.u32("range to")}
		switch {
		case d.err != nil:
		case r.Key >= chunks:
			d.fail("range %d: chunk %d of %d", i, r.Key, chunks)
		case r.From >= r.To || r.To > m.Sizes[r.Key]:
			d.fail("range %d: bytes [%d, %d) of a chunk of %d", i, r.From, r.To, m.Sizes[r.Key])
		}
		m.Ranges = append(m.Ranges, r)
	}
	if d.err == nil {
		if err := m.checkCover(); err != "" {
			d.fail("receive ranges: %s", err)
		}
	}
	return d.end("receive layers")
}

// checkCover reports, as a message, a chunk its ranges do not cover
// exactly once; "" when all are.
func (m *ReceiveLayers) checkCover() string {
	m.sorted = append(m.sorted[:0], m.Ranges...)
	slices.SortFunc(m.sorted, func(a, b ByteRange) int {
		if c := cmp.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Compare(a.From, b.From)
	})
	next := 0 // the chunk whose ranges come next
	var at uint32
	for _, r := range m.sorted {
		if int(r.Key) != next {
			if int(r.Key) != next+1 || at != m.Sizes[next] {
				return "a chunk's ranges leave a gap"
			}
			next, at = next+1, 0
		}
		if r.From != at {
			if r.From < at {
				return "ranges of a chunk overlap"
			}
			return "a chunk's ranges leave a gap"
		}
		at = r.To
	}
	if len(m.Sizes) > 0 && (next != len(m.Sizes)-1 || at != m.Sizes[next]) {
		return "a chunk's ranges leave a gap"
	}
	return ""
}

// RangesFor sets m.Ranges to the byte ranges of m's chunks in layer order
// under a geometry of layers × parts equal spans per chunk (part-major, as
// in KV_2LTD): for each layer, for each chunk, for each part, the span.
// Consecutive layers of a part go in one range, groups of step layers at
// a time. It reports false, leaving the ranges empty, when a chunk does
// not split into equal spans.
func (m *ReceiveLayers) RangesFor(layers, parts, step int) bool {
	m.Ranges = m.Ranges[:0]
	if layers <= 0 || parts <= 0 || step <= 0 {
		return false
	}
	for _, size := range m.Sizes {
		if size == 0 || int(size)%(layers*parts) != 0 {
			return false
		}
	}
	for l := 0; l < layers; l += step {
		k := min(step, layers-l)
		for j, size := range m.Sizes {
			span := int(size) / (layers * parts)
			for p := 0; p < parts; p++ {
				from := (p*layers + l) * span
				m.Ranges = append(m.Ranges, ByteRange{Key: uint32(j), From: uint32(from), To: uint32(from + k*span)})
			}
		}
	}
	return true
}
