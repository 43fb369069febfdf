package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// errTruncated reports a msgpack value that runs past the end of the payload.
var errTruncated = errors.New("kvevents: msgpack value truncated")

// reader is a minimal msgpack cursor over one payload. It never allocates and
// never trusts a length prefix beyond the bytes that remain.
type reader struct {
	b   []byte
	off int
}

func (r *reader) remaining() int { return len(r.b) - r.off }

// peek returns the type byte of the next value without consuming it.
func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	return r.b[r.off], nil
}

// take consumes n bytes and returns them (aliasing the payload).
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, errTruncated
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

// uintN reads an n-byte big-endian unsigned integer (n is 1, 2, 4 or 8).
func (r *reader) uintN(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	default:
		return binary.BigEndian.Uint64(s), nil
	}
}

// nextIsNil consumes a nil and reports true, or consumes nothing.
func (r *reader) nextIsNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// arrayLen reads an array header. Every element takes at least one byte, so a
// count larger than the remaining bytes is rejected before anyone sizes a
// buffer from it.
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xdc || c == 0xdd:
		r.off++
		if n, err = r.uintN(2 << (c - 0xdc)); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("kvevents: want msgpack array, got type byte 0x%02x", c)
	}
	if n > uint64(r.remaining()) {
		return 0, fmt.Errorf("kvevents: array of %d elements exceeds the %d bytes left: %w", n, r.remaining(), errTruncated)
	}
	return int(n), nil
}

// mapLen reads a map header, bounded like arrayLen (two bytes per entry).
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xde || c == 0xdf:
		r.off++
		if n, err = r.uintN(2 << (c - 0xde)); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("kvevents: want msgpack map, got type byte 0x%02x", c)
	}
	if n > uint64(r.remaining())/2 {
		return 0, fmt.Errorf("kvevents: map of %d entries exceeds the %d bytes left: %w", n, r.remaining(), errTruncated)
	}
	return int(n), nil
}

// str reads a msgpack str and returns its bytes (aliasing the payload).
func (r *reader) str() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		r.off++
		n = uint64(c & 0x1f)
	case c >= 0xd9 && c <= 0xdb:
		r.off++
		if n, err = r.uintN(1 << (c - 0xd9)); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("kvevents: want msgpack str, got type byte 0x%02x", c)
	}
	if n > uint64(r.remaining()) {
		return nil, errTruncated
	}
	return r.take(int(n))
}

// bin reads a msgpack bin and returns its bytes (aliasing the payload).
func (r *reader) bin() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	if c < 0xc4 || c > 0xc6 {
		return nil, fmt.Errorf("kvevents: want msgpack bin, got type byte 0x%02x", c)
	}
	r.off++
	n, err := r.uintN(1 << (c - 0xc4))
	if err != nil {
		return nil, err
	}
	if n > uint64(r.remaining()) {
		return nil, errTruncated
	}
	return r.take(int(n))
}

// integer reads any msgpack integer. neg reports a negative value, in which
// case u holds its int64 two's-complement bit pattern.
func (r *reader) integer() (u uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	case c >= 0xcc && c <= 0xcf:
		r.off++
		u, err = r.uintN(1 << (c - 0xcc))
		return u, false, err
	case c >= 0xd0 && c <= 0xd3:
		r.off++
		width := 1 << (c - 0xd0)
		if u, err = r.uintN(width); err != nil {
			return 0, false, err
		}
		// Sign-extend from the encoded width.
		shift := 64 - 8*width
		v := int64(u<<shift) >> shift
		return uint64(v), v < 0, nil
	}
	return 0, false, fmt.Errorf("kvevents: want msgpack integer, got type byte 0x%02x", c)
}

// fastUint consumes and returns an unsigned integer (positive fixint, uint8,
// 16, 32 or 64) if the next value is one and is complete; otherwise it
// consumes nothing and reports false, leaving the general path to decode or
// diagnose the value. It is the fast path of the hot hash and token loops.
func (r *reader) fastUint() (uint64, bool) {
	b, off := r.b, r.off
	if off >= len(b) {
		return 0, false
	}
	switch c := b[off]; {
	case c <= 0x7f:
		r.off++
		return uint64(c), true
	case c == 0xcf && off+9 <= len(b):
		r.off += 9
		return binary.BigEndian.Uint64(b[off+1:]), true
	case c == 0xce && off+5 <= len(b):
		r.off += 5
		return uint64(binary.BigEndian.Uint32(b[off+1:])), true
	case c == 0xcd && off+3 <= len(b):
		r.off += 3
		return uint64(binary.BigEndian.Uint16(b[off+1:])), true
	case c == 0xcc && off+2 <= len(b):
		r.off += 2
		return uint64(b[off+1]), true
	}
	return 0, false
}

// int64Value reads an integer that must fit in int64.
func (r *reader) int64Value() (int64, error) {
	u, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && u > math.MaxInt64 {
		return 0, fmt.Errorf("kvevents: integer %d overflows int64", u)
	}
	return int64(u), nil
}

// number reads a float or an integer as float64 (msgspec writes floats, but a
// timestamp of a whole number may come from other encoders as an integer).
func (r *reader) number() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		u, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(u))), err
	case 0xcb:
		r.off++
		u, err := r.uintN(8)
		return math.Float64frombits(u), err
	}
	u, neg, err := r.integer()
	if err != nil {
		return 0, fmt.Errorf("kvevents: want msgpack number: %w", err)
	}
	if neg {
		return float64(int64(u)), nil
	}
	return float64(u), nil
}

// skip consumes one complete value of any type. It is iterative (a counter of
// values still owed), so hostile nesting cannot exhaust the stack.
func (r *reader) skip() error {
	for pending := 1; pending > 0; pending-- {
		c, err := r.peek()
		if err != nil {
			return err
		}
		r.off++
		var size uint64 // payload bytes to jump over
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			pending += 2 * int(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			pending += int(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			size = uint64(c & 0x1f)
		case c >= 0xc4 && c <= 0xc6: // bin 8/16/32
			size, err = r.uintN(1 << (c - 0xc4))
		case c >= 0xc7 && c <= 0xc9: // ext 8/16/32: length, then type byte
			size, err = r.uintN(1 << (c - 0xc7))
			size++
		case c == 0xca:
			size = 4
		case c == 0xcb:
			size = 8
		case c >= 0xcc && c <= 0xcf:
			size = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3:
			size = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext 1..16 plus the type byte
			size = 1<<(c-0xd4) + 1
		case c >= 0xd9 && c <= 0xdb:
			size, err = r.uintN(1 << (c - 0xd9))
		case c == 0xdc || c == 0xdd:
			r.off--
			var n int
			n, err = r.arrayLen()
			pending += n
		case c == 0xde || c == 0xdf:
			r.off--
			var n int
			n, err = r.mapLen()
			pending += 2 * n
		default: // 0xc1 is never used
			return fmt.Errorf("kvevents: invalid msgpack type byte 0x%02x", c)
		}
		if err != nil {
			return err
		}
		if size > uint64(r.remaining()) {
			return errTruncated
		}
		r.off += int(size)
		// Each owed value needs at least one byte; fail early on lies.
		if pending-1 > r.remaining() {
			return errTruncated
		}
	}
	return nil
}
