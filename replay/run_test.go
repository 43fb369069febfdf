package replay

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"testing"
)

// chunkCache is an unbounded cache keyed like kvtier's: tokens cut into
// chunks of a fixed size, each chunk's key chained over everything before
// it. A trailing partial chunk is stored under its own key.
type chunkCache struct {
	chunk  int
	stored map[uint64]bool
	keys   []uint64
	fail   error
}

func (c *chunkCache) chain(tokens []uint32) []uint64 {
	c.keys = c.keys[:0]
	var prev uint64
	var buf [4]byte
	for lo := 0; lo < len(tokens); lo += c.chunk {
		h := fnv.New64a()
		var p [8]byte
		binary.LittleEndian.PutUint64(p[:], prev)
		h.Write(p[:])
		for _, tok := range tokens[lo:min(lo+c.chunk, len(tokens))] {
			binary.LittleEndian.PutUint32(buf[:], tok)
			h.Write(buf[:])
		}
		prev = h.Sum64()
		c.keys = append(c.keys, prev)
	}
	return c.keys
}

func (c *chunkCache) Lookup(tokens []uint32) (int, error) {
	if c.fail != nil {
		return 0, c.fail
	}
	hit := 0
	for _, k := range c.chain(tokens) {
		if !c.stored[k] {
			break
		}
		hit = min(hit+c.chunk, len(tokens))
	}
	return hit, nil
}

func (c *chunkCache) Store(tokens []uint32) error {
	for _, k := range c.chain(tokens) {
		c.stored[k] = true
	}
	return nil
}

// With no eviction, a real chunked cache must see exactly the simulated
// infinite cache's hits, whatever its chunk size (a divisor of BlockSize).
func TestRunMatchesInfiniteSimulation(t *testing.T) {
	reqs := randomTrace(rand.New(rand.NewPCG(11, 12)), 300, 80)
	want := SimulateInfinite(reqs)
	for _, chunk := range []int{BlockSize, 256, 128} {
		var calls, last int
		got, err := Run(context.Background(), reqs, &chunkCache{chunk: chunk, stored: map[uint64]bool{}}, func(done, total int) {
			calls++
			if done != last+1 || total != len(reqs) {
				t.Fatalf("progress(%d, %d) after %d", done, total, last)
			}
			last = done
		})
		if err != nil {
			t.Fatal(err)
		}
		if calls != len(reqs) {
			t.Errorf("progress called %d times for %d requests", calls, len(reqs))
		}
		if got.Requests != want.Requests || got.BlockRefs != want.BlockRefs || got.HitBlocks != want.HitBlocks ||
			got.HitTokens != want.HitTokens || got.Tokens != want.Tokens {
			t.Errorf("chunk %d: Run = %+v\nsimulation says %+v", chunk, got, want)
		}
		if want.HitBlocks == 0 {
			t.Fatal("the trace has no reuse; the comparison proves nothing")
		}
	}
}

// A cache that matches part of a block: hit tokens count it, hit blocks not.
type fixedCache int

func (f fixedCache) Lookup(tokens []uint32) (int, error) { return int(f), nil }
func (fixedCache) Store([]uint32) error                  { return nil }

func TestRunCountsWholeBlocks(t *testing.T) {
	reqs := []Request{{InputLength: 1100, HashIDs: []uint64{1, 2, 3}}}
	for _, tc := range []struct{ hit, blocks, tokens int }{
		{0, 0, 0}, {511, 0, 511}, {512, 1, 512}, {1099, 2, 1099}, {1100, 3, 1100}, {5000, 3, 1100}, {-3, 0, 0},
	} {
		r, err := Run(context.Background(), reqs, fixedCache(tc.hit), nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.HitBlocks != tc.blocks || r.HitTokens != int64(tc.tokens) {
			t.Errorf("Lookup %d: %d blocks, %d tokens; want %d, %d", tc.hit, r.HitBlocks, r.HitTokens, tc.blocks, tc.tokens)
		}
	}
}

func TestRunErrors(t *testing.T) {
	reqs := requests([]uint64{1}, []uint64{1, 2})
	boom := errors.New("engine down")
	if _, err := Run(context.Background(), reqs, &chunkCache{chunk: 512, stored: map[uint64]bool{}, fail: boom}, nil); !errors.Is(err, boom) || !strings.Contains(err.Error(), "request 0") {
		t.Errorf("error %v, want the cache's, naming request 0", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, reqs, fixedCache(0), nil); !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	bad := []Request{{InputLength: 2000, HashIDs: []uint64{1}}}
	if _, err := Run(context.Background(), bad, fixedCache(0), nil); err == nil || !strings.Contains(err.Error(), "hash_ids") {
		t.Errorf("error %v, want one about the request's hash ids", err)
	}
}
