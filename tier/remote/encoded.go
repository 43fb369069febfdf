package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
)

// SpecFunc returns the chunk format of a scope, or the zero Spec when it
// is not known (the object is then stored opaque, see codec.Seal).
type SpecFunc func(scope uint64) kvformat.Spec

// Encoded stores every object of a remote tier as a sealed codec envelope
// (package codec): a header naming format, codec and lengths, and
// checksums of header and payload. Whatever a shared store hands back —
// a torn write, another program's value, another version's object — is
// checked before it reaches RAM: a bad object is a miss and a count
// (Stats().Corrupt), never wrong KV.
//
// The manager asks a tier for an object's size before reading it. With the
// raw codec over a store without range reads the decoded size is the
// stored size minus the header, so Size is the store's own; over a store
// that reads ranges raw objects may be pieced, with a longer header, so
// Size reads the header with one range read (rawSize). With any other
// codec the header must be read, so Size fetches the object and keeps it
// for the Get that follows. Contains
// (tier.Container) answers presence without that fetch.
//
// Besides tier.Tier and tier.Container, Encoded implements
// tier.PrefixContainer, tier.Remover, tier.StatsReporter and io.Closer by
// forwarding to the inner tier (with the default answer when it lacks
// one), and Pinger when the inner tier has it.
type Encoded struct {
	inner    tier.Tier
	name     string
	codec    codec.Codec
	fallback codec.Codec // for chunks of unknown format when codec is lossy
	specOf   SpecFunc
	ranged   RangeGetter // the inner store, when it reads ranges (encoded_range.go)
	stager   Stager      // the inner store, when it stages objects (encoded_write.go)
	guard    *Guarded    // the store's breaker, told what verification finds

	bufs sync.Pool // *[]byte sealed-object buffers

	mu      sync.Mutex
	fetched []fetchedObject // objects read by Size, waiting for Get

	corrupt atomic.Uint64
}

var (
	_ tier.Tier            = (*Encoded)(nil)
	_ tier.Container       = (*Encoded)(nil)
	_ tier.PrefixContainer = (*Encoded)(nil)
	_ tier.Remover         = (*Encoded)(nil)
	_ tier.StatsReporter   = (*Encoded)(nil)
	_ io.Closer            = (*Encoded)(nil)
)

type fetchedObject struct {
	key chunk.Key
	obj []byte
	raw int
}

// maxFetched bounds the objects Size keeps for Get: the manager reads a
// handful of chunks at a time (tier.Options.FetchParallel).
const maxFetched = 8

// Encode wraps inner. name is the tier's name in stats and metrics; c is
// the codec for chunks whose format specOf knows (nil: raw).
func Encode(inner tier.Tier, name string, c codec.Codec, specOf SpecFunc) *Encoded {
	raw, _ := codec.Lookup("raw")
	if c == nil {
		c = raw
	}
	if specOf == nil {
		specOf = func(uint64) kvformat.Spec { return kvformat.Spec{} }
	}
	return &Encoded{inner: inner, name: name, codec: c, fallback: raw, specOf: specOf,
		ranged: rangeGetterOf(inner), stager: stagerOf(inner), guard: GuardOf(inner)}
}

// damaged notes that k's object failed its checks (err says how; d is
// what was read): it counts in Stats().Corrupt. When its bytes are damaged
// (codec.ErrCorrupt: a checksum that does not match), not merely foreign
// (another version's or another program's value), the object is removed
// from the store if the store still holds those bytes (DamageRemover), so
// that storing the chunk again replaces it and one damaged object, read
// again and again, does not make a healthy store look sick; then the read
// counts against the store's health (Guarded.ReportCorrupt). The removal
// comes first because the report may open the circuit (at once, on
// probation), and an open circuit refuses the removal: the object would
// survive to reopen the circuit at the next read, and so on forever.
// When the object is already gone or replaced, another reader of the same
// damaged object (a hot chunk read by several requests at once) removed it
// and counted it: this read does not count again, so that one damaged
// object does not look like a sick store.
func (e *Encoded) damaged(k chunk.Key, err error, d Damage) {
	e.corrupt.Add(1)
	if !errors.Is(err, codec.ErrCorrupt) {
		return
	}
	if removeDamaged(e.inner, k, d) == DamageGone {
		return
	}
	if e.guard != nil {
		e.guard.ReportCorrupt()
	}
}

// verified notes bytes that passed their checks.
func (e *Encoded) verified() {
	if e.guard != nil {
		e.guard.ReportVerified()
	}
}

// Inner returns the wrapped tier.
func (e *Encoded) Inner() tier.Tier { return e.inner }

// Name implements tier.Tier.
func (e *Encoded) Name() string { return e.name }

// Contains implements tier.Container: the inner tier's presence, without
// reading the object.
func (e *Encoded) Contains(k chunk.Key) bool { return tier.Contains(e.inner, k) }

// PrefixContains implements tier.PrefixContainer.
func (e *Encoded) PrefixContains(keys []chunk.Key) int { return tier.PrefixContains(e.inner, keys) }

