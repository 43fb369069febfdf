package wire

import "unsafe"

// Gather is an encoding of lookups whose token ids stay in the caller's
// slices, for a client that sends them with one writev instead of
// copying them into its frame: the frame holds every other byte, and
// Tokens[i] goes right before the frame's byte Cuts[i]. A prompt of 4,096
// tokens is 16 KiB that the client then does not copy. Token ids are
// little-endian on the wire, so only a little-endian host can send them
// as they lie in memory; elsewhere, and for prompts of fewer than
// gatherMin tokens (cheaper to copy than to describe), they are copied
// into the frame as Append does.
type Gather struct {
	Cuts   []int
	Tokens [][]byte
}

// gatherMin is the fewest tokens a Gather leaves in place.
const gatherMin = 64

// Reset empties g for another frame, keeping its slices' memory.
func (g *Gather) Reset() {
	clear(g.Tokens) // not kept past the frame: they hold the caller's slices
	g.Cuts, g.Tokens = g.Cuts[:0], g.Tokens[:0]
}

// Bytes returns how many bytes g's tokens add to the frame.
func (g *Gather) Bytes() int {
	n := 0
	for _, t := range g.Tokens {
		n += len(t)
	}
	return n
}

// AppendGather is Append into a frame and g.
func (m *Lookup) AppendGather(b []byte, g *Gather) []byte {
	return m.Keys.appendGather(appendU32(b, m.LeaseMS), g)
}

// AppendGather is Append into a frame and g.
func (m *LookupBatch) AppendGather(b []byte, g *Gather) []byte {
	b = appendU32(b, uint32(len(m.Lookups)))
	for i := range m.Lookups {
		b = m.Lookups[i].AppendGather(b, g)
	}
	return b
}

// appendGather is Append that leaves token ids for g when it can.
func (k *Keys) appendGather(b []byte, g *Gather) []byte {
	if k.Kind != KindTokens || k.Encoded != nil || !hostLittleEndian || len(k.Tokens) < gatherMin {
		return k.Append(b)
	}
	b = appendU32(b, k.Scope)
	b = append(b, byte(k.Kind), 0, 0, 0)
	b = appendU32(b, k.Skip)
	b = appendU32(b, uint32(len(k.Tokens)))
	g.Cuts = append(g.Cuts, len(b))
	g.Tokens = append(g.Tokens, unsafe.Slice((*byte)(unsafe.Pointer(&k.Tokens[0])), 4*len(k.Tokens)))
	return b
}
