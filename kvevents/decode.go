package kvevents

// Payload layouts, checked against vllm-project/vllm
// vllm/distributed/kv_events.py at two commits:
//
//   - b4e69e0a (the first release with KV events, v0.9.x era): every struct
//     is msgspec array_like=True, omit_defaults=True, events tag=True. An
//     EventBatch is [ts, events]; BlockStored is ["BlockStored",
//     block_hashes, parent_block_hash, token_ids, block_size, lora_id];
//     BlockRemoved is ["BlockRemoved", block_hashes]; AllBlocksCleared is
//     ["AllBlocksCleared"]. Hashes are Python ints.
//   - 0181ea31 (2026 main, vLLM PR 42892, released in v0.26): the event
//     structs lost array_like, so each event is a map whose "type" key
//     carries the tag; the EventBatch stays the array [ts, events,
//     data_parallel_rank]. BlockStored gained medium, lora_name,
//     extra_keys, group_idx, kv_cache_spec_kind and
//     kv_cache_spec_sliding_window; BlockRemoved gained medium and group_idx.
//     Fields without a default (parent_block_hash, lora_id, medium,
//     lora_name) are always written, possibly as nil; fields equal to their
//     default are omitted. Hashes are ExternalBlockHash = bytes | int.
//
// Releases in between wrote the array form with the newer trailing fields
// and [ts, events, data_parallel_rank]; omit_defaults drops trailing fields
// at their default there. This decoder therefore accepts either form for
// the batch (a map batch too, which no release wrote but costs nothing)
// and, independently, for each event, treats every field after the ones
// the oldest release wrote as optional, and skips unknown trailing array
// elements, unknown map keys and events of unknown type.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrPayload reports a payload that is not a valid vLLM EventBatch.
var ErrPayload = errors.New("kvevents: bad payload")

// Kind is the type of a KV-cache event.
type Kind uint8

