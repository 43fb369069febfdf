package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"kvtier/internal/citest"
	"kvtier/internal/msgpacktest"

	"github.com/vmihailenco/msgpack/v5"
)

// omap and kv build msgspec-ordered maps; see package msgpacktest.
type (
	omap = msgpacktest.Map
	kv   = msgpacktest.Field
)

// pack encodes v; compact selects msgspec's smallest integer encodings,
// otherwise integers take their full 8-byte forms, which the decoder must
// accept too.
func pack(t testing.TB, compact bool, v any) []byte {
	t.Helper()
	b, err := msgpacktest.Encode(v, compact)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ev is a self-contained, comparable view of one decoded Event.
type ev struct {
	Kind             Kind
	Hashes           []uint64
	HashBytes        bool
	Parent           uint64
	HasParent        bool
	Tokens           []uint32
	BlockSize        int
	Medium           string
	LoRAID           int64
	HasLoRAID        bool
	LoRAName         string
	GroupIdx         int
	HasGroupIdx      bool
	SpecKind         string
	SlidingWindow    int
	HasSlidingWindow bool
}

type view struct {
	TS        float64
	DPRank    int
	HasDPRank bool
	Events    []ev
}

func viewOf(b *Batch) view {
	v := view{TS: b.Timestamp, DPRank: b.DPRank, HasDPRank: b.HasDPRank}
	for i := range b.Events {
		e := &b.Events[i]
		x := ev{Kind: e.Kind, HashBytes: e.HashBytes, Parent: e.Parent, HasParent: e.HasParent,
			BlockSize: e.BlockSize, Medium: e.Medium, LoRAID: e.LoRAID, HasLoRAID: e.HasLoRAID,
			LoRAName: e.LoRAName, GroupIdx: e.GroupIdx, HasGroupIdx: e.HasGroupIdx,
			SpecKind: e.SpecKind, SlidingWindow: e.SlidingWindow, HasSlidingWindow: e.HasSlidingWindow}
		if h := b.BlockHashes(e); len(h) > 0 {
			x.Hashes = append([]uint64(nil), h...)
		}
		if tk := b.TokenIDs(e); len(tk) > 0 {
			x.Tokens = append([]uint32(nil), tk...)
		}
		v.Events = append(v.Events, x)
	}
	return v
}

func decodeView(t testing.TB, payload []byte) view {
	t.Helper()
	var d Decoder
	var b Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatalf("Decode: %v\npayload %x", err, payload)
	}
	checkBatch(t, &b)
	return viewOf(&b)
}

func expect(t *testing.T, got, want view) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded\n %+v\nwant\n %+v", got, want)
	}
}

var tokens8 = []uint32{1, 2, 3, 4, 5, 6, 7, 128000}

// The first release: [ts, events], BlockStored with five fields,
// BlockRemoved with one, integer hashes.
func oldestArrayBatch() any {
	return []any{1700000000.5, []any{
		[]any{"BlockStored", []uint64{0xdeadbeefcafef00d, 2}, nil, tokens8, 4, nil},
		[]any{"BlockRemoved", []uint64{2}},
		[]any{"AllBlocksCleared"},
	}}
}

var oldestWant = view{TS: 1700000000.5, Events: []ev{
	{Kind: BlockStored, Hashes: []uint64{0xdeadbeefcafef00d, 2}, Tokens: tokens8, BlockSize: 4},
	{Kind: BlockRemoved, Hashes: []uint64{2}},
	{Kind: AllBlocksCleared},
}}

