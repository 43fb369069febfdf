package kvevents

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var encodings = []Encoding{Map, Array}

// sampleBatch has every event shape the encoder writes: a BlockStored with
// only the fields without a default, one with every optional field, one
// that sets only lora_name (a field in the middle of the array form), the
// daemon's offload events (medium CPU/DISK, no tokens), removals with and
// without a group, and a clear. Hashes include 0 and small values, which
// must still be written as 64-bit integers.
func sampleBatch() *Batch {
	b := &Batch{Timestamp: 1700000000.125, DPRank: 2, HasDPRank: true}
	b.Add(Event{Kind: BlockStored, BlockSize: 4}, []uint64{0, 7, math.MaxUint64}, []uint32{1, 2, 3, 4, 128000})
	b.Add(Event{Kind: BlockStored, Parent: 9, HasParent: true, BlockSize: 16, Medium: "GPU",
		LoRAID: 3, HasLoRAID: true, LoRAName: "adapter-a", GroupIdx: 1, HasGroupIdx: true,
		SpecKind: "sliding_window", SlidingWindow: 4096, HasSlidingWindow: true},
		[]uint64{0x0123456789abcdef}, []uint32{70000})
	b.Add(Event{Kind: BlockStored, BlockSize: 16, LoRAName: "adapter-b"}, []uint64{5}, nil)
	b.Add(Event{Kind: BlockStored, Parent: 1 << 40, HasParent: true, BlockSize: 16, Medium: "CPU"},
		[]uint64{1 << 63, 12687895063098490012}, nil)
	b.Add(Event{Kind: BlockRemoved, Medium: "DISK"}, []uint64{12687895063098490012}, nil)
	b.Add(Event{Kind: BlockRemoved, GroupIdx: 0, HasGroupIdx: true}, []uint64{3, 4}, nil)
	b.Add(Event{Kind: AllBlocksCleared}, nil, nil)
	return b
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, enc := range encodings {
		t.Run(enc.String(), func(t *testing.T) {
			b := sampleBatch()
			payload := Encoder{Encoding: enc}.Append(nil, b)
			expect(t, decodeView(t, payload), viewOf(b))

			b.HasDPRank, b.DPRank = false, 0
			payload = Encoder{Encoding: enc}.Append(payload[:0], b)
			expect(t, decodeView(t, payload), viewOf(b))
		})
	}
}

// TestEncodeWireFacts checks the encoded bytes, read by an independent
// msgpack library, against the format facts in shared/REFERENCES.md: the
// batch is [ts: float, events, data_parallel_rank]; tagged arrays put the
// tag first and the fields in vLLM's order; maps carry the tag under
// "type"; hashes are unsigned 64-bit integers.
func TestEncodeWireFacts(t *testing.T) {
	for _, enc := range encodings {
		t.Run(enc.String(), func(t *testing.T) {
			payload := Encoder{Encoding: enc}.Append(nil, sampleBatch())
			var batch []any
			if err := msgpack.Unmarshal(payload, &batch); err != nil {
				t.Fatal(err)
			}
			if len(batch) != 3 {
				t.Fatalf("batch has %d elements, want 3", len(batch))
			}
			if ts, ok := batch[0].(float64); !ok || ts != 1700000000.125 {
				t.Errorf("ts = %#v, want float64", batch[0])
			}
			if dp, ok := batch[2].(int8); !ok || dp != 2 {
				t.Errorf("data_parallel_rank = %#v", batch[2])
			}
			events := batch[1].([]any)
			full := events[1]
			var got map[string]any
			if enc == Array {
				arr := full.([]any)
				if arr[0] != "BlockStored" {
					t.Fatalf("tag = %v", arr[0])
				}
				got = make(map[string]any)
				for i, v := range arr[1:] {
					got[storedFields[i]] = v
				}
				if n := len(events[0].([]any)); n != 7 {
					t.Errorf("minimal BlockStored array has %d elements, want 7 (tag .. medium)", n)
				}
				if n := len(events[2].([]any)); n != 8 {
					t.Errorf("BlockStored with lora_name has %d elements, want 8 (tag .. lora_name)", n)
				}
				if removed := events[4].([]any); len(removed) != 3 || removed[2] != "DISK" {
					t.Errorf("BlockRemoved = %v, want [tag, hashes, medium]", removed)
				}
			} else {
				got = full.(map[string]any)
				if got["type"] != "BlockStored" {
					t.Fatalf("type = %v", got["type"])
				}
				if min := events[0].(map[string]any); len(min) != 8 {
					t.Errorf("minimal BlockStored map has keys %v, want type and the 7 fields without a default", min)
				}
			}
			want := map[string]any{"block_hashes": []any{uint64(0x0123456789abcdef)}, "parent_block_hash": uint64(9),
				"token_ids": []any{uint32(70000)}, "block_size": int8(16), "lora_id": int8(3), "medium": "GPU",
				"lora_name": "adapter-a", "group_idx": int8(1), "kv_cache_spec_kind": "sliding_window",
				"kv_cache_spec_sliding_window": uint16(4096)}
			for k, v := range want {
				if !reflect.DeepEqual(got[k], v) {
					t.Errorf("%s = %#v, want %#v", k, got[k], v)
				}
			}
			small := events[0]
			var hashes []any
			if enc == Array {
				hashes = small.([]any)[1].([]any)
			} else {
				hashes = small.(map[string]any)["block_hashes"].([]any)
			}
			for i, h := range hashes {
				if _, ok := h.(uint64); !ok {
					t.Errorf("hash %d decodes as %T, want uint64 (8-byte form)", i, h)
				}
			}
		})
	}
}

