package remote_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"kvtier/chunk"
	"kvtier/codec"
	"kvtier/kvformat"
	"kvtier/tier"
	"kvtier/tier/fs"
	"kvtier/tier/remote"
)

var spec = kvformat.Spec{Layers: 2, KVHeads: 2, HeadDim: 64, DType: kvformat.BFloat16, Layout: kvformat.Layout2LTD, ChunkTokens: 16}

const knownScope = 0x51

func specOf(scope uint64) kvformat.Spec {
	if scope == knownScope {
		return spec
	}
	return kvformat.Spec{}
}

func fsTier(t *testing.T) *fs.Tier {
	t.Helper()
	ft, err := fs.New(fs.Config{Root: t.TempDir()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ft
}

func TestEncodedRoundTrips(t *testing.T) {
	ctx := context.Background()
	data := codec.SyntheticKV(spec, 16, 1)
	for _, name := range []string{"raw", "zstd", "lz4", "int8", "fp8"} {
		c, err := codec.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		ft := fsTier(t)
		e := remote.Encode(ft, "fs", c, specOf)
		k := chunk.Key{Scope: knownScope, Hash: chunk.Hash{1}}
		if err := e.Put(ctx, k, data); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		size, ok := e.Size(k)
		if !ok || size != len(data) {
			t.Fatalf("%s: Size = %d %v, want %d", name, size, ok, len(data))
		}
		dst := make([]byte, size)
		if n, err := e.Get(ctx, k, dst); err != nil || n != len(data) {
			t.Fatalf("%s: Get: %d %v", name, n, err)
		}
		if c.Lossless() && !bytes.Equal(dst, data) {
			t.Errorf("%s: lossless codec changed the bytes", name)
		}
		// A scope of unknown format is stored opaque, losslessly, even
		// when the codec is lossy.
		odd := bytes.Repeat([]byte{7, 1, 3}, 999)
		ko := chunk.Key{Scope: 0x99, Hash: chunk.Hash{2}}
		if err := e.Put(ctx, ko, odd); err != nil {
			t.Fatalf("%s: opaque put: %v", name, err)
		}
		size, _ = e.Size(ko)
		dst = make([]byte, size)
		if n, err := e.Get(ctx, ko, dst); err != nil || !bytes.Equal(dst[:n], odd) {
			t.Errorf("%s: opaque round trip: %v", name, err)
		}
		e.Close()
	}
}

// TestEncodedRejectsForeignAndCorruptObjects writes bytes that are not
// envelopes, or damaged ones, straight into the store: reads are misses
// (ErrCorrupt, counted), never wrong data.
func TestEncodedRejectsForeignAndCorruptObjects(t *testing.T) {
	ctx := context.Background()
	zstd, _ := codec.Lookup("zstd")
	for _, c := range []codec.Codec{nil, zstd} {
		ft := fsTier(t)
		e := remote.Encode(ft, "fs", c, specOf)
		data := codec.SyntheticKV(spec, 16, 2)
		good := chunk.Key{Scope: knownScope, Hash: chunk.Hash{3}}
		if err := e.Put(ctx, good, data); err != nil {
			t.Fatal(err)
		}
		sealed := make([]byte, 1<<20)
		n, _ := ft.Get(ctx, good, sealed)
		sealed = sealed[:n]
		flipped := append([]byte(nil), sealed...)
		flipped[len(flipped)-1] ^= 1
		cases := map[string][]byte{
			"foreign":   bytes.Repeat([]byte("someone else's value"), 100),
			"flipped":   flipped,
			"truncated": sealed[:len(sealed)-10],
		}
		i := byte(10)
		for name, obj := range cases {
			k := chunk.Key{Scope: knownScope, Hash: chunk.Hash{i}}
			i++
			if err := ft.Put(ctx, k, obj); err != nil {
				t.Fatal(err)
			}
			size, ok := e.Size(k)
			if !ok {
				continue // rejected at the header: a miss
			}
			dst := make([]byte, size)
			if _, err := e.Get(ctx, k, dst); !errors.Is(err, tier.ErrCorrupt) {
				t.Errorf("codec %v, %s object: Get error %v, want ErrCorrupt", c, name, err)
			}
		}
		if got := e.Stats().Corrupt; got == 0 {
			t.Errorf("codec %v: no corrupt objects counted", c)
		}
		if e.Stats().Name != "fs" {
			t.Errorf("name %q", e.Stats().Name)
		}
		e.Close()
	}
}