var digest = func() []byte {
	b := make([]byte, 32)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// A later array release with every known field, byte hashes, a negative int
// hash, unknown trailing fields, an unknown event type and a DP rank.
func fullArrayBatch() any {
	return []any{int64(12), []any{
		[]any{"BlockStored", []any{digest, int64(-2)}, []byte{1, 2, 3}, []uint32{9, 10}, 16, 7, "CPU", "my-lora",
			[]any{[]any{"mm-hash", 3}, nil}, 1, "sliding_window", 4096,
			"a field from the future", map[string]any{"nested": []any{1.5, true, nil}}},
		[]any{"BlockRemoved", []uint64{^uint64(0)}, nil, 2, "extra"},
		[]any{"BlockMoved", []uint64{1}, "GPU"},
		[]any{"AllBlocksCleared", 5},
		[]any{"BlockStored", []uint64{77}, uint64(76), []uint32{}, 16, nil, nil, nil},
	}, 3, "extra batch element"}
}

var fullWant = view{TS: 12, DPRank: 3, HasDPRank: true, Events: []ev{
	{Kind: BlockStored, Hashes: []uint64{0x18191a1b1c1d1e1f, 0xfffffffffffffffe}, HashBytes: true,
		Parent: 0x010203, HasParent: true, Tokens: []uint32{9, 10}, BlockSize: 16, Medium: "CPU",
		LoRAID: 7, HasLoRAID: true, LoRAName: "my-lora", GroupIdx: 1, HasGroupIdx: true,
		SpecKind: "sliding_window", SlidingWindow: 4096, HasSlidingWindow: true},
	{Kind: BlockRemoved, Hashes: []uint64{^uint64(0)}, GroupIdx: 2, HasGroupIdx: true},
	{Kind: Unknown},
	{Kind: AllBlocksCleared},
	{Kind: BlockStored, Hashes: []uint64{77}, Parent: 76, HasParent: true, BlockSize: 16},
}}

// The map form as msgspec writes it: tag first, declaration order, fields
// without defaults always present (possibly nil), defaulted ones omitted.
func mapBatchMsgspecOrder() any {
	return omap{{"ts", 1.25}, {"events", []any{
		omap{{"type", "BlockStored"}, {"block_hashes", []uint64{10, 11, 12}}, {"parent_block_hash", uint64(9)},
			{"token_ids", tokens8}, {"block_size", 16}, {"lora_id", nil}, {"medium", nil}, {"lora_name", nil}},
		omap{{"type", "BlockRemoved"}, {"block_hashes", []any{digest[:8]}}, {"medium", "GPU"}},
		omap{{"type", "BlockEvicted"}, {"block_hashes", []uint64{5}}, {"token_ids", []uint32{1}}},
		omap{{"type", "AllBlocksCleared"}},
		omap{{"type", "BlockStored"}, {"block_hashes", []uint64{13}}, {"parent_block_hash", uint64(12)},
			{"token_ids", []uint32{4, 5}}, {"block_size", 2}, {"lora_id", 3}, {"medium", "CPU"},
			{"lora_name", "l"}, {"extra_keys", []any{nil}}, {"group_idx", 0}},
	}}, {"data_parallel_rank", 0}}
}

var mapWant = view{TS: 1.25, DPRank: 0, HasDPRank: true, Events: []ev{
	{Kind: BlockStored, Hashes: []uint64{10, 11, 12}, Parent: 9, HasParent: true, Tokens: tokens8, BlockSize: 16},
	{Kind: BlockRemoved, Hashes: []uint64{0x0001020304050607}, HashBytes: true, Medium: "GPU"},
	{Kind: Unknown},
	{Kind: AllBlocksCleared},
	{Kind: BlockStored, Hashes: []uint64{13}, Parent: 12, HasParent: true, Tokens: []uint32{4, 5}, BlockSize: 2,
		LoRAID: 3, HasLoRAID: true, Medium: "CPU", LoRAName: "l", HasGroupIdx: true},
}}

// A map form with sorted keys: "type" comes after the fields, unknown keys
// appear, data_parallel_rank is absent.
func mapBatchSorted() any {
	return map[string]any{"ts": 2.0, "zz_future": []any{1, 2}, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []uint64{1, 2}, "parent_block_hash": nil,
			"token_ids": []uint32{7, 8, 9, 10}, "block_size": 2, "lora_id": nil, "medium": nil,
			"lora_name": nil, "kv_cache_spec_kind": "full_attention", "new_field": map[string]any{"x": 1}},
		map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{1}, "medium": nil, "group_idx": 4},
	}}
}

var sortedWant = view{TS: 2, Events: []ev{
	{Kind: BlockStored, Hashes: []uint64{1, 2}, Tokens: []uint32{7, 8, 9, 10}, BlockSize: 2, SpecKind: "full_attention"},
	{Kind: BlockRemoved, Hashes: []uint64{1}, GroupIdx: 4, HasGroupIdx: true},
}}

type fixture struct {
	name  string
	value func() any
	want  view
}

var fixtures = []fixture{
	{"oldest array", oldestArrayBatch, oldestWant},
	{"full array", fullArrayBatch, fullWant},
	{"map msgspec order", mapBatchMsgspecOrder, mapWant},
	{"map sorted keys", mapBatchSorted, sortedWant},
	{"array batch nil dp rank", func() any {
		return []any{0.0, []any{[]any{"AllBlocksCleared"}}, nil}
	}, view{Events: []ev{{Kind: AllBlocksCleared}}}},
	{"empty batch", func() any { return []any{3.0, []any{}} }, view{TS: 3}},
	{"map batch with a repeated events key", func() any {
		return omap{{"ts", 4.0}, {"events", []any{[]any{"BlockRemoved", []uint64{1, 2}}}},
			{"events", []any{[]any{"BlockRemoved", []uint64{3}}}}}
	}, view{TS: 4, Events: []ev{{Kind: BlockRemoved, Hashes: []uint64{3}}}}},
}