// llmdBatch is the shape llm-d's vLLM adapter (llm-d-kv-cache
// pkg/kvevents/engineadapter) reads a payload into: a positional struct of
// exactly three fields, with the events left raw.
type llmdBatch struct {
	_      struct{} `msgpack:",array"`
	TS     float64
	Events []msgpack.RawMessage
	DP     *int
}

// readAsLLMD reads a payload with the rules llm-d applies (as of
// llm-d-kv-cache v0.9): events decoded into interface values, map events
// turned into the positional layout by field name, hashes accepted only
// as 64-bit integers or bytes, medium as a string or nil, group_idx as a
// non-negative integer or nil, unknown tags refused.
func readAsLLMD(payload []byte) (view, error) {
	var b llmdBatch
	if err := msgpack.Unmarshal(payload, &b); err != nil {
		return view{}, fmt.Errorf("batch: %w", err)
	}
	v := view{TS: b.TS}
	if b.DP != nil {
		v.DPRank, v.HasDPRank = *b.DP, true
	}
	for i, raw := range b.Events {
		var x any
		if err := msgpack.Unmarshal(raw, &x); err != nil {
			return view{}, err
		}
		e, err := llmdEvent(x)
		if err != nil {
			return view{}, fmt.Errorf("event %d: %w", i, err)
		}
		v.Events = append(v.Events, e)
	}
	return v, nil
}

func llmdEvent(x any) (ev, error) {
	fields, ok := x.([]any)
	if m, isMap := x.(map[string]any); isMap {
		fields = []any{m["type"]}
		var names []string
		switch m["type"] {
		case "BlockStored":
			names = storedFields[:]
		case "BlockRemoved":
			names = removedFields[:]
		}
		for _, n := range names {
			fields = append(fields, m[n])
		}
	} else if !ok || len(fields) == 0 {
		return ev{}, fmt.Errorf("event is %T", x)
	}
	at := func(i int) any {
		if i < len(fields) {
			return fields[i]
		}
		return nil
	}
	var e ev
	var err error
	switch fields[0] {
	case "BlockStored":
		if len(fields) < 5 {
			return ev{}, fmt.Errorf("BlockStored with %d fields", len(fields))
		}
		e.Kind = BlockStored
		if e.Hashes, err = llmdHashes(fields[1]); err != nil {
			return ev{}, err
		}
		if p := fields[2]; p != nil {
			if e.Parent, err = llmdHash(p); err != nil {
				return ev{}, err
			}
			e.HasParent = true
		}
		for _, tk := range fields[3].([]any) {
			n, err := llmdInt(tk)
			if err != nil {
				return ev{}, err
			}
			e.Tokens = append(e.Tokens, uint32(n))
		}
		if e.BlockSize, err = llmdInt(fields[4]); err != nil {
			return ev{}, err
		}
		if id := at(5); id != nil {
			n, err := llmdInt(id)
			if err != nil {
				return ev{}, err
			}
			e.LoRAID, e.HasLoRAID = int64(n), true
		}
		if e.Medium, err = llmdString(at(6)); err != nil {
			return ev{}, err
		}
		if e.LoRAName, err = llmdString(at(7)); err != nil {
			return ev{}, err
		}
		if e.GroupIdx, e.HasGroupIdx, err = llmdGroup(at(9)); err != nil {
			return ev{}, err
		}
		if e.SpecKind, err = llmdString(at(10)); err != nil {
			return ev{}, err
		}
		if w := at(11); w != nil {
			if e.SlidingWindow, err = llmdInt(w); err != nil {
				return ev{}, err
			}
			e.HasSlidingWindow = true
		}
	case "BlockRemoved":
		if len(fields) < 2 {
			return ev{}, fmt.Errorf("BlockRemoved with %d fields", len(fields))
		}
		e.Kind = BlockRemoved
		if e.Hashes, err = llmdHashes(fields[1]); err != nil {
			return ev{}, err
		}
		if e.Medium, err = llmdString(at(2)); err != nil {
			return ev{}, err
		}
		if e.GroupIdx, e.HasGroupIdx, err = llmdGroup(at(3)); err != nil {
			return ev{}, err
		}
	case "AllBlocksCleared":
		e.Kind = AllBlocksCleared
	default:
		return ev{}, fmt.Errorf("unknown tag %v", fields[0])
	}
	return e, nil
}

