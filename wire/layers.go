package wire

// Layerwise retrieval (docs/layerwise.md). PREPARE_RETRIEVE_LAYERS is
// PREPARE_RETRIEVE with the chunks' layer geometry, and has its reply
// (Slots), but the daemon answers before lower-tier chunks are read: it
// reserves their slots and fills them layer by layer behind the reply.
// LAYER_WAIT then waits for one layer of every chunk.
const (
	OpPrepareRetrieveLayers Op = 23
	OpLayerWait             Op = 24
)

// MaxLayers bounds a LAYER_WAIT's layer index and a geometry's layers.
const MaxLayers = 1 << 16

// PrepareRetrieveLayers asks for the keys' chunks layer by layer. A chunk
// is Parts × Layers equal spans, part-major: Parts 2 for KV_2LTD (every
// layer's K, then every layer's V), 1 for KV_MLA_FMT. Layers and Parts 0
// take the geometry from the scope's format tag (dtype/layout/LxHxD);
// a scope without one is then read whole, as by PREPARE_RETRIEVE.
//
//	0 4 lease in milliseconds (0: the daemon's default)
//	4 2 layers (0, or 1..65535 with parts)
//	6 1 parts (0, 1 or 2)
//	7 1 reserved, zero
//	8 . keys
type PrepareRetrieveLayers struct {
	LeaseMS uint32
	Layers  uint16
	Parts   uint8
	Keys    Keys
}

func (m *PrepareRetrieveLayers) Append(b []byte) []byte {
	b = appendU16(appendU32(b, m.LeaseMS), m.Layers)
	return m.Keys.Append(append(b, m.Parts, 0))
}

func (m *PrepareRetrieveLayers) Decode(body []byte) error {
	d := decoder{b: body}
	m.LeaseMS = d.u32("prepare retrieve layers lease")
	m.Layers = d.u16("prepare retrieve layers layers")
	m.Parts = d.u8("prepare retrieve layers parts")
	d.zero(1, "prepare retrieve layers reserved")
	if d.err == nil && (m.Parts > 2 || (m.Layers == 0) != (m.Parts == 0)) {
		d.fail("prepare retrieve layers: %d layers of %d parts; want both 0, or layers and 1 or 2 parts", m.Layers, m.Parts)
	}
	m.Keys.decode(&d)
	return d.end("prepare retrieve layers")
}

// LayerWait asks to wait until layer Layer of every usable chunk of a
// PREPARE_RETRIEVE_LAYERS lease is in its slot, at most until the lease's
// deadline. The reply is a LayerReady.
//
//	0 8 lease id
//	8 4 layer (0 ≤ layer < MaxLayers)
type LayerWait struct {
	Lease uint64
	Layer uint32
}

func (m *LayerWait) Append(b []byte) []byte { return appendU32(appendU64(b, m.Lease), m.Layer) }

func (m *LayerWait) Decode(body []byte) error {
	d := decoder{b: body}
	m.Lease = d.u64("layer wait lease")
	m.Layer = d.u32("layer wait layer")
	if d.err == nil && m.Layer >= MaxLayers {
		d.fail("layer wait: layer %d, at most %d", m.Layer, MaxLayers-1)
	}
	return d.end("layer wait")
}

// LayerReady answers LAYER_WAIT. Usable counts the lease's slots, from
// the first, whose chunks have not failed so far: their ready layers are
// in place and verified. It only shrinks: a later LAYER_WAIT may report
// fewer when a later layer of one of them fails to load, and a client must
// recompute the chunks of the slots from usable on, whatever layers of
// them it already copied. Ready is how many layers, from layer 0, are in
// place in every usable chunk: more than the layer asked for unless the
// wait ran out (the lease's deadline), in which case the reply is still OK
// and the client treats the layers not ready as failed. A lease with
// nothing to read in the background (every chunk was in RAM, or the scope
// is not layered) answers 0xFFFFFFFF: the client need not wait for any
// later layer.
//
//	0 4 usable chunks
//	4 4 layers ready
type LayerReady struct {
	Usable uint32
	Ready  uint32
}

func (m *LayerReady) Append(b []byte) []byte { return appendU32(appendU32(b, m.Usable), m.Ready) }

func (m *LayerReady) Decode(body []byte) error {
	d := decoder{b: body}
	m.Usable = d.u32("layer ready usable")
	m.Ready = d.u32("layer ready layers")
	return d.end("layer ready")
}
