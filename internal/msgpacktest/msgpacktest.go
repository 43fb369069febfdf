// Package msgpacktest builds msgpack payloads the way vLLM's msgspec
// encoder writes them, for the tests of kvtier's KV-event decoder and of
// the code that consumes it. It uses a general msgpack library, so the
// fixtures stay independent of the hand-written decoder under test.
package msgpacktest

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Map is a msgpack map that keeps its field order, as msgspec writes a
// struct (tag first, then fields in declaration order).
type Map []Field

// Field is one key (a string) and its value. It is an array, not a
// struct, so fixtures can write {"type", "BlockStored"} without naming
// fields.
type Field = [2]any

// EncodeMsgpack implements msgpack.CustomEncoder.
func (m Map) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, f := range m {
		if err := e.Encode(f[0]); err != nil {
			return err
		}
		if err := e.Encode(f[1]); err != nil {
			return err
		}
	}
	return nil
}

// Encode packs v. compact selects the smallest integer encodings, as
// msgspec writes them; otherwise integers take their full 8-byte forms,
// which a decoder must accept too. Go maps are written with sorted keys so
// that fixtures are byte-exact.
func Encode(v any, compact bool) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(compact)
	e.SetSortMapKeys(true)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
