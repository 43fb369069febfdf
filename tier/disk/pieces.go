package disk

import "github.com/zeebo/xxh3"

// pieceCheck verifies a payload that arrives in order, in buffers of any
// size, against its header's piece checksums: it hashes each piece as its
// bytes land and compares it when the piece is complete. A version 1
// record is one piece, so this is the whole-payload checksum there. The
// header is passed to each call rather than kept, so that a check and the
// header it reads can both stay on a Get's stack.
type pieceCheck struct {
	n     int64 // payload length
	pos   int64 // bytes seen
	piece int   // piece being hashed
	d     xxh3.Hasher
	ok    bool
}

// start begins checking a payload of n bytes.
func (c *pieceCheck) start(n int64) {
	c.n, c.pos, c.piece, c.ok = n, 0, 0, true
	c.d.Reset()
}

// write feeds the next bytes of the payload, described by h, and reports
// whether every piece completed so far matched.
func (c *pieceCheck) write(h *header, b []byte) bool {
	p := h.pieceLen()
	for len(b) > 0 {
		end := min(int64(c.piece+1)*p, c.n) // where the current piece ends
		take := min(int64(len(b)), end-c.pos)
		// More bytes than the payload has, or than the header's pieces
		// cover (a header describing a shorter payload than expected).
		if take <= 0 || c.piece >= h.pieces() {
			c.ok = false
			return false
		}
		c.d.Write(b[:take])
		b, c.pos = b[take:], c.pos+take
		if c.pos == end {
			c.ok = c.ok && c.d.Sum64() == h.pieceSum(c.piece)
			c.piece++
			c.d.Reset()
		}
	}
	return c.ok
}

// finish reports whether the whole payload was seen and every piece
// matched. An empty version 1 payload still has its checksum compared.
func (c *pieceCheck) finish(h *header) bool {
	if c.n == 0 && h.version == version1 {
		return h.sum == xxh3.Hash(nil)
	}
	return c.ok && c.pos == c.n
}
