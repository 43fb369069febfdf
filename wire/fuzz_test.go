package wire

import (
	"bytes"
	"runtime"
	"testing"
	"unsafe"

	"kvtier/chunk"
)

// message is what every request and reply body type offers.
type message interface {
	Append([]byte) []byte
	Decode([]byte) error
}

func messages() []func() message {
	return []func() message{
		func() message { return new(Hello) },
		func() message { return new(HelloReply) },
		func() message { return new(Scope) },
		func() message { return new(Lookup) },
		func() message { return new(LookupReply) },
		func() message { return new(PrepareStore) },
		func() message { return new(Slots) },
		func() message { return new(Commit) },
		func() message { return new(PrepareRetrieve) },
		func() message { return new(KeysOnly) },
		func() message { return new(Store) },
		func() message { return new(DataHeader) },
		func() message { return new(PeerDataHeader) },
		func() message { return new(Flush) },
		func() message { return new(FlushReply) },
		func() message { return new(LookupBatch) },
		func() message { return new(LookupBatchReply) },
		func() message { return new(RequestBuffer) },
	}
}

// FuzzDecode feeds arbitrary bytes to every body decoder and the header
// parser. None may panic; a body that decodes must encode back to exactly
// the same bytes (the encoding is canonical), so a decoder can neither
// skip input nor invent fields.
func FuzzDecode(f *testing.F) {
	keys := Keys{Scope: 1, Kind: KindTokens, Skip: 16, Tokens: []uint32{1, 2, 3}}
	f.Add((&Lookup{LeaseMS: 5, Keys: keys}).Append(nil))
	f.Add((&PrepareStore{Keys: Keys{Scope: 2, Kind: KindHashes, Hashes: []chunk.Hash{{1}}}, Sizes: []uint32{7}}).Append(nil))
	f.Add((&Store{Keys: Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3}}}, Sizes: []uint32{1, 2}}).Append(nil))
	f.Add((&Slots{Lease: 9, Slots: []Slot{{Offset: 4096, Len: 10}}}).Append(nil))
	f.Add((&Hello{Version: 1, Token: "t", Name: "n"}).Append(nil))
	f.Add((&LookupReply{Tokens: 1, ByTier: []uint32{1, 2}}).Append(nil))
	f.Add((&FlushReply{Tiers: []FlushTier{{Name: "disk", Pending: 1, Redone: 2, Missing: 3}}}).Append(nil))
	f.Add((&LookupBatch{Lookups: []Lookup{{LeaseMS: 5, Keys: keys}, {Keys: Keys{Scope: 2, Kind: KindHashes, Hashes: []chunk.Hash{{1}}}}}}).Append(nil))
	f.Add((&LookupBatchReply{Results: []LookupResult{{Reply: LookupReply{Tokens: 1, ByTier: []uint32{1}}}, {Status: StatusNotFound, Message: "no"}}}).Append(nil))
	f.Add((&Lookup{Keys: Keys{Scope: 1, Kind: KindShared, Skip: 16, Shared: SharedTokens{Offset: 64, Count: 100}}}).Append(nil))
	f.Add((&RequestBuffer{Bytes: 1 << 20}).Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		ParseHeader(body)
		for _, mk := range messages() {
			m := mk()
			if m.Decode(body) != nil {
				continue
			}
			if again := m.Append(nil); !bytes.Equal(again, body) {
				t.Fatalf("%T: decoded %x, encodes back as %x", m, body, again)
			}
		}
		checkViews(t, body)
		for _, renew := range []bool{false, true} {
			var l Lease
			if l.Decode(body, renew) == nil && !bytes.Equal(l.Append(nil, renew), body) {
				t.Fatalf("lease does not round-trip")
			}
		}
	})
}