func llmdHashes(x any) ([]uint64, error) {
	list, ok := x.([]any)
	if !ok {
		return nil, fmt.Errorf("block_hashes is %T", x)
	}
	var out []uint64
	for _, h := range list {
		u, err := llmdHash(h)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func llmdHash(x any) (uint64, error) {
	switch h := x.(type) {
	case uint64:
		return h, nil
	case int64:
		return uint64(h), nil
	case []byte:
		return 0, fmt.Errorf("bytes hashes are not expected from this encoder")
	}
	return 0, fmt.Errorf("hash of type %T is refused", x)
}

func llmdInt(x any) (int, error) {
	switch n := x.(type) {
	case int8:
		return int(n), nil
	case int16:
		return int(n), nil
	case int32:
		return int(n), nil
	case int64:
		return int(n), nil
	case uint8:
		return int(n), nil
	case uint16:
		return int(n), nil
	case uint32:
		return int(n), nil
	case uint64:
		return int(n), nil
	}
	return 0, fmt.Errorf("integer of type %T", x)
}

func llmdString(x any) (string, error) {
	if x == nil {
		return "", nil
	}
	s, ok := x.(string)
	if !ok {
		return "", fmt.Errorf("string field of type %T", x)
	}
	return s, nil
}

func llmdGroup(x any) (int, bool, error) {
	if x == nil {
		return 0, false, nil
	}
	g, err := llmdInt(x)
	if err == nil && g < 0 {
		err = fmt.Errorf("negative group_idx %d", g)
	}
	return g, err == nil, err
}

// TestEncodeReadsAsLLMD: llm-d's decoder reads both encodings into the
// same events.
func TestEncodeReadsAsLLMD(t *testing.T) {
	for _, enc := range encodings {
		t.Run(enc.String(), func(t *testing.T) {
			b := sampleBatch()
			got, err := readAsLLMD(Encoder{Encoding: enc}.Append(nil, b))
			if err != nil {
				t.Fatal(err)
			}
			expect(t, got, viewOf(b))
		})
	}
}

// TestEncodeVLLMShapePython decodes the encoder's bytes with Debian's
// python3-msgpack, as vLLM's subscribers do, and checks them against the
// field order (array form) and field names (map form) of vLLM's msgspec
// structs (testdata/vllm_shape.py), then compares the values.
func TestEncodeVLLMShapePython(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import msgpack").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3-msgpack is required under CI: %v", err)
		}
		t.Skipf("python3 with msgpack unavailable: %v", err)
	}
	for _, enc := range encodings {
		t.Run(enc.String(), func(t *testing.T) {
			b := sampleBatch()
			cmd := exec.Command("/usr/bin/python3", "testdata/vllm_shape.py")
			cmd.Stdin = strings.NewReader(hex.EncodeToString(Encoder{Encoding: enc}.Append(nil, b)))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("vllm_shape.py: %v: %s", err, stderr.String())
			}
			var got struct {
				TS     float64          `json:"ts"`
				DP     *int             `json:"data_parallel_rank"`
				Events []map[string]any `json:"events"`
			}
			dec := json.NewDecoder(strings.NewReader(string(out)))
			dec.UseNumber()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got.TS != b.Timestamp || got.DP == nil || *got.DP != b.DPRank || len(got.Events) != len(b.Events) {
				t.Fatalf("batch ts %v dp %v with %d events", got.TS, got.DP, len(got.Events))
			}
			for i := range b.Events {
				checkPythonEvent(t, i, got.Events[i], b, &b.Events[i])
			}
		})
	}
}

