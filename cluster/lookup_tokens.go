package cluster

import (
	"context"
	"encoding/json"
	"fmt"
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

// LookupTokens returns, for each chunk of a prompt of tokens under scope,
// the daemons and tiers holding it, and the chunk size the controller cut
// the prompt with. Only full chunks are looked up: a prompt of n tokens
// has n / chunkSize of them.
func (c *Client) LookupTokens(ctx context.Context, scope Scope, tokens []uint32) (hs [][]Holder, chunkSize int, err error) {
	if len(tokens) > MaxLookupTokens {
		return nil, 0, fmt.Errorf("cluster: lookup of %d tokens, more than %d", len(tokens), MaxLookupTokens)
	}
	sb, err := json.Marshal(scope)
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: %w", err)
	}
	body := make([]byte, 0, 32+len(sb)+len(tokens)*7)
	body = append(body, `{"scope":`...)
	body = append(body, sb...)
	body = append(body, `,"tokens":[`...)
	for i, t := range tokens {
		if i > 0 {
			body = append(body, ',')
		}
		body = strconv.AppendUint(body, uint64(t), 10)
	}
	body = append(body, "]}"...)
	var reply LookupReply
	if err := c.do(ctx, "/v1/cluster/lookup", body, &reply); err != nil {
		return nil, 0, err
	}
	if reply.ChunkSize <= 0 {
		return nil, 0, fmt.Errorf("cluster: a lookup by tokens answered chunk size %d", reply.ChunkSize)
	}
	hs, err = reply.Resolve(len(tokens) / reply.ChunkSize)
	return hs, reply.ChunkSize, err
}
