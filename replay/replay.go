// Package replay measures kvtier's eviction policies against a recorded
// workload: it reads Mooncake-format request traces, simulates a prefix
// cache under each policy and under Belady's offline optimum, draws the
// result as a chart, and replays the same trace through a real cache.
// It also simulates routing over vLLM pods (SimulateRouting) and a cluster
// of kvtier nodes with and without P2P between them (SimulateNodes).
//
// # Traces
//
// A trace is JSON lines, one request per line (see ReadTrace):
//
//	{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}
//
// hash_ids names the prompt's 512-token blocks, prefix-chained: two requests
// share an id exactly when they share that block and everything before it.
// The last block is partial when input_length is not a multiple of 512.
//
// # Hit semantics
//
// A cache can only reuse a prefix, so block i of a request is a hit when
// blocks 0..i are all cached when the request arrives. After the request,
// all its blocks are cached: cached ones are accessed and missing ones are
// stored, in prompt order. While a request is being stored its own blocks
// are pinned (the policy's busy predicate), as the engine holds them in
// use; a request longer than the whole cache stores only what fits.
//
// The simulations count capacity in blocks (a partial block counts as
// one). Hit rate is hit blocks over block references. Three bounds frame
// the policies:
//
//   - the infinite cache (SimulateInfinite): every reference but the first
//     of each block hits;
//   - Belady's optimum (SimulateOPT): evict the cached block whose next
//     reference is furthest away. On a prefix-chained trace a block is
//     always referenced right after its parent, so its next use is later
//     than its parent's; breaking ties (blocks never used again) deepest
//     first keeps the optimal cache closed under prefixes, which makes it
//     the best any policy can do under prefix semantics too.
//
// # Tokens
//
// To replay a trace through a cache that hashes real token ids (Run), each
// hash id becomes a fixed sequence of 512 token ids (BlockTokens): the
// outputs of a SplitMix64 generator whose state starts at id XOR TokenSeed,
// each output z mapped into [0, Vocab) as ((z>>32) * Vocab) >> 32. A
// partial last block uses the first input_length - 512*k tokens. In Python:
//
//	def block_tokens(id, n, seed=0x6B76746965722D31, vocab=128000):
//	    s, out, m = id ^ seed, [], (1 << 64) - 1
//	    for _ in range(n):
//	        s = (s + 0x9E3779B97F4A7C15) & m
//	        z = s
//	        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
//	        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
//	        z ^= z >> 31
//	        out.append(((z >> 32) * vocab) >> 32)
//	    return out
package replay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// BlockSize is the number of prompt tokens one hash id stands for.
const BlockSize = 512

// Request is one line of a trace.
type Request struct {
	Timestamp    int64    `json:"timestamp"`     // arrival, ms from the start of the trace
	InputLength  int      `json:"input_length"`  // prompt tokens
	OutputLength int      `json:"output_length"` // completion tokens
	HashIDs      []uint64 `json:"hash_ids"`      // one id per BlockSize prompt tokens
}

// BlockLen returns how many tokens block i of the prompt holds: BlockSize,
// except for a partial last block.
func (r *Request) BlockLen(i int) int {
	return min(BlockSize, r.InputLength-i*BlockSize)
}

// maxLine bounds one trace line; a request of a million tokens needs about
// 2,000 ids, far below it.
const maxLine = 16 << 20

// ReadTrace parses a JSON-lines trace. Blank lines are skipped; any other
// line that is not a valid request is an error naming its line number.
func ReadTrace(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var reqs []Request
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		req, err := parseRequest(text)
		if err != nil {
			return nil, fmt.Errorf("replay: trace line %d: %w", line, err)
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("replay: trace line %d: longer than %d bytes: %w", line+1, maxLine, err)
		}
		return nil, fmt.Errorf("replay: reading trace after line %d: %w", line, err)
	}
	return reqs, nil
}

func parseRequest(text []byte) (Request, error) {
	var req Request
	if text[0] != '{' {
		return req, errors.New("not a JSON object")
	}
	if err := json.Unmarshal(text, &req); err != nil {
		return req, err
	}
	return req, req.validate()
}

// validate checks the lengths and that there is one hash id per block.
func (r *Request) validate() error {
	if r.InputLength < 0 || r.OutputLength < 0 {
		return fmt.Errorf("negative length (input %d, output %d)", r.InputLength, r.OutputLength)
	}
	if want := (r.InputLength + BlockSize - 1) / BlockSize; len(r.HashIDs) != want {
		return fmt.Errorf("%d hash_ids for input_length %d, want %d (one per %d tokens)",
			len(r.HashIDs), r.InputLength, want, BlockSize)
	}
	return nil
}