func TestRoundTrips(t *testing.T) {
	keys := Keys{Scope: 3, Kind: KindTokens, Skip: 32, Tokens: []uint32{5, 6, 7, 1 << 31}}
	cases := []message{
		&Hello{Version: Version, Token: "secret", Name: "vllm-0"},
		&HelloReply{Version: 1, HasArena: true, ChunkTokens: 256, ArenaBytes: 1 << 33, LeaseMS: 30000, MaxChunk: MaxChunkBody},
		&Scope{WorldSize: 8, Rank: 3, Model: "meta/llama@3", Format: "bfloat16/KV_2LTD", Namespace: "tenant"},
		&Lookup{LeaseMS: 100, Keys: keys},
		&LookupReply{Tokens: 512, Chunks: 2, Lease: 77, ByTier: []uint32{1, 1}},
		&PrepareStore{LeaseMS: 1, Keys: keys, Sizes: []uint32{10, 20}},
		&Slots{Lease: 1, Tokens: 300, Slots: []Slot{{Offset: 1 << 40, Len: 3, State: SlotStored}}},
		&Commit{Lease: 5, Count: 2},
		&PrepareRetrieve{LeaseMS: 9, Keys: Keys{Scope: 1, Kind: KindHashes, Hashes: []chunk.Hash{{1, 2}, {3}}}},
		&KeysOnly{Keys: Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 1 << 60, Hash: chunk.Hash{9}}}}},
		&Store{Keys: keys, Sizes: []uint32{1}},
		&DataHeader{Tokens: 7, Sizes: []uint32{1, 2, 3}},
		&PeerDataHeader{DataHeader: DataHeader{Tokens: 7, Sizes: []uint32{1, 2}}, Sums: []uint64{1 << 63, 5}},
		&Flush{TimeoutMS: 60_000},
		&FlushReply{Tiers: []FlushTier{{Name: "disk"}, {Name: "redis", Pending: 4, Redone: 2, Missing: 1}}},
		&LookupBatch{Lookups: []Lookup{{LeaseMS: 100, Keys: keys}, {Keys: Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 7}}}}}},
		&Lookup{Keys: Keys{Scope: 2, Kind: KindShared, Skip: 256, Shared: SharedTokens{Offset: 1 << 20, Count: 4096}}},
		&RequestBuffer{Bytes: MaxRequestBuffer},
		&LookupBatchReply{Results: []LookupResult{
			{Reply: LookupReply{Tokens: 512, Chunks: 2, Lease: 77, ByTier: []uint32{1, 1}}},
			{Status: StatusNotFound, Message: "scope handle 9 is not registered"},
			{Reply: LookupReply{}},
		}},
	}
	for _, m := range cases {
		b := m.Append(nil)
		fresh := func() message {
			for _, mk := range messages() {
				if n := mk(); typeName(n) == typeName(m) {
					return n
				}
			}
			return nil
		}()
		if err := fresh.Decode(b); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !bytes.Equal(fresh.Append(nil), b) {
			t.Errorf("%T does not round-trip", m)
		}
		// Every strict prefix is an error, never a panic or a success.
		for n := range len(b) {
			if fresh.Decode(b[:n]) == nil {
				t.Errorf("%T: a %d-byte prefix of %d decoded", m, n, len(b))
			}
		}
	}
}

func typeName(m message) string {
	switch m.(type) {
	case *Hello:
		return "hello"
	case *HelloReply:
		return "helloreply"
	case *Scope:
		return "scope"
	case *Lookup:
		return "lookup"
	case *LookupReply:
		return "lookupreply"
	case *PrepareStore:
		return "preparestore"
	case *Slots:
		return "slots"
	case *Commit:
		return "commit"
	case *PrepareRetrieve:
		return "prepareretrieve"
	case *KeysOnly:
		return "keysonly"
	case *Store:
		return "store"
	case *DataHeader:
		return "dataheader"
	case *PeerDataHeader:
		return "peerdataheader"
	case *Flush:
		return "flush"
	case *FlushReply:
		return "flushreply"
	case *LookupBatch:
		return "lookupbatch"
	case *LookupBatchReply:
		return "lookupbatchreply"
	case *RequestBuffer:
		return "requestbuffer"
	}
	return ""
}

func TestDecodeRejectsHugeCounts(t *testing.T) {
	// A count of 2^32-1 tokens in a 20-byte body must fail before any
	// allocation for them.
	b := (&KeysOnly{Keys: Keys{Scope: 1}}).Append(nil)
	b[12], b[13], b[14], b[15] = 0xff, 0xff, 0xff, 0xff
	// TotalAlloc counts every goroutine's allocations, and other tests'
	// goroutines may still be running: the least of a few tries is this
	// decode's, and an allocation for the count (16 GiB) would be in all.
	least := uint64(1 << 63)
	for range 5 {
		var m KeysOnly
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := m.Decode(b)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatal("huge count accepted")
		}
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	if least > 4096 {
		t.Errorf("huge count: allocated at least %d bytes", least)
	}
}