const (
	// Unknown is an event whose type this decoder does not know (a newer
	// vLLM); its fields were skipped.
	Unknown Kind = iota
	BlockStored
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// MediumGPU is what a nil medium means.
const MediumGPU = "GPU"

// Event is one decoded event. Its block hashes and token ids live in the
// owning Batch (see Batch.BlockHashes and Batch.TokenIDs) so that events
// hold no slices of their own.
type Event struct {
	Kind Kind

	// HashesStart:HashesEnd index Batch.Hashes.
	HashesStart, HashesEnd int
	// HashBytes reports that at least one hash of this event (block or
	// parent) arrived as raw bytes rather than an integer; its uint64 form is
	// the last 8 bytes read big-endian.
	HashBytes bool

	Parent    uint64
	HasParent bool // false when parent_block_hash is nil or absent

	// TokensStart:TokensEnd index Batch.Tokens.
	TokensStart, TokensEnd int
	BlockSize              int

	// Medium is "" when the field is nil or absent, which means GPU; see
	// MediumOrGPU.
	Medium    string
	LoRAID    int64
	HasLoRAID bool
	LoRAName  string // "" when nil or absent

	GroupIdx    int
	HasGroupIdx bool

	SpecKind         string // kv_cache_spec_kind, "" when absent
	SlidingWindow    int
	HasSlidingWindow bool
}

// MediumOrGPU returns the medium, mapping nil (the default) to "GPU".
func (e *Event) MediumOrGPU() string {
	if e.Medium == "" {
		return MediumGPU
	}
	return e.Medium
}

// Batch is one decoded EventBatch. It is meant to be reused: Decode resets it
// and appends into the same backing arrays, so once they have grown to the
// working size decoding allocates nothing.
type Batch struct {
	Timestamp float64
	DPRank    int
	HasDPRank bool // false when data_parallel_rank is nil or absent

	Events []Event
	Hashes []uint64 // block hashes of all events, in order
	Tokens []uint32 // token ids of all events, in order
}

// Reset empties b, keeping its capacity.
func (b *Batch) Reset() {
	b.Timestamp, b.DPRank, b.HasDPRank = 0, 0, false
	b.Events = b.Events[:0]
	b.Hashes = b.Hashes[:0]
	b.Tokens = b.Tokens[:0]
}

// BlockHashes returns the block hashes of e, an event of b.
func (b *Batch) BlockHashes(e *Event) []uint64 { return b.Hashes[e.HashesStart:e.HashesEnd] }

// TokenIDs returns the token ids of e, an event of b.
func (b *Batch) TokenIDs(e *Event) []uint32 { return b.Tokens[e.TokensStart:e.TokensEnd] }

// maxInterned bounds the Decoder's string table, so that a publisher sending
// ever-new LoRA names cannot grow it without limit.
const maxInterned = 1024

// Decoder decodes EventBatch payloads. It keeps a small table of the strings
// it has seen (media, LoRA names, spec kinds) so that repeated values cost no
// allocation. The zero value is ready to use; it is not safe for concurrent
// use.
type Decoder struct {
	strs map[string]string
	r    reader
}

// Decode parses payload into into, replacing its contents. Nothing in into
// aliases payload. On error into holds a partial result that must not be
// used.
func (d *Decoder) Decode(payload []byte, into *Batch) error {
	into.Reset()
	d.r = reader{b: payload}
	if err := d.batch(into); err != nil {
		return fmt.Errorf("%w: %w", ErrPayload, err)
	}
	if d.r.remaining() != 0 {
		return fmt.Errorf("%w: %d trailing bytes after the batch", ErrPayload, d.r.remaining())
	}
	return nil
}

func (d *Decoder) batch(into *Batch) error {
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		return d.batchMap(into)
	}
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch array has %d elements, want at least 2 (ts, events)", n)
	}
	if into.Timestamp, err = d.r.number(); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err := d.events(into); err != nil {
		return err
	}
	if n >= 3 {
		if into.DPRank, into.HasDPRank, err = d.optInt(); err != nil {
			return fmt.Errorf("batch data_parallel_rank: %w", err)
		}
	}
	return d.skipN(n - 3)
}

func (d *Decoder) batchMap(into *Batch) error {
	n, err := d.r.mapLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	var haveTS, haveEvents bool
	for range n {
		key, err := d.r.str()
		if err != nil {
			return fmt.Errorf("batch key: %w", err)
		}
		switch string(key) {
		case "ts":
			into.Timestamp, err = d.r.number()
			haveTS = true
		case "events":
			// A repeated key replaces, as for any other field.
			into.Events, into.Hashes, into.Tokens = into.Events[:0], into.Hashes[:0], into.Tokens[:0]
			err = d.events(into)
			haveEvents = true
		case "data_parallel_rank":
			into.DPRank, into.HasDPRank, err = d.optInt()
		default:
			err = d.r.skip()
		}
		if err != nil {
			return fmt.Errorf("batch %q: %w", key, err)
		}
	}
	if !haveTS || !haveEvents {
		return errors.New("batch map lacks ts or events")
	}
	return nil
}

