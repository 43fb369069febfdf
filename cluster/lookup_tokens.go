package cluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"slices"
	"strconv"
)

// Lookups by tokens: the caller sends a prompt's token ids and the scope
// its KV belongs to, and the controller computes the chunk keys a daemon
// would (chunk.Chunker over the scope, with the chunk size the daemons
// registered), so that a router or a tool can ask who holds a prompt
// without hashing it itself.
const (
	// MaxLookupTokens bounds a lookup by tokens: a 1M-token prompt.
	MaxLookupTokens = 1 << 20
	// MaxLookupTokensBodyBytes fits MaxLookupTokens token ids of up to
	// ten digits with their commas, and a scope.
	MaxLookupTokensBodyBytes = MaxLookupTokens*11 + MaxBodyBytes
)

// Scope is the scope of a lookup by tokens: the fields of chunk.Scope.
// A daemon applies its `namespace` setting to requests that name none;
// a lookup is not told of it, so name the namespace the daemons use.
type Scope struct {
	Model     string `json:"model"`
	WorldSize int    `json:"world_size"`
	Rank      int    `json:"rank"`
	Format    string `json:"format"`
	Namespace string `json:"namespace"`
}

// LookupTokens (in the binary form) returns, for each chunk of a prompt of tokens under scope,
// the daemons and tiers holding it, and the chunk size the controller cut
// the prompt with. Only full chunks are looked up: a prompt of n tokens
// has n / chunkSize of them.
func (c *Client) LookupTokens(ctx context.Context, scope Scope, tokens []uint32) (hs [][]Holder, chunkSize int, err error) {
	if len(tokens) > MaxLookupTokens {
		return nil, 0, fmt.Errorf("cluster: lookup of %d tokens, more than %d", len(tokens), MaxLookupTokens)
	}
	body := make([]byte, len(tokens)*4)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(body[i*4:], t)
	}
	var reply LookupReply
	path := "/v1/cluster/lookup?" + scope.Query().Encode()
	if err := c.send(ctx, path, TokensContentType, body, &reply); err != nil {
		return nil, 0, err
	}
	if reply.ChunkSize <= 0 {
		return nil, 0, fmt.Errorf("cluster: a lookup by tokens answered chunk size %d", reply.ChunkSize)
	}
	hs, err = reply.Resolve(len(tokens) / reply.ChunkSize)
	return hs, reply.ChunkSize, err
}

// TokensContentType marks the binary form of a lookup by tokens: the body
// is the token ids as 4-byte little-endian values, and the scope is in
// the query (model, world_size, rank, format, namespace). Decoding it
// costs a copy, where the JSON form's digits cost about 6 ns a token.
const TokensContentType = "application/vnd.kvtier.tokens"

// Query returns the scope as the binary form's query.
func (s Scope) Query() url.Values {
	return url.Values{"model": {s.Model}, "world_size": {strconv.Itoa(s.WorldSize)}, "rank": {strconv.Itoa(s.Rank)},
		"format": {s.Format}, "namespace": {s.Namespace}}
}

// DecodeTokenLookup reads the binary form of a lookup by tokens into req:
// the scope from query, the tokens from body. Query fields other than the
// scope's, a field given twice, or a body that is not whole tokens are
// errors.
func DecodeTokenLookup(query string, body []byte, req *LookupRequest) error {
	q, err := url.ParseQuery(query)
	if err != nil {
		return fmt.Errorf("decoding the query: %w", err)
	}
	var s Scope
	for k, v := range q {
		if len(v) != 1 {
			return fmt.Errorf("query: %s given %d times", k, len(v))
		}
		switch k {
		case "model":
			s.Model = v[0]
		case "format":
			s.Format = v[0]
		case "namespace":
			s.Namespace = v[0]
		case "world_size", "rank":
			n, err := strconv.ParseUint(v[0], 10, 31)
			if err != nil {
				return fmt.Errorf("query: %s: want a non-negative integer, got %q", k, v[0])
			}
			if k == "rank" {
				s.Rank = int(n)
			} else {
				s.WorldSize = int(n)
			}
		default:
			return fmt.Errorf("query: unknown field %q (want model, world_size, rank, format, namespace)", k)
		}
	}
	if len(body)%4 != 0 {
		return fmt.Errorf("body: %d bytes, not a whole number of 4-byte tokens", len(body))
	}
	if len(body)/4 > MaxLookupTokens {
		return fmt.Errorf("%w: more than %d tokens", ErrTooLarge, MaxLookupTokens)
	}
	req.Keys, req.Scope = req.Keys[:0], &s
	req.Tokens = slices.Grow(req.Tokens[:0], len(body)/4)[:len(body)/4]
	for i := range req.Tokens {
		req.Tokens[i] = binary.LittleEndian.Uint32(body[i*4:])
	}
	return nil
}
