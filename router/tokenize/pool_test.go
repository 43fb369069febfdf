package tokenize

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// sharedPrompts returns prompts built from a few long shared prefixes
// (system prompts, documents) followed by random tails, the shape of chat
// traffic the prefix cache is for.
func sharedPrompts(rng *rand.Rand, n int) []string {
	var prefixes []string
	for p := range 4 {
		var b strings.Builder
		for line := 0; b.Len() < 3000+p*2000; line++ {
			fmt.Fprintf(&b, "Line %d of system prompt %d: %s\n", line, p, randomText(rng, 8))
		}
		prefixes = append(prefixes, b.String())
	}
	prompts := make([]string, n)
	for i := range prompts {
		prefix := prefixes[rng.IntN(len(prefixes))]
		prefix = prefix[:len(prefix)/2+rng.IntN(len(prefix)/2)] // shared up to a random point
		var tail strings.Builder
		for range rng.IntN(6) {
			tail.WriteString("\nuser: " + randomText(rng, 1+rng.IntN(30)))
		}
		prompts[i] = prefix + tail.String()
	}
	return prompts
}

func TestPoolCachedEqualsUncached(t *testing.T) {
	for _, tok := range []Tokenizer{cl100kHF(t), r50kHF(t), tiktokenOf(t, "o200k_base")} {
		for _, opts := range []PoolOptions{
			{Segment: 256},
			{Segment: 64, CacheBytes: 16 << 10}, // small: constant eviction
		} {
			t.Run(fmt.Sprintf("%s/%+v", tok.Name(), opts), func(t *testing.T) {
				pool := NewPool(tok, opts)
				rng := rand.New(rand.NewPCG(7, 8))
				n := 150
				if _, slow := tok.(*Tiktoken); slow {
					n = 40 // tiktoken-go runs at well under 1 MB/s
				}
				for i, prompt := range sharedPrompts(rng, scaled(n)) {
					want := mustEncode(t, tok, prompt)
					got, err := pool.Encode(context.Background(), prompt, nil)
					if err != nil {
						t.Fatal(err)
					}
					if !equalIDs(got, want) {
						t.Fatalf("prompt %d: cached tokens differ from uncached (%d vs %d tokens)", i, len(got), len(want))
					}
				}
				s := pool.Stats()
				// With the small cache and few prompts (race runs) evictions
				// may leave no hits; the default cache must hit.
				if s.SegmentMisses == 0 || (opts.CacheBytes == 0 && s.SegmentHits == 0) {
					t.Fatalf("cache not exercised: %+v", s)
				}
				if opts.CacheBytes > 0 && s.Bytes > opts.CacheBytes {
					t.Fatalf("cache holds %d bytes, limit %d", s.Bytes, opts.CacheBytes)
				}
			})
		}
	}
}

func TestPoolConcurrent(t *testing.T) {
	t.Run("hf", func(t *testing.T) { testPoolConcurrent(t, cl100kHF(t), 40) })
	t.Run("tiktoken", func(t *testing.T) { testPoolConcurrent(t, tiktokenOf(t, "cl100k_base"), 8) })
}