// checkPythonEvent compares the fields Python read with the event encoded.
func checkPythonEvent(t *testing.T, i int, got map[string]any, b *Batch, e *Event) {
	t.Helper()
	want := map[string]any{"type": e.Kind.String()}
	if e.Kind == AllBlocksCleared {
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d: python read %v, want %v", i, got, want)
		}
		return
	}
	want["block_hashes"] = numbers(b.BlockHashes(e))
	want["medium"] = optString(e.Medium)
	if e.HasGroupIdx {
		want["group_idx"] = json.Number(fmt.Sprint(e.GroupIdx))
	}
	if e.Kind == BlockStored {
		want["token_ids"] = numbers(b.TokenIDs(e))
		want["block_size"] = json.Number(fmt.Sprint(e.BlockSize))
		want["parent_block_hash"] = nil
		if e.HasParent {
			want["parent_block_hash"] = json.Number(fmt.Sprint(e.Parent))
		}
		want["lora_id"] = nil
		if e.HasLoRAID {
			want["lora_id"] = json.Number(fmt.Sprint(e.LoRAID))
		}
		want["lora_name"] = optString(e.LoRAName)
		if e.SpecKind != "" {
			want["kv_cache_spec_kind"] = e.SpecKind
		}
		if e.HasSlidingWindow {
			want["kv_cache_spec_sliding_window"] = json.Number(fmt.Sprint(e.SlidingWindow))
		}
	}
	// Unset fields are nil or absent (the array form writes those before
	// the last set field, and omits the rest); either reads as the
	// default, None. The script checked that no required field is absent.
	for k, v := range got {
		if _, ok := want[k]; !ok && v == nil {
			want[k] = nil
		}
	}
	for k, v := range want {
		if _, ok := got[k]; !ok && v == nil {
			delete(want, k)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("event %d: python read\n %v\nwant\n %v", i, got, want)
	}
}

func numbers[T uint32 | uint64](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = json.Number(fmt.Sprint(x))
	}
	return out
}

func optString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func TestEncodeAllocs(t *testing.T) {
	b := sampleBatch()
	for _, enc := range encodings {
		buf := Encoder{Encoding: enc}.Append(nil, b)
		if n := testing.AllocsPerRun(100, func() { buf = Encoder{Encoding: enc}.Append(buf[:0], b) }); n != 0 {
			t.Errorf("%s: %v allocations per Append into a large enough buffer", enc, n)
		}
	}
}

func TestParseEncoding(t *testing.T) {
	for s, want := range map[string]Encoding{"": Map, "map": Map, "array": Array, "tagged": Array} {
		if got, err := ParseEncoding(s); err != nil || got != want {
			t.Errorf("ParseEncoding(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Error("ParseEncoding(json) succeeded")
	}
	if Encoding(9).String() != "encoding(9)" {
		t.Error(Encoding(9).String())
	}
}

// FuzzEncodeRoundTrip: whatever the decoder accepts, the encoder writes
// back (in either encoding) to a payload that decodes to the same events,
// except those of unknown type (dropped) and the record of which hashes
// arrived as bytes (the encoder writes integers).
func FuzzEncodeRoundTrip(f *testing.F) {
	for _, enc := range encodings {
		f.Add(Encoder{Encoding: enc}.Append(nil, sampleBatch()))
	}
	for _, fx := range fixtures {
		f.Add(pack(f, true, fx.value()))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var d Decoder
		var b Batch
		if d.Decode(payload, &b) != nil {
			return
		}
		want := known(viewOf(&b))
		for _, enc := range encodings {
			again := Encoder{Encoding: enc}.Append(nil, &b)
			var b2 Batch
			if err := d.Decode(again, &b2); err != nil {
				t.Fatalf("%s: re-encoded payload does not decode: %v\n%x", enc, err, again)
			}
			got := viewOf(&b2)
			if math.Float64bits(got.TS) != math.Float64bits(want.TS) {
				t.Fatalf("%s: ts %v, want %v", enc, got.TS, want.TS)
			}
			got.TS = want.TS // compared above: NaN never DeepEquals itself
			if math.IsNaN(got.TS) {
				got.TS = 0
			}
			if w := withTS(want, got.TS); !reflect.DeepEqual(got, w) {
				t.Fatalf("%s: round trip\n %+v\nwant\n %+v", enc, got, w)
			}
		}
	})
}

func withTS(v view, ts float64) view { v.TS = ts; return v }

// known drops events of unknown kind and the HashBytes marks.
func known(v view) view {
	out := v
	out.Events = nil
	for _, e := range v.Events {
		if e.Kind == Unknown {
			continue
		}
		e.HashBytes = false
		out.Events = append(out.Events, e)
	}
	return out
}