// Put implements tier.Tier: it seals data and stores the envelope.
func (e *Encoded) Put(ctx context.Context, k chunk.Key, data []byte) error {
	spec := e.specOf(k.Scope)
	c := e.codec
	if spec == (kvformat.Spec{}) && !c.Lossless() {
		c = e.fallback
	}
	bp := e.buf(codec.PiecedHeaderSize + len(data) + len(data)/8)
	defer e.bufs.Put(bp)
	var obj []byte
	var err error
	if e.pieced(c) {
		obj, err = codec.SealPieced((*bp)[:0], spec, data)
	} else {
		obj, err = codec.Seal((*bp)[:0], c, spec, data)
	}
	if err != nil {
		// The format said one thing and the bytes another: keep the
		// chunk, without a description.
		if obj, err = codec.Seal((*bp)[:0], e.fallback, kvformat.Spec{}, data); err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
	}
	*bp = obj
	return e.inner.Put(ctx, k, obj)
}

func (e *Encoded) buf(n int) *[]byte {
	bp, _ := e.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	if cap(*bp) < n {
		*bp = make([]byte, 0, n)
	}
	return bp
}

// Size implements tier.Tier. It returns the decoded size.
func (e *Encoded) Size(k chunk.Key) (int, bool) {
	if raw, ok := e.peekFetched(k); ok {
		return raw, true
	}
	n, ok := e.inner.Size(k)
	if !ok || n < codec.HeaderSize {
		return 0, false
	}
	if e.codec.ID() == codec.IDRaw {
		if e.canRange() { // version 1 or pieced: the header says
			return e.rawSize(k, n)
		}
		return n - codec.HeaderSize, true
	}
	obj, info, err := e.fetch(context.Background(), k, n)
	if err != nil {
		return 0, false
	}
	e.keep(fetchedObject{key: k, obj: obj, raw: info.RawLen})
	return info.RawLen, true
}

// fetch reads the whole sealed object of k, n bytes long, and checks its
// header. The guard below bounds the read by the object's size.
func (e *Encoded) fetch(ctx context.Context, k chunk.Key, n int) ([]byte, codec.Info, error) {
	obj := make([]byte, n)
	got, err := e.inner.Get(ctx, k, obj)
	if err != nil {
		return nil, codec.Info{}, err
	}
	obj = obj[:got]
	info, err := codec.PeekInfo(obj)
	if err != nil {
		e.damaged(k, err, wholeDamage(obj))
		return nil, codec.Info{}, fmt.Errorf("%s: %v: %w", e.name, err, tier.ErrCorrupt)
	}
	return obj, info, nil
}

func (e *Encoded) keep(f fetchedObject) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.fetched) == maxFetched {
		e.fetched = append(e.fetched[:0], e.fetched[1:]...)
	}
	e.fetched = append(e.fetched, f)
}

func (e *Encoded) peekFetched(k chunk.Key) (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, f := range e.fetched {
		if f.key == k {
			return f.raw, true
		}
	}
	return 0, false
}

func (e *Encoded) takeFetched(k chunk.Key) ([]byte, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, f := range e.fetched {
		if f.key == k {
			e.fetched = append(e.fetched[:i], e.fetched[i+1:]...)
			return f.obj, true
		}
	}
	return nil, false
}

// Get implements tier.Tier: it reads the envelope, checks it and decodes
// the chunk into dst.
func (e *Encoded) Get(ctx context.Context, k chunk.Key, dst []byte) (int, error) {
	obj, ok := e.takeFetched(k)
	if !ok {
		n, found := e.inner.Size(k)
		if !found {
			return 0, fmt.Errorf("%s: %v: %w", e.name, k, tier.ErrNotFound)
		}
		bp := e.buf(n)
		defer e.bufs.Put(bp)
		got, err := e.inner.Get(ctx, k, (*bp)[:n])
		if err != nil {
			return 0, err
		}
		obj = (*bp)[:got]
	}
	info, err := codec.PeekInfo(obj)
	if err == nil && info.RawLen > len(dst) {
		// Size promised less: the object changed, or another writer
		// used another codec. Either way this read is unusable.
		err = fmt.Errorf("chunk of %d bytes, buffer of %d", info.RawLen, len(dst))
	}
	if err == nil {
		_, _, err = codec.Unseal(dst[:0], obj)
	}
	if err != nil {
		e.damaged(k, err, wholeDamage(obj))
		return 0, fmt.Errorf("%s: %v: %v: %w", e.name, k, err, tier.ErrCorrupt)
	}
	e.verified()
	return info.RawLen, nil
}

// Remove implements tier.Remover; it removes nothing when the inner tier
// cannot.
func (e *Encoded) Remove(k chunk.Key) bool {
	e.takeFetched(k)
	return tier.Remove(e.inner, k)
}

// Stats implements tier.StatsReporter: the inner tier's, under this tier's
// name, with the objects this layer rejected added to Corrupt.
func (e *Encoded) Stats() tier.Stats {
	st := tier.StatsOf(e.inner)
	st.Name = e.name
	st.Corrupt += e.corrupt.Load()
	return st
}

// Ping implements Pinger when the inner tier does.
func (e *Encoded) Ping(ctx context.Context) error {
	if p, ok := e.inner.(Pinger); ok {
		return p.Ping(ctx)
	}
	return errors.New("remote: tier has no health probe")
}

// Close implements io.Closer.
func (e *Encoded) Close() error { return tier.Close(e.inner) }

// GuardOf returns the circuit breaker inside a remote tier as the engine
// stacks it (Encoded over Guarded), or nil when t has none.
func GuardOf(t tier.Tier) *Guarded {
	for {
		switch x := t.(type) {
		case *Guarded:
			return x
		case *Encoded:
			t = x.Inner()
		default:
			return nil
		}
	}
}
