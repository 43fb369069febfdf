package wire

// Per-layer saves (docs/layerwise.md). STORE_LAYER tells the daemon that
// one layer of every chunk of a PREPARE_STORE lease is in its slot, so the
// daemon may write that layer to its disk tier before the next layer
// arrives. It is one-way: the daemon never replies, so the connector sends
// it from the forward pass without waiting for a round trip. It is a hint:
// a notice for an unknown, expired or committed lease, or one the daemon
// cannot act on, is dropped, and COMMIT_STORE writes whatever no notice
// covered. Only a body that does not decode closes the connection, since a
// reply the client does not expect would put it out of step.
const OpStoreLayer Op = 26

// StoreLayer says that layer Layer of every chunk of store lease Lease is
// final in its slot: the client will not write those bytes again. A chunk
// is Parts × Layers equal spans, part-major, as for
// PREPARE_RETRIEVE_LAYERS; Layers and Parts 0 take the geometry from the
// scope's format tag.
//
//	 0 8 lease id
//	 8 4 layer (layer < layers when layers is given, < MaxLayers otherwise)
//	12 2 layers (0, or 1..65535 with parts)
//	14 1 parts (0, 1 or 2)
//	15 1 reserved, zero
type StoreLayer struct {
	Lease  uint64
	Layer  uint32
	Layers uint16
	Parts  uint8
}

// StoreLayerSize is the length of a STORE_LAYER body.
const StoreLayerSize = 16

func (m *StoreLayer) Append(b []byte) []byte {
	b = appendU16(appendU32(appendU64(b, m.Lease), m.Layer), m.Layers)
	return append(b, m.Parts, 0)
}

func (m *StoreLayer) Decode(body []byte) error {
	d := decoder{b: body}
	m.Lease = d.u64("store layer lease")
	m.Layer = d.u32("store layer layer")
	m.Layers = d.u16("store layer layers")
	m.Parts = d.u8("store layer parts")
	d.zero(1, "store layer reserved")
	switch {
	case d.err != nil:
	case m.Parts > 2 || (m.Layers == 0) != (m.Parts == 0):
		d.fail("store layer: %d layers of %d parts; want both 0, or layers and 1 or 2 parts", m.Layers, m.Parts)
	case m.Layers > 0 && m.Layer >= uint32(m.Layers):
		d.fail("store layer: layer %d of %d", m.Layer, m.Layers)
	case m.Layer >= MaxLayers:
		d.fail("store layer: layer %d, at most %d", m.Layer, MaxLayers-1)
	}
	return d.end("store layer")
}
