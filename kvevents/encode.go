package kvevents

import (
	"fmt"
	"math"
	"time"
)

// Encoding is how an Encoder lays out each event of a batch. The batch
// itself is always the array [ts, events, data_parallel_rank]: every vLLM
// release writes it so, and llm-d's decoder accepts nothing else (it reads
// the batch as a three-element positional struct).
type Encoding uint8

const (
	// Map writes each event as a map from field name to value with the tag
	// under "type", as vLLM writes them since PR 42892 (v0.26, June 2026).
	// vLLM's current msgspec structs and llm-d-kv-cache from v0.9 on
	// decode it; older consumers expect Array.
	Map Encoding = iota
	// Array writes each event as a positional array with its tag first, as
	// vLLM wrote them before PR 42892. Every llm-d release and vLLM's older
	// structs decode it; vLLM's current structs do not.
	Array
)

// String returns "map" or "array".
func (e Encoding) String() string {
	switch e {
	case Map:
		return "map"
	case Array:
		return "array"
	}
	return fmt.Sprintf("encoding(%d)", uint8(e))
}

// ParseEncoding returns the Encoding named "map" or "array".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "map", "":
		return Map, nil
	case "array", "tagged":
		return Array, nil
	}
	return 0, fmt.Errorf("kvevents: unknown event encoding %q (want map or array)", s)
}

// Encoder writes EventBatch payloads that vLLM's own subscribers, llm-d's
// indexer and this package's Decoder all read. It is the Decoder's
// counterpart: what one writes the other reads back unchanged (see
// Append). The zero value writes Map events.
//
// Choices made for the widest set of readers:
//
//   - Block hashes (and the parent hash) are always written as 8-byte
//     unsigned integers (msgpack uint64), whatever their value. msgpack
//     readers in Python accept any integer width, but llm-d decodes hashes
//     into interface values and accepts only 64-bit integers or bytes.
//   - Fields vLLM declares without a default (parent_block_hash, lora_id,
//     medium, lora_name in BlockStored; medium in BlockRemoved) are always
//     written, nil when unset, because msgspec refuses a map that lacks
//     them. Fields with a default are written only when set, as vLLM's
//     omit_defaults does; in the array form that means up to the last set
//     one, with nil for unset fields before it.
//   - extra_keys is never written: Event does not carry it.
type Encoder struct {
	Encoding Encoding
}

// Append appends the msgpack payload of b to dst and returns the extended
// slice. It allocates only when dst has to grow. Events of kind Unknown are
// not written (no reader would know them).
func (enc Encoder) Append(dst []byte, b *Batch) []byte {
	dst = appendArrayHeader(dst, 3)
	dst = appendFloat64(dst, b.Timestamp)
	n := 0
	for i := range b.Events {
		if b.Events[i].Kind != Unknown {
			n++
		}
	}
	dst = appendArrayHeader(dst, n)
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case BlockStored:
			dst = enc.appendStored(dst, b, e)
		case BlockRemoved:
			dst = enc.appendRemoved(dst, b, e)
		case AllBlocksCleared:
			dst = enc.appendCleared(dst)
		}
	}
	if b.HasDPRank {
		return appendInt(dst, int64(b.DPRank))
	}
	return appendNil(dst)
}

// Field positions of the array form, counted after the tag.
const (
	storedLoRAName = 6 // lora_name; fields before it are always written
	storedGroupIdx = 8
	storedSpecKind = 9
	storedWindow   = 10
)

func (enc Encoder) appendStored(dst []byte, b *Batch, e *Event) []byte {
	if enc.Encoding == Array {
		last := storedLoRAName - 1 // medium
		switch {
		case e.HasSlidingWindow:
			last = storedWindow
		case e.SpecKind != "":
			last = storedSpecKind
		case e.HasGroupIdx:
			last = storedGroupIdx
		case e.LoRAName != "":
			last = storedLoRAName
		}
		dst = appendArrayHeader(dst, 1+last+1)
		dst = appendStr(dst, "BlockStored")
		for i := 0; i <= last; i++ {
			dst = appendStoredField(dst, b, e, storedFields[i])
		}
		return dst
	}
	n := 8 // type and the seven fields without a default
	n += count(e.HasGroupIdx) + count(e.SpecKind != "") + count(e.HasSlidingWindow)
	dst = appendMapHeader(dst, n)
	dst = appendStr(dst, "type")
	dst = appendStr(dst, "BlockStored")
	for _, name := range storedFields[:storedLoRAName+1] {
		dst = appendStr(dst, name)
		dst = appendStoredField(dst, b, e, name)
	}
	if e.HasGroupIdx {
		dst = appendStr(dst, "group_idx")
		dst = appendInt(dst, int64(e.GroupIdx))
	}
	if e.SpecKind != "" {
		dst = appendStr(dst, "kv_cache_spec_kind")
		dst = appendStr(dst, e.SpecKind)
	}
	if e.HasSlidingWindow {
		dst = appendStr(dst, "kv_cache_spec_sliding_window")
		dst = appendInt(dst, int64(e.SlidingWindow))
	}
	return dst
}