func (d *Decoder) events(into *Batch) error {
	n, err := d.r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		into.Events = append(into.Events, Event{})
		e := &into.Events[len(into.Events)-1]
		e.HashesStart, e.HashesEnd = len(into.Hashes), len(into.Hashes)
		e.TokensStart, e.TokensEnd = len(into.Tokens), len(into.Tokens)
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if isMap(c) {
			err = d.eventMap(into, e)
		} else {
			err = d.eventArray(into, e)
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

func isMap(c byte) bool { return c >= 0x80 && c <= 0x8f || c == 0xde || c == 0xdf }

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return Unknown
}

// Positional fields, after the tag, of the array encoding.
var (
	storedFields = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size",
		"lora_id", "medium", "lora_name", "extra_keys", "group_idx",
		"kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = [...]string{"block_hashes", "medium", "group_idx"}
)

// Fields every release wrote; later ones may be absent.
const (
	storedRequired  = 5 // block_hashes .. lora_id
	removedRequired = 1 // block_hashes
)

func (d *Decoder) eventArray(into *Batch, e *Event) error {
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("empty event array, want a type tag first")
	}
	tag, err := d.r.str()
	if err != nil {
		return fmt.Errorf("type tag: %w", err)
	}
	e.Kind = kindOf(tag)
	var fields []string
	switch e.Kind {
	case BlockStored:
		fields = storedFields[:]
		if n-1 < storedRequired {
			return fmt.Errorf("BlockStored has %d fields, want at least %d", n-1, storedRequired)
		}
	case BlockRemoved:
		fields = removedFields[:]
		if n-1 < removedRequired {
			return fmt.Errorf("BlockRemoved has %d fields, want at least %d", n-1, removedRequired)
		}
	}
	known := min(n-1, len(fields))
	for _, name := range fields[:known] {
		if err := d.field(into, e, name); err != nil {
			return fmt.Errorf("%s %s: %w", e.Kind, name, err)
		}
	}
	return d.skipN(n - 1 - known)
}

func (d *Decoder) eventMap(into *Batch, e *Event) error {
	n, err := d.r.mapLen()
	if err != nil {
		return err
	}
	haveType := false
	for range n {
		key, err := d.r.str()
		if err != nil {
			return fmt.Errorf("event key: %w", err)
		}
		if string(key) == "type" {
			tag, err := d.r.str()
			if err != nil {
				return fmt.Errorf("type tag: %w", err)
			}
			e.Kind, haveType = kindOf(tag), true
			continue
		}
		// Field names are shared by all event types, so fields can be
		// decoded even if "type" comes later.
		if err := d.field(into, e, string(key)); err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
	if !haveType {
		return errors.New(`event map lacks "type"`)
	}
	if e.Kind == Unknown {
		// Discard anything decoded from an event we do not understand.
		into.Hashes = into.Hashes[:e.HashesStart]
		into.Tokens = into.Tokens[:e.TokensStart]
		*e = Event{HashesStart: e.HashesStart, HashesEnd: e.HashesStart,
			TokensStart: e.TokensStart, TokensEnd: e.TokensStart}
	}
	return nil
}

// field decodes one named event field into e; unknown names are skipped.
func (d *Decoder) field(into *Batch, e *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		into.Hashes = into.Hashes[:e.HashesStart] // a repeated key replaces
		into.Hashes, err = d.hashes(into.Hashes, e)
		e.HashesEnd = len(into.Hashes)
	case "parent_block_hash":
		if !d.r.nextIsNil() {
			var isBytes bool
			e.Parent, isBytes, err = d.hash()
			e.HasParent = true
			e.HashBytes = e.HashBytes || isBytes
		}
	case "token_ids":
		into.Tokens = into.Tokens[:e.TokensStart]
		into.Tokens, err = d.tokens(into.Tokens)
		e.TokensEnd = len(into.Tokens)
	case "block_size":
		e.BlockSize, err = d.smallInt()
	case "lora_id":
		var v int64
		if !d.r.nextIsNil() {
			v, err = d.r.int64Value()
			e.LoRAID, e.HasLoRAID = v, true
		}
	case "medium":
		e.Medium, err = d.optString()
	case "lora_name":
		e.LoRAName, err = d.optString()
	case "group_idx":
		e.GroupIdx, e.HasGroupIdx, err = d.optInt()
	case "kv_cache_spec_kind":
		e.SpecKind, err = d.optString()
	case "kv_cache_spec_sliding_window":
		e.SlidingWindow, e.HasSlidingWindow, err = d.optInt()
	default: // extra_keys and anything newer
		err = d.r.skip()
	}
	return err
}

