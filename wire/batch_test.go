package wire

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

func TestLookupBatchLimits(t *testing.T) {
	one := (&Lookup{Keys: Keys{Scope: 1, Tokens: []uint32{1, 2}}}).Append(nil)
	batchOf := func(count uint32, lookups int) []byte {
		b := appendU32(nil, count)
		for range lookups {
			b = append(b, one...)
		}
		return b
	}
	cases := []struct {
		name string
		body []byte
		want string
	}{
		{"empty body", nil, "need 4 bytes"},
		{"no lookups", batchOf(0, 0), "no lookups"},
		{"over the limit", batchOf(MaxBatch+1, MaxBatch+1), "limit 1024"},
		{"count beyond the body", batchOf(3, 2), "3 lookups in 56 bytes"},
		{"huge count", batchOf(1<<31, 1), "limit"},
		{"trailing bytes", append(batchOf(1, 1), 0), "trailing"},
		{"second lookup cut short", append(batchOf(2, 1), make([]byte, 16)...), "need"},
		{"unknown key kind", append(batchOf(2, 1), 0, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), "unknown kind"},
	}
	for _, c := range cases {
		var m LookupBatch
		err := m.Decode(c.body)
		if err == nil || !errors.Is(err, ErrFrame) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want an ErrFrame saying %q", c.name, err, c.want)
		}
	}
	var m LookupBatch
	if err := m.Decode(batchOf(MaxBatch, MaxBatch)); err != nil || len(m.Lookups) != MaxBatch {
		t.Fatalf("a batch of MaxBatch: %v, %d lookups", err, len(m.Lookups))
	}
}

// A count that the body cannot hold fails before the lookups are grown.
func TestLookupBatchCountDoesNotAllocate(t *testing.T) {
	b := appendU32(nil, MaxBatch)
	b = append(b, make([]byte, 64)...)
	var m LookupBatch
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := m.Decode(b)
	runtime.ReadMemStats(&after)
	if err == nil || after.TotalAlloc-before.TotalAlloc > 4096 {
		t.Errorf("err=%v, allocated %d bytes", err, after.TotalAlloc-before.TotalAlloc)
	}
}

func TestLookupBatchReplyRejectsUnknownStatus(t *testing.T) {
	b := appendU32(appendU32(nil, 1), uint32(statusLimit))
	b = appendStr(b, "x")
	var m LookupBatchReply
	if err := m.Decode(b); err == nil || !strings.Contains(err.Error(), "unknown status") {
		t.Errorf("err = %v", err)
	}
}

// Decoding into the same value again allocates nothing once warm, as for
// every other message.
func TestLookupBatchDecodeReuses(t *testing.T) {
	keys := Keys{Scope: 1, Tokens: make([]uint32, 4096)}
	body := (&LookupBatch{Lookups: []Lookup{{Keys: keys}, {Keys: keys}, {Keys: keys}}}).Append(nil)
	reply := (&LookupBatchReply{Results: []LookupResult{{Reply: LookupReply{ByTier: []uint32{1, 2}}}, {Status: StatusNoSpace, Message: ""}}}).Append(nil)
	var m LookupBatch
	var r LookupBatchReply
	if a := testing.AllocsPerRun(20, func() {
		if m.Decode(body) != nil || r.Decode(reply) != nil {
			t.Fatal("decode failed")
		}
	}); a != 0 {
		t.Errorf("%.1f allocations per decode", a)
	}
}

func TestRequestBufferLimits(t *testing.T) {
	for _, n := range []uint32{0, MinRequestBuffer - 1, MaxRequestBuffer + 1} {
		var m RequestBuffer
		if err := m.Decode((&RequestBuffer{Bytes: n}).Append(nil)); err == nil || !errors.Is(err, ErrFrame) {
			t.Errorf("a request buffer of %d bytes: err = %v", n, err)
		}
	}
}