func testPoolConcurrent(t *testing.T, tok Tokenizer, n int) {
	pool := NewPool(tok, PoolOptions{Workers: 2, Segment: 128})
	prompts := sharedPrompts(rand.New(rand.NewPCG(9, 10)), n)
	want := make([][]uint32, len(prompts))
	for i, p := range prompts {
		want[i] = mustEncode(t, tok, p)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []uint32
			for i := range prompts {
				k := (i + g*7) % len(prompts)
				var err error
				if dst, err = pool.Encode(context.Background(), prompts[k], dst[:0]); err != nil {
					errs <- err
					return
				}
				if !equalIDs(dst, want[k]) {
					errs <- fmt.Errorf("prompt %d differs under concurrency", k)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// blockingTokenizer holds its caller until released.
type blockingTokenizer struct {
	entered chan struct{}
	release chan struct{}
}

func (b *blockingTokenizer) Name() string { return "blocking" }

func (b *blockingTokenizer) Encode(text string, dst []uint32) ([]uint32, error) {
	b.entered <- struct{}{}
	<-b.release
	return append(dst, uint32(len(text))), nil
}

func TestPoolBoundsWorkers(t *testing.T) {
	tok := &blockingTokenizer{entered: make(chan struct{}), release: make(chan struct{})}
	pool := NewPool(tok, PoolOptions{Workers: 1})
	done := make(chan error)
	go func() {
		_, err := pool.Encode(context.Background(), "abc", nil)
		done <- err
	}()
	<-tok.entered // the only slot is taken
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := pool.Encode(ctx, "x", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("second encode with the slot taken: err = %v, want context.Canceled", err)
	}
	close(tok.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A tokenizer from outside this package cannot be cut: no cache.
	if s := pool.Stats(); s.SegmentHits+s.SegmentMisses != 0 {
		t.Fatalf("foreign tokenizer used the cache: %+v", s)
	}
}

func TestSegmentCacheLRU(t *testing.T) {
	c := newSegmentCache(3 * entryCost(make([]uint32, 4)))
	for i := range 4 {
		c.put(segmentKey{hash: uint64(i)}, []uint32{1, 2, 3, uint32(i)})
		if i == 2 {
			c.get(segmentKey{hash: 0}) // 0 becomes most recent; 1 is evicted next
		}
	}
	if _, ok := c.get(segmentKey{hash: 1}); ok {
		t.Fatal("least recently used entry survived")
	}
	for _, k := range []uint64{0, 2, 3} {
		if got, ok := c.get(segmentKey{hash: k}); !ok || got[3] != uint32(k) {
			t.Fatalf("entry %d: %v, %v", k, got, ok)
		}
	}
	if n, bytes := c.stats(); n != 3 || bytes != 3*entryCost(make([]uint32, 4)) {
		t.Fatalf("stats = %d entries, %d bytes", n, bytes)
	}
}

// TestPoolSharedPrefixServedFromCache is the non-timing half of the prefix
// benchmark: a second prompt sharing 90% of the first is mostly cache hits.
func TestPoolSharedPrefixServedFromCache(t *testing.T) {
	tok := cl100kHF(t)
	pool := NewPool(tok, PoolOptions{})
	shared := englishText(8 << 10 * 9 / 10)
	first, second := shared+"\nThe end.", shared+"\nA different ending, with more words."
	for _, prompt := range []string{first, second} {
		got, err := pool.Encode(context.Background(), prompt, nil)
		if err != nil || !equalIDs(got, mustEncode(t, tok, prompt)) {
			t.Fatalf("pooled encode differs (%v)", err)
		}
	}
	s := pool.Stats()
	if s.SegmentHits == 0 || s.SegmentHits != s.SegmentMisses {
		t.Fatalf("second prompt should reuse every segment of the first: %+v", s)
	}
}

// TestEncodeAllocs: with a reused dst, encoding and cache hits allocate
// nothing.
func TestEncodeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	tok := cl100kHF(t)
	text := englishText(4 << 10)
	dst := mustEncode(t, tok, text)
	if n := testing.AllocsPerRun(20, func() { dst, _ = tok.Encode(text, dst[:0]) }); n != 0 {
		t.Errorf("BPE.Encode: %v allocs per run", n)
	}
	pool := NewPool(tok, PoolOptions{})
	ctx := context.Background()
	dst, _ = pool.Encode(ctx, text, dst[:0])
	if n := testing.AllocsPerRun(20, func() { dst, _ = pool.Encode(ctx, text, dst[:0]) }); n != 0 {
		t.Errorf("Pool.Encode (cached): %v allocs per run", n)
	}
}

func TestPoolSkipsUncuttableTokenizer(t *testing.T) {
	pre := `{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}`
	tok, err := ParseHF("whole", toyJSON(pre, "null", `"ab":256`, []string{"a b"}, false, ""))
	if err != nil {
		t.Fatal(err)
	}
	pool := NewPool(tok, PoolOptions{Segment: 1})
	text := strings.Repeat("ab\nab\n", 100)
	got, err := pool.Encode(context.Background(), text, nil)
	if err != nil || !equalIDs(got, mustEncode(t, tok, text)) {
		t.Fatalf("pooled encode differs (%v)", err)
	}
	if s := pool.Stats(); s.SegmentMisses != 0 {
		t.Fatalf("a tokenizer keeping segments whole was cut: %+v", s)
	}
}
