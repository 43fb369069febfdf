package kvevents

import (
	"errors"
	"math"
	"testing"
)

// Every msgpack integer and float form decodes to the right value, whether
// the general or the fast path reads it.
func TestReaderNumbers(t *testing.T) {
	ints := []any{
		uint8(0), uint8(127), uint8(200), uint16(60000), uint32(1 << 31), uint64(1 << 63), ^uint64(0),
		int8(-1), int8(-32), int8(-100), int16(-30000), int32(-1 << 30), int64(math.MinInt64), int64(42),
	}
	for _, compact := range []bool{true, false} {
		for _, v := range ints {
			p := pack(t, compact, v)
			want, wantNeg := asUint(v)
			r := reader{b: p}
			u, neg, err := r.integer()
			if err != nil || u != want || neg != wantNeg || r.remaining() != 0 {
				t.Errorf("integer(%T %v, compact %v) = %d, %v, %v", v, v, compact, u, neg, err)
			}
			r = reader{b: p}
			if u, ok := r.fastUint(); ok && (wantNeg || u != want || r.remaining() != 0) {
				t.Errorf("fastUint(%T %v) = %d", v, v, u)
			} else if !ok && r.off != 0 {
				t.Errorf("fastUint(%T %v) declined but consumed input", v, v)
			}
			r = reader{b: p}
			f, err := r.number()
			wantF := float64(want)
			if wantNeg {
				wantF = float64(int64(want))
			}
			if err != nil || f != wantF {
				t.Errorf("number(%T %v) = %v, %v", v, v, f, err)
			}
		}
	}
	for _, v := range []any{float32(1.5), 2.25} {
		r := reader{b: pack(t, true, v)}
		if f, err := r.number(); err != nil || (f != 1.5 && f != 2.25) {
			t.Errorf("number(%T %v) = %v, %v", v, v, f, err)
		}
	}
	r := reader{b: pack(t, true, "x")}
	if _, err := r.number(); err == nil {
		t.Error("number accepted a string")
	}
	r = reader{b: pack(t, true, ^uint64(0))}
	if _, err := r.int64Value(); err == nil {
		t.Error("int64Value accepted 2^64-1")
	}
	for _, p := range [][]byte{{0xcf, 1}, {0xd3, 1, 2}, {0xcb, 1}, {0xca}} {
		r := reader{b: p}
		if _, err := r.number(); !errors.Is(err, errTruncated) {
			t.Errorf("number(%x): err = %v, want truncated", p, err)
		}
	}
}

func asUint(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), false
	case uint16:
		return uint64(x), false
	case uint32:
		return uint64(x), false
	case uint64:
		return x, false
	case int8:
		return uint64(int64(x)), x < 0
	case int16:
		return uint64(int64(x)), x < 0
	case int32:
		return uint64(int64(x)), x < 0
	case int64:
		return uint64(x), x < 0
	}
	panic("unexpected type")
}

// Strings and byte strings of every length class, and maps of both header
// sizes.
func TestReaderContainers(t *testing.T) {
	for _, n := range []int{0, 31, 32, 255, 256, 65536} {
		s := make([]byte, n)
		r := reader{b: pack(t, true, string(s))}
		if got, err := r.str(); err != nil || len(got) != n {
			t.Errorf("str of %d: %d, %v", n, len(got), err)
		}
		r = reader{b: pack(t, true, s)}
		if got, err := r.bin(); err != nil || len(got) != n {
			t.Errorf("bin of %d: %d, %v", n, len(got), err)
		}
	}
	m := make(map[int]int, 20)
	for i := range 20 {
		m[i] = i
	}
	r := reader{b: pack(t, true, m)}
	if n, err := r.mapLen(); err != nil || n != 20 {
		t.Errorf("map16 len = %d, %v", n, err)
	}
	r = reader{b: []byte{0xa1}}
	if _, err := r.mapLen(); err == nil {
		t.Error("mapLen accepted a str")
	}
	r = reader{b: []byte{0xde, 0}}
	if _, err := r.mapLen(); !errors.Is(err, errTruncated) {
		t.Errorf("mapLen of a cut header: %v", err)
	}
	r = reader{b: []byte{0xc4, 5, 1}}
	if _, err := r.bin(); !errors.Is(err, errTruncated) {
		t.Errorf("bin past end: %v", err)
	}
}

func TestStatusString(t *testing.T) {
	for st, s := range map[Status]string{First: "first", InOrder: "in-order", Gap: "gap", Restart: "restart", 9: "unknown"} {
		if st.String() != s {
			t.Errorf("Status(%d).String() = %q, want %q", st, st.String(), s)
		}
	}
}
