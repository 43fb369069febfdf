package chunk

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// leBuf returns room bytes of the given filler followed by tokens as
// little-endian bytes: the layout KeysInPlace reads.
func leBuf(room byte, tokens []uint32) []byte {
	b := bytes.Repeat([]byte{room}, HashSize)
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return b
}

func TestKeysInPlaceMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{1, 3, 16, 60, 256, 300} {
		for _, unfull := range []bool{false, true} {
			c := mustChunker(t, goldenScope, size, unfull)
			for _, n := range []int{0, 1, size - 1, size, size + 1, 3*size + 5, 4096} {
				if n < 0 {
					continue
				}
				tokens := make([]uint32, n)
				for i := range tokens {
					tokens[i] = rng.Uint32()
				}
				buf := leBuf(0xA5, tokens)
				orig := slices.Clone(buf)
				got := c.KeysInPlace(nil, buf)
				want := referenceKeys(goldenScope, size, unfull, tokens)
				if !slices.Equal(got, want) {
					t.Fatalf("size %d, unfull %v, %d tokens: KeysInPlace differs from the documented hash", size, unfull, n)
				}
				if !slices.Equal(got, c.Keys(nil, tokens)) {
					t.Fatalf("size %d, unfull %v, %d tokens: KeysInPlace differs from Keys", size, unfull, n)
				}
				if !bytes.Equal(buf, orig) {
					t.Fatalf("size %d, unfull %v, %d tokens: the buffer was not restored", size, unfull, n)
				}
				// A scratch too small, then the one returned.
				var scratch []byte
				for range 2 {
					var got2 []Key
					got2, scratch = c.KeysOfBytes(nil, buf[HashSize:], scratch)
					if !slices.Equal(got2, want) {
						t.Fatalf("size %d, unfull %v, %d tokens: KeysOfBytes differs from the documented hash", size, unfull, n)
					}
				}
			}
		}
	}
}

// The room before the tokens is scratch: whatever it holds, the keys are
// the same.
func TestKeysInPlaceIgnoresRoom(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, true)
	tokens := sequentialTokens(1000)
	a := c.KeysInPlace(nil, leBuf(0, tokens))
	b := c.KeysInPlace(nil, leBuf(0xFF, tokens))
	if !slices.Equal(a, b) {
		t.Fatal("the room's contents changed the keys")
	}
}

func TestKeysInPlaceAppends(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, false)
	tokens := sequentialTokens(600)
	prev := Key{Scope: 9}
	got := c.KeysInPlace([]Key{prev}, leBuf(1, tokens))
	if len(got) != 3 || got[0] != prev || !slices.Equal(got[1:], c.Keys(nil, tokens)) {
		t.Fatalf("KeysInPlace did not append to dst: %d keys", len(got))
	}
}

func TestKeysInPlacePanicsOnBadLength(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, true)
	for _, n := range []int{0, HashSize - 1, HashSize + 1, HashSize + 7} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("KeysInPlace of %d bytes did not panic", n)
				}
			}()
			c.KeysInPlace(nil, make([]byte, n))
		}()
	}
	if got := c.KeysInPlace(nil, make([]byte, HashSize)); len(got) != 0 {
		t.Fatalf("no tokens gave %d keys", len(got))
	}
}

func TestKeysInPlaceDoesNotAllocate(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, true)
	buf := leBuf(0, sequentialTokens(32768+100))
	dst := make([]Key, 0, 129)
	allocs := testing.AllocsPerRun(20, func() { dst = c.KeysInPlace(dst[:0], buf) })
	if allocs != 0 {
		t.Fatalf("KeysInPlace allocated %v times per run", allocs)
	}
	if len(dst) != 129 {
		t.Fatalf("%d keys, want 129", len(dst))
	}
	var scratch []byte
	_, scratch = c.KeysOfBytes(dst[:0], buf[HashSize:], scratch)
	allocs = testing.AllocsPerRun(20, func() { dst, scratch = c.KeysOfBytes(dst[:0], buf[HashSize:], scratch) })
	if allocs != 0 {
		t.Fatalf("KeysOfBytes allocated %v times per run with its scratch", allocs)
	}
}

func TestKeysOfBytesPanicsOnPartialToken(t *testing.T) {
	c := mustChunker(t, goldenScope, 256, true)
	defer func() {
		if recover() == nil {
			t.Error("KeysOfBytes of 7 bytes did not panic")
		}
	}()
	c.KeysOfBytes(nil, make([]byte, 7), nil)
}

// BenchmarkKeysInPlace4K and BenchmarkKeys4K compare the two ways of
// keying a 4,096-token prompt (16 chunks of 256 tokens), the daemon's
// LOOKUP of the lookup-rate benchmark: in place, from the tokens'
// little-endian bytes, against Keys with its streaming hasher.
func BenchmarkKeysInPlace4K(b *testing.B) {
	c := mustChunker(b, goldenScope, DefaultSize, false)
	buf := leBuf(0, sequentialTokens(4096))
	dst := make([]Key, 0, 16)
	b.SetBytes(4 * 4096)
	b.ReportAllocs()
	for b.Loop() {
		dst = c.KeysInPlace(dst[:0], buf)
	}
	sinkKeys = dst
}

func BenchmarkKeys4K(b *testing.B) { benchmarkKeys(b, 4096) }

// BenchmarkKeysOfBytes4K: the same prompt from bytes that may not be
// written, each chunk copied into a scratch buffer.
func BenchmarkKeysOfBytes4K(b *testing.B) {
	c := mustChunker(b, goldenScope, DefaultSize, false)
	buf := leBuf(0, sequentialTokens(4096))[HashSize:]
	dst := make([]Key, 0, 16)
	var scratch []byte
	b.SetBytes(4 * 4096)
	b.ReportAllocs()
	for b.Loop() {
		dst, scratch = c.KeysOfBytes(dst[:0], buf, scratch)
	}
	sinkKeys = dst
}