// appendStoredField appends the value of one BlockStored field; unset
// optional fields are nil.
func appendStoredField(dst []byte, b *Batch, e *Event, name string) []byte {
	switch name {
	case "block_hashes":
		return appendHashes(dst, b.BlockHashes(e))
	case "parent_block_hash":
		if !e.HasParent {
			return appendNil(dst)
		}
		return appendUint64(dst, e.Parent)
	case "token_ids":
		tokens := b.TokenIDs(e)
		dst = appendArrayHeader(dst, len(tokens))
		for _, t := range tokens {
			dst = appendInt(dst, int64(t))
		}
		return dst
	case "block_size":
		return appendInt(dst, int64(e.BlockSize))
	case "lora_id":
		if !e.HasLoRAID {
			return appendNil(dst)
		}
		return appendInt(dst, e.LoRAID)
	case "medium":
		return appendOptStr(dst, e.Medium)
	case "lora_name":
		return appendOptStr(dst, e.LoRAName)
	case "group_idx":
		if !e.HasGroupIdx {
			return appendNil(dst)
		}
		return appendInt(dst, int64(e.GroupIdx))
	case "kv_cache_spec_kind":
		return appendOptStr(dst, e.SpecKind)
	case "kv_cache_spec_sliding_window":
		if !e.HasSlidingWindow {
			return appendNil(dst)
		}
		return appendInt(dst, int64(e.SlidingWindow))
	}
	return appendNil(dst) // extra_keys
}

func (enc Encoder) appendRemoved(dst []byte, b *Batch, e *Event) []byte {
	if enc.Encoding == Array {
		dst = appendArrayHeader(dst, 3+count(e.HasGroupIdx))
		dst = appendStr(dst, "BlockRemoved")
	} else {
		dst = appendMapHeader(dst, 3+count(e.HasGroupIdx))
		dst = appendStr(dst, "type")
		dst = appendStr(dst, "BlockRemoved")
		dst = appendStr(dst, "block_hashes")
	}
	dst = appendHashes(dst, b.BlockHashes(e))
	if enc.Encoding == Map {
		dst = appendStr(dst, "medium")
	}
	dst = appendOptStr(dst, e.Medium)
	if e.HasGroupIdx {
		if enc.Encoding == Map {
			dst = appendStr(dst, "group_idx")
		}
		dst = appendInt(dst, int64(e.GroupIdx))
	}
	return dst
}

func (enc Encoder) appendCleared(dst []byte) []byte {
	if enc.Encoding == Array {
		dst = appendArrayHeader(dst, 1)
	} else {
		dst = appendMapHeader(dst, 1)
		dst = appendStr(dst, "type")
	}
	return appendStr(dst, "AllBlocksCleared")
}

func appendHashes(dst []byte, hashes []uint64) []byte {
	dst = appendArrayHeader(dst, len(hashes))
	for _, h := range hashes {
		dst = appendUint64(dst, h)
	}
	return dst
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Add appends an event to b with its block hashes and token ids, setting
// the event's ranges into b's flat slices; the other fields of e are
// copied as given. It is how a publisher builds a batch for Encoder.
func (b *Batch) Add(e Event, hashes []uint64, tokens []uint32) {
	e.HashesStart = len(b.Hashes)
	b.Hashes = append(b.Hashes, hashes...)
	e.HashesEnd = len(b.Hashes)
	e.TokensStart = len(b.Tokens)
	b.Tokens = append(b.Tokens, tokens...)
	e.TokensEnd = len(b.Tokens)
	b.Events = append(b.Events, e)
}

// Now returns the current time as vLLM stamps batches: seconds since the
// epoch as a float.
func Now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// The msgpack writers below emit the smallest form of each value (as
// msgspec does), except appendUint64, which always takes the full 8 bytes.

func appendArrayHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	}
	return append(dst, 0xdd, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func appendMapHeader(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xde, byte(n>>8), byte(n))
	}
	return append(dst, 0xdf, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

func appendNil(dst []byte) []byte { return append(dst, 0xc0) }

func appendFloat64(dst []byte, f float64) []byte {
	u := math.Float64bits(f)
	return append(dst, 0xcb, byte(u>>56), byte(u>>48), byte(u>>40), byte(u>>32),
		byte(u>>24), byte(u>>16), byte(u>>8), byte(u))
}

// appendUint64 writes u as msgpack uint64 (0xcf) regardless of its size.
func appendUint64(dst []byte, u uint64) []byte {
	return append(dst, 0xcf, byte(u>>56), byte(u>>48), byte(u>>40), byte(u>>32),
		byte(u>>24), byte(u>>16), byte(u>>8), byte(u))
}

// appendInt writes v in its smallest msgpack integer form.
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0 && v <= 0x7f:
		return append(dst, byte(v))
	case v >= -32 && v < 0:
		return append(dst, byte(v))
	case v >= 0 && v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v >= 0 && v <= math.MaxUint16:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	case v >= 0 && v <= math.MaxUint32:
		return append(dst, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	case v >= 0:
		return appendUint64(dst, uint64(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(dst, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return append(dst, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return append(dst, 0xd3, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
		byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, s...)
}

// appendOptStr writes s, or nil for "" (the decoder's reading of nil).
func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return appendNil(dst)
	}
	return appendStr(dst, s)
}
