package ingest

import (
	"encoding/binary"
	"testing"
)

// FuzzHandle feeds arbitrary frames to the apply path: it must never panic,
// and every message must be counted either as applied or as malformed.
func FuzzHandle(f *testing.F) {
	f.Add("kv@p@m", uint64(0), batch(f, tagged, stored(tagged, nil, 1, 2), removed(tagged, "CPU", 1), cleared(tagged)))
	f.Add("", uint64(3), batch(f, mapped, stored(mapped, "DISK", 9), removed(mapped, nil, 9)))
	f.Add("kv@@", uint64(1<<63), []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xa0})
	f.Fuzz(func(t *testing.T, topic string, seq uint64, payload []byte) {
		fx := newFixture(t)
		s := newStream(fx.ix, fx.pods, fx.cs, "fallback", func(start uint64, visit func(uint64, []byte)) error {
			visit(start, payload) // replay the same bytes for any gap
			return nil
		})
		for i := range uint64(3) {
			// The same payload at seq, seq+2 and seq+1: in order, a gap,
			// then a restart.
			s.handle([][]byte{[]byte(topic), binary.BigEndian.AppendUint64(nil, seq+[]uint64{0, 2, 1}[i]), payload})
		}
		var total PodStats
		for _, st := range fx.cs.snapshot() {
			total.Messages += st.Messages
			total.Malformed += st.Malformed
		}
		if total.Messages == 0 && total.Malformed == 0 {
			t.Fatal("no message was counted")
		}
	})
}
