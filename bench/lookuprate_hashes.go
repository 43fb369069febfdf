package bench

import (
	"context"
	"encoding/binary"
	"fmt"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/wire"
)

// Lookups by engine hashes (key kind 1): the engine sends one 16-byte
// chained hash per chunk that it computed itself, so the daemon hashes
// nothing. vLLM computes its block hashes when a request is created,
// for its own prefix cache, whether or not a connector asks for them
// (docs/vllm.md, docs/bench.md); the hashes here are kvtier's own chunk
// hashes of the prompt, computed once by the client, which the bench
// stores the prompts under besides their token keys (storeHashKeys). The
// "client hashes" kind recomputes them on every call, so the cost the
// daemon no longer pays shows up on the client's side.

// promptHashes returns the chunk hashes of tokens under benchScope with
// chunks of size tokens, a trailing partial chunk included (as the token
// keys' chunk count is).
func promptHashes(c *chunk.Chunker, tokens []uint32) []chunk.Hash {
	keys := c.Keys(nil, tokens)
	hs := make([]chunk.Hash, len(keys))
	for i, k := range keys {
		hs[i] = k.Hash
	}
	return hs
}

// storeHashKeys stores the cached chunks of every prompt under its hash
// keys too and checks that a lookup by them finds exactly those chunks.
// A daemon whose namespace makes its token keys differ from these hashes
// then holds both; one where they agree already holds them.
func storeHashKeys(ctx context.Context, c *client.Client, h uint32, ps []benchPrompt, small [][]byte) error {
	hc, err := chunk.NewChunker(benchScope, c.ChunkTokens(), true)
	if err != nil {
		return err
	}
	for i := range ps {
		p := &ps[i]
		p.hashes = promptHashes(hc, p.tokens)
		if len(p.hashes) != p.chunks {
			return fmt.Errorf("prompt %d: %d hashes for %d chunks", i, len(p.hashes), p.chunks)
		}
		if _, err := c.Store(ctx, client.Hashes(h, p.hashes[:p.cached]), small[:p.cached]); err != nil {
			return err
		}
		hit, err := c.Lookup(ctx, client.Hashes(h, p.hashes), 0)
		if err != nil {
			return err
		}
		if int(hit.Chunks) != p.cached {
			return fmt.Errorf("prompt %d by hashes: %d chunks cached, want %d", i, hit.Chunks, p.cached)
		}
	}
	return nil
}

// hashLookupClient looks the prompts up by their chunk hashes, one
// LOOKUP after another or all in one LOOKUP_BATCH, and checks every
// answer. With rehash it computes the hashes of the prompt it looks up
// on every call (LOOKUP only).
type hashLookupClient struct {
	*client.Client
	prompts []benchPrompt
	keys    []wire.Lookup
	batch   bool
	rehash  *chunk.Chunker
	encoded [][]byte // with rehash: each prompt's tokens, little-endian
	scratch []chunk.Key
	hashIn  []byte
	hashes  []chunk.Hash
	next    int
}

func dialHashLookup(ctx context.Context, sock string, ps []benchPrompt, batch int, rehash bool) (rateClient, error) {
	c, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		return nil, err
	}
	h, err := c.Scope(ctx, benchScope)
	if err != nil {
		c.Close()
		return nil, err
	}
	l := &hashLookupClient{Client: c, prompts: ps, batch: batch > 1}
	l.keys = make([]wire.Lookup, len(ps))
	for i, p := range ps {
		l.keys[i].Keys = client.Hashes(h, p.hashes)
	}
	if rehash {
		if l.rehash, err = chunk.NewChunker(benchScope, c.ChunkTokens(), true); err != nil {
			c.Close()
			return nil, err
		}
		for _, p := range ps {
			b := make([]byte, 0, 4*len(p.tokens))
			for _, t := range p.tokens {
				b = binary.LittleEndian.AppendUint32(b, t)
			}
			l.encoded = append(l.encoded, b)
		}
	}
	return l, nil
}

func (l *hashLookupClient) do(ctx context.Context) (int, error) {
	if l.batch {
		res, err := l.LookupBatch(ctx, l.keys)
		if err != nil {
			return 0, err
		}
		for i := range res {
			if err := client.ResultErr(&res[i]); err != nil {
				return 0, err
			}
			if err := l.check(i, &res[i].Reply); err != nil {
				return 0, err
			}
		}
		return len(res), nil
	}
	i := l.next % len(l.prompts)
	l.next++
	keys := l.keys[i].Keys
	if l.rehash != nil {
		// What an engine without hashes of its own would pay per lookup:
		// kvtier's chained xxh3 of the whole prompt, in the client, by
		// the daemon's own way for tokens it cannot write to.
		l.scratch, l.hashIn = l.rehash.KeysOfBytes(l.scratch[:0], l.encoded[i], l.hashIn)
		l.hashes = l.hashes[:0]
		for _, k := range l.scratch {
			l.hashes = append(l.hashes, k.Hash)
		}
		keys.Hashes = l.hashes
	}
	hit, err := l.Lookup(ctx, keys, 0)
	if err != nil {
		return 0, err
	}
	return 1, l.check(i, &hit)
}

// check wants prompt i's cached chunks, and no token count: a lookup by
// hashes does not know how many tokens a chunk holds.
func (l *hashLookupClient) check(i int, hit *wire.LookupReply) error {
	p := &l.prompts[i]
	if int(hit.Chunks) != p.cached || hit.Tokens != 0 {
		return fmt.Errorf("lookup of prompt %d by hashes hit %d chunks, %d tokens; want %d, 0", i, hit.Chunks, hit.Tokens, p.cached)
	}
	return nil
}