// hashes appends a list of block hashes to dst.
func (d *Decoder) hashes(dst []uint64, e *Event) ([]uint64, error) {
	n, err := d.r.arrayLen()
	if err != nil {
		return dst, err
	}
	dst = grow(dst, n)
	for i := range n {
		// Fast path: the unsigned integer forms msgspec writes.
		if u, ok := d.r.fastUint(); ok {
			dst = append(dst, u)
			continue
		}
		h, isBytes, err := d.hash()
		if err != nil {
			return dst, fmt.Errorf("hash %d: %w", i, err)
		}
		e.HashBytes = e.HashBytes || isBytes
		dst = append(dst, h)
	}
	return dst, nil
}

// hash reads one block hash. An integer is taken as is; a negative one (an
// encoder that wrote the hash as a signed int64) keeps its two's-complement
// bits, so it maps to the same uint64 the unsigned encoding would give.
// Raw bytes (a full digest) map to their last 8 bytes read big-endian,
// left-padded with zeros when shorter; empty bytes are an error.
func (d *Decoder) hash() (h uint64, isBytes bool, err error) {
	c, err := d.r.peek()
	if err != nil {
		return 0, false, err
	}
	if c >= 0xc4 && c <= 0xc6 {
		b, err := d.r.bin()
		if err != nil {
			return 0, true, err
		}
		if len(b) == 0 {
			return 0, true, errors.New("empty hash bytes")
		}
		if len(b) >= 8 {
			return binary.BigEndian.Uint64(b[len(b)-8:]), true, nil
		}
		for _, x := range b {
			h = h<<8 | uint64(x)
		}
		return h, true, nil
	}
	h, _, err = d.r.integer()
	return h, false, err
}

// tokens appends a list of token ids to dst.
func (d *Decoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := d.r.arrayLen()
	if err != nil {
		return dst, err
	}
	dst = grow(dst, n)
	for i := range n {
		if u, ok := d.r.fastUint(); ok {
			if u > math.MaxUint32 {
				return dst, fmt.Errorf("token %d: id %d out of uint32 range", i, u)
			}
			dst = append(dst, uint32(u))
			continue
		}
		u, neg, err := d.r.integer()
		if err != nil {
			return dst, fmt.Errorf("token %d: %w", i, err)
		}
		if neg || u > math.MaxUint32 {
			return dst, fmt.Errorf("token %d: id %d out of uint32 range", i, int64(u))
		}
		dst = append(dst, uint32(u))
	}
	return dst, nil
}

// grow makes room for n more elements at once (n is already bounded by the
// payload size).
func grow[T any](s []T, n int) []T {
	if cap(s)-len(s) < n {
		s2 := make([]T, len(s), 2*cap(s)+n)
		copy(s2, s)
		s = s2
	}
	return s
}

// smallInt reads a non-nil integer that must fit in an int32 (sizes,
// indices and ranks).
func (d *Decoder) smallInt() (int, error) {
	v, err := d.r.int64Value()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, fmt.Errorf("integer %d out of range", v)
	}
	return int(v), nil
}

// optInt reads an integer or nil.
func (d *Decoder) optInt() (v int, ok bool, err error) {
	if d.r.nextIsNil() {
		return 0, false, nil
	}
	v, err = d.smallInt()
	return v, err == nil, err
}

// optString reads a str or nil ("").
func (d *Decoder) optString() (string, error) {
	if d.r.nextIsNil() {
		return "", nil
	}
	b, err := d.r.str()
	if err != nil {
		return "", err
	}
	return d.intern(b), nil
}

// intern returns b as a string, allocating only the first time a value is
// seen (the map lookup with string(b) does not allocate).
func (d *Decoder) intern(b []byte) string {
	if s, ok := d.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if d.strs == nil {
		d.strs = make(map[string]string)
	}
	if len(d.strs) < maxInterned {
		d.strs[s] = s
	}
	return s
}

func (d *Decoder) skipN(n int) error {
	for range n {
		if err := d.r.skip(); err != nil {
			return err
		}
	}
	return nil
}