func TestDecodeFixtures(t *testing.T) {
	for _, f := range fixtures {
		for _, compact := range []bool{true, false} {
			t.Run(f.name, func(t *testing.T) {
				expect(t, decodeView(t, pack(t, compact, f.value())), f.want)
			})
		}
	}
}

// The same Decoder and Batch must give the right answer when reused across
// payloads of different shapes and sizes, and allocate nothing once warm.
func TestDecodeReuseAndAllocs(t *testing.T) {
	var d Decoder
	var b Batch
	for round := range 2 {
		for _, f := range fixtures {
			payload := pack(t, true, f.value())
			if err := d.Decode(payload, &b); err != nil {
				t.Fatalf("round %d %s: %v", round, f.name, err)
			}
			expect(t, viewOf(&b), f.want)
			if round == 1 {
				allocs := testing.AllocsPerRun(20, func() {
					if err := d.Decode(payload, &b); err != nil {
						t.Fatal(err)
					}
				})
				if allocs != 0 {
					t.Errorf("%s: %v allocations per warm Decode, want 0", f.name, allocs)
				}
			}
		}
	}
}

// Batch must not alias the payload: overwrite it after decoding.
func TestDecodeDoesNotAliasPayload(t *testing.T) {
	payload := pack(t, true, mapBatchSorted())
	var d Decoder
	var b Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatal(err)
	}
	for i := range payload {
		payload[i] = 0
	}
	expect(t, viewOf(&b), sortedWant)
}

func TestDecodeTruncated(t *testing.T) {
	var d Decoder
	var b Batch
	for _, f := range fixtures {
		payload := pack(t, true, f.value())
		for n := range len(payload) {
			if err := d.Decode(payload[:n], &b); !errors.Is(err, ErrPayload) {
				t.Fatalf("%s truncated to %d of %d bytes: err = %v, want ErrPayload", f.name, n, len(payload), err)
			}
		}
	}
}

func TestDecodeMalformed(t *testing.T) {
	cases := map[string]any{
		"not an array or map":         "hello",
		"batch of one element":        []any{1.0},
		"ts not a number":             []any{"x", []any{}},
		"events not an array":         []any{1.0, 5},
		"event not array or map":      []any{1.0, []any{7}},
		"empty event array":           []any{1.0, []any{[]any{}}},
		"tag not a string":            []any{1.0, []any{[]any{1, 2}}},
		"BlockStored too short":       []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []uint32{}, 16}}},
		"BlockRemoved without hashes": []any{1.0, []any{[]any{"BlockRemoved"}}},
		"hash is a string":            []any{1.0, []any{[]any{"BlockRemoved", []any{"abc"}}}},
		"hash is empty bytes":         []any{1.0, []any{[]any{"BlockRemoved", []any{[]byte{}}}}},
		"hash is a float":             []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}},
		"token negative":              []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []int{-1}, 16, nil}}},
		"token too large":             []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []uint64{1 << 32}, 16, nil}}},
		"block_size nil":              []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []uint32{}, nil, nil}}},
		"block_size huge":             []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []uint32{}, uint64(1) << 40, nil}}},
		"lora_id overflows int64":     []any{1.0, []any{[]any{"BlockStored", []uint64{1}, nil, []uint32{}, 16, ^uint64(0)}}},
		"medium not a string":         []any{1.0, []any{[]any{"BlockRemoved", []uint64{1}, 5}}},
		"dp rank not an int":          []any{1.0, []any{}, "zero"},
		"map batch without events":    map[string]any{"ts": 1.0},
		"map batch without ts":        map[string]any{"events": []any{}},
		"map batch non-string key":    map[int]any{1: 2},
		"map event without type":      map[string]any{"ts": 1.0, "events": []any{map[string]any{"block_hashes": []uint64{1}}}},
		"map event type not string":   map[string]any{"ts": 1.0, "events": []any{map[string]any{"type": 1}}},
	}
	var d Decoder
	var b Batch
	for name, v := range cases {
		if err := d.Decode(pack(t, true, v), &b); !errors.Is(err, ErrPayload) {
			t.Errorf("%s: err = %v, want ErrPayload", name, err)
		}
	}
	raw := map[string][]byte{
		"empty":                   {},
		"trailing bytes":          append(pack(t, true, oldestArrayBatch()), 0xc0),
		"array32 lying length":    {0xdd, 0xff, 0xff, 0xff, 0xff, 0xcb},
		"map32 lying length":      {0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa2, 't', 's'},
		"hash list lying length":  {0x92, 0x00, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0xdd, 0x10, 0, 0, 0, 0x01},
		"str32 lying length":      {0x92, 0x00, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'},
		"reserved type byte 0xc1": {0x93, 0x00, 0x90, 0xc1},
		"skip: bin past end":      {0x93, 0x00, 0x90, 0xc5, 0xff, 0xff, 0x00},
		"skip: ext past end":      {0x93, 0x00, 0x90, 0xc8, 0x00, 0x10, 0x01, 0x00},
		"skip: deep lying nest":   append([]byte{0x93, 0x00, 0x90}, bytes.Repeat([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff}, 3)...),
	}
	for name, p := range raw {
		if err := d.Decode(p, &b); !errors.Is(err, ErrPayload) {
			t.Errorf("%s: err = %v, want ErrPayload", name, err)
		}
	}
}