func TestKeysRules(t *testing.T) {
	bad := []Keys{
		{Scope: 0, Kind: KindTokens},                                            // tokens need a scope
		{Scope: 1, Kind: KindRaw},                                               // raw keys carry their own
		{Scope: 1, Kind: KindHashes, Skip: 16},                                  // skip is for tokens
		{Scope: 1, Kind: KeyKind(7)},                                            // unknown kind
		{Scope: 0, Kind: KindShared},                                            // shared tokens need a scope
		{Scope: 1, Kind: KindShared, Shared: SharedTokens{Offset: 6, Count: 1}}, // not at a multiple of 4
	}
	for _, k := range bad {
		var m KeysOnly
		if m.Decode((&KeysOnly{Keys: k}).Append(nil)) == nil {
			t.Errorf("%+v accepted", k)
		}
	}
}

func BenchmarkLookupDecode(b *testing.B) {
	tokens := make([]uint32, 4096)
	body := (&Lookup{Keys: Keys{Scope: 1, Tokens: tokens}}).Append(nil)
	var m Lookup
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := m.Decode(body); err != nil {
			b.Fatal(err)
		}
	}
}

// checkViews checks that the view decoders accept exactly what Decode
// accepts, encode back to the same bytes, and leave every token where it
// lies: each lookup's Encoded is its keys' bytes in body, with the same
// tokens Decode copies out.
func checkViews(t *testing.T, body []byte) {
	t.Helper()
	var l, lv Lookup
	err, errv := l.Decode(body), lv.DecodeView(body)
	if (err == nil) != (errv == nil) {
		t.Fatalf("lookup: Decode says %v, DecodeView %v", err, errv)
	}
	if err == nil {
		checkView(t, body, &l.Keys, &lv.Keys)
		if again := lv.Append(nil); !bytes.Equal(again, body) {
			t.Fatalf("lookup view: decoded %x, encodes back as %x", body, again)
		}
	}
	var b, bv LookupBatch
	err, errv = b.Decode(body), bv.DecodeView(body)
	if (err == nil) != (errv == nil) {
		t.Fatalf("lookup batch: Decode says %v, DecodeView %v", err, errv)
	}
	if err == nil {
		for i := range b.Lookups {
			checkView(t, body, &b.Lookups[i].Keys, &bv.Lookups[i].Keys)
		}
		if again := bv.Append(nil); !bytes.Equal(again, body) {
			t.Fatalf("lookup batch view: decoded %x, encodes back as %x", body, again)
		}
	}
}

func checkView(t *testing.T, body []byte, k, v *Keys) {
	t.Helper()
	if k.Len() != v.Len() || k.Kind != v.Kind || k.Scope != v.Scope || k.Skip != v.Skip {
		t.Fatalf("view keys %+v differ from decoded %+v", v, k)
	}
	if k.Kind == KindHashes {
		checkHashView(t, body, k, v)
		return
	}
	if k.Kind != KindTokens {
		if v.Encoded != nil {
			t.Fatalf("kind %d keys with Encoded set", k.Kind)
		}
		return
	}
	if len(v.Tokens) != 0 || len(v.Encoded) != keysFixed+4*len(k.Tokens) {
		t.Fatalf("view of %d tokens: %d tokens decoded, %d bytes encoded", len(k.Tokens), len(v.Tokens), len(v.Encoded))
	}
	if !bytes.Equal(v.TokenBytes(), appendU32Array(nil, k.Tokens)) {
		t.Fatal("view token bytes differ from the decoded tokens")
	}
	// In place: the view's bytes are body's, not a copy.
	if len(v.Encoded) > 0 && !overlaps(body, v.Encoded) {
		t.Fatal("the view does not alias the body")
	}
}

// checkHashView: a view of hashes leaves them in the body, the same
// hashes Decode copies out.
func checkHashView(t *testing.T, body []byte, k, v *Keys) {
	t.Helper()
	if len(v.Hashes) != 0 || len(v.Encoded) != keysFixed+16*len(k.Hashes) {
		t.Fatalf("view of %d hashes: %d hashes decoded, %d bytes encoded", len(k.Hashes), len(v.Hashes), len(v.Encoded))
	}
	for i, h := range k.Hashes {
		if !bytes.Equal(v.HashBytes()[16*i:16*i+16], h[:]) {
			t.Fatalf("view hash %d differs from the decoded one", i)
		}
	}
	if len(v.Encoded) > 0 && !overlaps(body, v.Encoded) {
		t.Fatal("the view does not alias the body")
	}
}

// overlaps reports whether sub lies inside b's memory.
func overlaps(b, sub []byte) bool {
	if len(b) == 0 || len(sub) == 0 {
		return false
	}
	lo, hi := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[len(b)-1]))
	p := uintptr(unsafe.Pointer(&sub[0]))
	return p >= lo && p+uintptr(len(sub))-1 <= hi
}
