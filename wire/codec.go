package wire

import (
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"
)

// decoder reads little-endian fields from a body. The first failure sticks:
// later reads return zero values, and err says what was wrong first, so a
// message's Decode can read every field and check once at the end.
type decoder struct {
	b   []byte
	off int
	err error
	// view leaves token ids and kind-1 hashes in b (Keys.Encoded) instead
	// of copying them.
	view bool
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrFrame}, args...)...)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b)-d.off < n {
		d.fail("%s: need %d bytes at offset %d, body has %d", what, n, d.off, len(d.b))
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8(what string) uint8 {
	if p := d.take(1, what); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16(what string) uint16 {
	if p := d.take(2, what); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32(what string) uint32 {
	if p := d.take(4, what); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64(what string) uint64 {
	if p := d.take(8, what); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// zero reads n reserved bytes, which must be zero so that a later version
// can give them a meaning.
func (d *decoder) zero(n int, what string) {
	for _, c := range d.take(n, what) {
		if c != 0 {
			d.fail("%s: reserved bytes are not zero", what)
			return
		}
	}
}

// str reads a u16 length and that many bytes.
func (d *decoder) str(what string) string {
	n := int(d.u16(what))
	if n > MaxString {
		d.fail("%s: %d bytes, limit %d", what, n, MaxString)
		return ""
	}
	return string(d.take(n, what))
}

// count reads a u32 element count and checks that count elements of size
// bytes each fit in what is left, before anything is allocated for them.
func (d *decoder) count(size int, what string) int {
	n := d.u32(what)
	if d.err != nil {
		return 0
	}
	if uint64(n)*uint64(size) > uint64(len(d.b)-d.off) {
		d.fail("%s: %d elements of %d bytes, %d bytes left", what, n, size, len(d.b)-d.off)
		return 0
	}
	return int(n)
}

// end checks that the whole body was consumed: trailing bytes mean the
// peer and this decoder disagree about the message.
func (d *decoder) end(what string) error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("%s: %d trailing bytes", what, len(d.b)-d.off)
	}
	return d.err
}

func appendU16(b []byte, v uint16) []byte { return binary.LittleEndian.AppendUint16(b, v) }
func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

// appendStr writes s as a u16 length and its bytes, cut to MaxString (the
// encoders' callers validate lengths; cutting keeps the frame well formed).
func appendStr(b []byte, s string) []byte {
	if len(s) > MaxString {
		s = s[:MaxString]
	}
	b = appendU16(b, uint16(len(s)))
	return append(b, s...)
}

// hostLittleEndian is true on every platform engines run on; the protocol
// is little-endian, so there token arrays move with one copy.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendU32Array appends v as little-endian u32s.
func appendU32Array(b []byte, v []uint32) []byte {
	if hostLittleEndian && len(v) > 0 {
		return append(b, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))...)
	}
	for _, x := range v {
		b = appendU32(b, x)
	}
	return b
}

// decodeU32Array sets dst to the n little-endian u32s in p.
func decodeU32Array(dst []uint32, p []byte, n int) []uint32 {
	dst = slices.Grow(dst[:0], n)[:n]
	if hostLittleEndian && n > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), p)
		return dst
	}
	for i := range dst {
		dst[i] = binary.LittleEndian.Uint32(p[4*i:])
	}
	return dst
}