// Unknown trailing values of every msgpack type are skipped exactly.
func TestSkipEveryType(t *testing.T) {
	var extra bytes.Buffer
	e := msgpack.NewEncoder(&extra)
	values := []any{
		nil, true, false, int8(-5), int64(-1 << 40), uint8(200), uint16(60000), uint32(1 << 31), uint64(1 << 63),
		float32(1.5), 2.5, "", strings.Repeat("s", 40), strings.Repeat("m", 300), strings.Repeat("l", 70000),
		[]byte{1}, bytes.Repeat([]byte{2}, 300), bytes.Repeat([]byte{3}, 70000),
		make([]any, 20), map[string]any{"a": []any{map[string]any{"b": nil}}},
	}
	for _, v := range values {
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
	}
	// Extension types: fixext 1, 2, 4, 8, 16 and ext 8, 16, 32.
	for _, n := range []int{1, 2, 4, 8, 16} {
		extra.WriteByte(0xd4 + byte(bitsLen(n)))
		extra.WriteByte(0x05)
		extra.Write(make([]byte, n))
	}
	extra.Write([]byte{0xc7, 3, 0x05, 1, 2, 3})
	extra.Write(append([]byte{0xc8, 0x01, 0x00, 0x05}, make([]byte, 256)...))
	extra.Write(append([]byte{0xc9, 0, 0, 0, 2, 0x05}, 1, 2))
	// A map16 and an array16 header.
	extra.Write([]byte{0xde, 0, 1, 0xa1, 'k', 0xdc, 0, 2, 1, 2})
	nExtra := len(values) + 5 + 3 + 1

	// ["BlockRemoved", [42], "CPU", 1, <extras...>] inside [ts, [event]].
	var p bytes.Buffer
	p.Write([]byte{0x92, 0x00, 0x91, 0xdc, 0, byte(4 + nExtra)})
	p.Write(pack(t, true, "BlockRemoved"))
	p.Write(pack(t, true, []uint64{42}))
	p.Write(pack(t, true, "CPU"))
	p.Write(pack(t, true, 1))
	p.Write(extra.Bytes())
	expect(t, decodeView(t, p.Bytes()), view{Events: []ev{
		{Kind: BlockRemoved, Hashes: []uint64{42}, Medium: "CPU", GroupIdx: 1, HasGroupIdx: true}}})
}

func bitsLen(n int) int {
	b := 0
	for n > 1 {
		n >>= 1
		b++
	}
	return b
}

func TestEventHelpers(t *testing.T) {
	if (&Event{}).MediumOrGPU() != "GPU" || (&Event{Medium: "CPU"}).MediumOrGPU() != "CPU" {
		t.Error("MediumOrGPU")
	}
	for k, s := range map[Kind]string{Unknown: "Unknown", BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"} {
		if k.String() != s {
			t.Errorf("%d.String() = %q", k, k.String())
		}
	}
}

