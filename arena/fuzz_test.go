package arena

import (
	"encoding/binary"
	"testing"
)

// FuzzHandles drives the arena with an operation script decoded from the
// input. Handles arrive from other processes over the local protocol, so any
// 64-bit value must be refused or served without a panic and without
// breaking an invariant. Each operation is one opcode byte and an 8-byte
// argument; an odd argument picks a handle the script was given, an even one
// is used raw.
func FuzzHandles(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add(script(
		op{0, 3 * page}, op{0, page}, op{2, 1}, op{1, 1}, op{3, 1}, op{1, 1},
		op{0, 5 * page}, op{2, 3}, op{1, 3}, op{1, 3}, op{1, 0x1234567800000000},
		op{3, 3}, op{2, 0x1234567800000001},
	))
	f.Fuzz(func(t *testing.T, data []byte) {
		a := newArena(t, 32)
		var ids []ID
		pickID := func(arg uint64) ID {
			if arg&1 == 1 && len(ids) > 0 {
				return ids[(arg>>1)%uint64(len(ids))]
			}
			return ID(arg)
		}
		for len(data) >= 9 {
			code, arg := data[0], binary.LittleEndian.Uint64(data[1:9])
			data = data[9:]
			switch code % 4 {
			case 0:
				size := int(arg % (40 * page))
				if arg&1 == 1 {
					size = int(arg) // anything, including negative and huge
				}
				if id, err := a.Alloc(size); err == nil {
					ids = append(ids, id)
				}
			case 1:
				a.Unref(pickID(arg))
			case 2:
				a.Ref(pickID(arg))
			case 3:
				id := pickID(arg)
				if b := a.Bytes(id); b != nil {
					if len(b) != a.Size(id) || a.Offset(id)%page != 0 {
						t.Fatalf("object %#x: %d bytes, Size %d, offset %d", uint64(id), len(b), a.Size(id), a.Offset(id))
					}
					b[0], b[len(b)-1] = 1, 1
				}
				a.Region(int64(arg), int(arg>>40))
			}
			if err := a.checkInvariants(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

type op struct {
	code byte
	arg  uint64
}

func script(ops ...op) []byte {
	var out []byte
	for _, o := range ops {
		out = append(out, o.code)
		out = binary.LittleEndian.AppendUint64(out, o.arg)
	}
	return out
}