// A payload produced by Python's msgpack (as msgspec-era vLLM writes the
// tagged-array form), when Debian's python3 has the module.
func TestDecodePythonMsgpack(t *testing.T) {
	const script = `
import msgpack, sys
batch = [1700000000.25, [
    ["BlockStored", [2**64 - 1, 5], None, [1, 2, 3, 4], 4, None, "GPU", None],
    ["BlockStored", [bytes(range(32))], 5, [9], 1, 2, None, "lora-a", [None], 0],
    ["BlockRemoved", [5], None],
    ["AllBlocksCleared"],
], 1]
sys.stdout.write(msgpack.packb(batch, use_bin_type=True).hex())
`
	out, err := exec.Command("/usr/bin/python3", "-c", script).Output()
	if err != nil {
		citest.Missing(t, "python3 with msgpack unavailable (.ci/run installs python3-msgpack): %v", err)
	}
	payload, err := hex.DecodeString(string(out))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, decodeView(t, payload), view{TS: 1700000000.25, DPRank: 1, HasDPRank: true, Events: []ev{
		{Kind: BlockStored, Hashes: []uint64{^uint64(0), 5}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "GPU"},
		{Kind: BlockStored, Hashes: []uint64{0x18191a1b1c1d1e1f}, HashBytes: true, Parent: 5, HasParent: true,
			Tokens: []uint32{9}, BlockSize: 1, LoRAID: 2, HasLoRAID: true, LoRAName: "lora-a", HasGroupIdx: true},
		{Kind: BlockRemoved, Hashes: []uint64{5}},
		{Kind: AllBlocksCleared},
	}})
}

// checkBatch asserts the invariants every successfully decoded Batch keeps:
// events' hash and token ranges tile the flat slices in order, and events of
// unknown kind carry nothing.
func checkBatch(t testing.TB, b *Batch) {
	t.Helper()
	h, tk := 0, 0
	for i := range b.Events {
		e := &b.Events[i]
		if e.HashesStart != h || e.HashesEnd < e.HashesStart || e.TokensStart != tk || e.TokensEnd < e.TokensStart {
			t.Fatalf("event %d ranges hashes %d:%d tokens %d:%d, want to start at %d and %d",
				i, e.HashesStart, e.HashesEnd, e.TokensStart, e.TokensEnd, h, tk)
		}
		h, tk = e.HashesEnd, e.TokensEnd
		if e.Kind > AllBlocksCleared {
			t.Fatalf("event %d kind %d", i, e.Kind)
		}
		if e.Kind == Unknown && (*e != Event{HashesStart: h, HashesEnd: h, TokensStart: tk, TokensEnd: tk}) {
			t.Fatalf("unknown event %d carries fields: %+v", i, *e)
		}
	}
	if h != len(b.Hashes) || tk != len(b.Tokens) {
		t.Fatalf("events cover %d hashes and %d tokens of %d and %d", h, tk, len(b.Hashes), len(b.Tokens))
	}
}

// reencode writes a decoded batch back in the map form.
func reencode(t testing.TB, b *Batch) []byte {
	events := make([]any, 0, len(b.Events))
	for i := range b.Events {
		e := &b.Events[i]
		m := omap{{"type", e.Kind.String()}, {"block_hashes", append([]uint64{}, b.BlockHashes(e)...)}, {"token_ids", append([]uint32{}, b.TokenIDs(e)...)}, {"block_size", e.BlockSize}}
		if e.HasParent {
			m = append(m, kv{"parent_block_hash", e.Parent})
		}
		if e.HasLoRAID {
			m = append(m, kv{"lora_id", e.LoRAID})
		}
		if e.Medium != "" {
			m = append(m, kv{"medium", e.Medium})
		}
		if e.LoRAName != "" {
			m = append(m, kv{"lora_name", e.LoRAName})
		}
		if e.HasGroupIdx {
			m = append(m, kv{"group_idx", e.GroupIdx})
		}
		if e.SpecKind != "" {
			m = append(m, kv{"kv_cache_spec_kind", e.SpecKind})
		}
		if e.HasSlidingWindow {
			m = append(m, kv{"kv_cache_spec_sliding_window", e.SlidingWindow})
		}
		events = append(events, m)
	}
	batch := omap{{"ts", b.Timestamp}, {"events", events}}
	if b.HasDPRank {
		batch = append(batch, kv{"data_parallel_rank", b.DPRank})
	}
	return pack(t, true, batch)
}

func FuzzDecode(f *testing.F) {
	for _, fx := range fixtures {
		f.Add(pack(f, true, fx.value()))
		f.Add(pack(f, false, fx.value()))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var d Decoder
		var b Batch
		if d.Decode(payload, &b) != nil {
			return
		}
		checkBatch(t, &b)
		// What was decoded survives a round trip through the map form
		// (minus HashBytes, which the integer re-encoding drops; unknown
		// events come back as unknown).
		want := viewOf(&b)
		var b2 Batch
		if err := d.Decode(reencode(t, &b), &b2); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		got := viewOf(&b2)
		for i := range want.Events {
			want.Events[i].HashBytes = false
		}
		if !reflect.DeepEqual(got, want) && !(want.TS != want.TS) { // NaN ts never compares equal
			t.Fatalf("round trip changed the batch:\n %+v\n %+v", want, got)
		}
	})
}
