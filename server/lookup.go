package server

import (
	"slices"
	"unsafe"

	"kvtier/chunk"
	"kvtier/wire"
)

// A LOOKUP's cost beyond its round trip is mostly keying its tokens: 4,096
// tokens are 16 KiB to hash. LOOKUP and LOOKUP_BATCH bodies are decoded as
// views (wire.Lookup.DecodeView), so the tokens stay where the read put
// them, and chunk.Chunker.KeysInPlace hashes them there: no copy into a
// token array, none into the hasher. The bytes are the session's own (its
// read buffer, or its body buffer), so borrowing 16 of them before each
// chunk for the parent's hash is safe. Tokens in the request buffer lie in
// a read-only mapping and are copied chunk by chunk into s.hashIn instead.

// lookupKeys resolves the keys of one lookup as resolve does, hashing
// token keys without converting them.
func (s *session) lookupKeys(k *wire.Keys) (resolved, *requestError) {
	switch {
	case k.Kind == wire.KindShared:
		tokens, rerr := s.sharedTokens(&k.Shared)
		if rerr != nil {
			return resolved{}, rerr
		}
		return s.tokenKeys(k, tokenBytes(tokens), false)
	case k.Kind == wire.KindTokens && k.Encoded != nil:
		return s.tokenKeys(k, k.Encoded, true)
	}
	return s.resolve(k)
}

// tokenKeys keys the tokens of k: with inPlace, b is k's encoding (16
// bytes of fixed fields, then the tokens) and writable; otherwise b is
// only the tokens.
func (s *session) tokenKeys(k *wire.Keys, b []byte, inPlace bool) (resolved, *requestError) {
	s.keys = s.keys[:0]
	c, rerr := s.chunker(k.Scope)
	if rerr != nil {
		return resolved{}, rerr
	}
	n := len(b) / 4
	if inPlace {
		n = (len(b) - chunk.HashSize) / 4
	}
	first, err := c.FirstChunk(int(k.Skip), n)
	if err != nil {
		return resolved{}, statusOf(err)
	}
	if inPlace {
		s.keys = c.KeysInPlace(s.keys, b)
	} else {
		s.keys, s.hashIn = c.KeysOfBytes(s.keys, b, s.hashIn)
	}
	return resolved{keys: s.keys, first: first, chunker: c, tokens: n, skip: int(k.Skip)}, nil
}

// chunker returns the chunker of the scope registered under handle,
// asking the engine once per scope and connection.
func (s *session) chunker(handle uint32) (*chunk.Chunker, *requestError) {
	if handle == 0 || int(handle) > len(s.scopes) {
		return nil, fail(wire.StatusNotFound, "scope handle %d is not registered on this connection", handle)
	}
	sc := &s.scopes[handle-1]
	if sc.chunker == nil {
		c, err := s.svc.eng.ScopeChunker(sc.scope)
		if err != nil {
			return nil, statusOf(err)
		}
		sc.chunker = c
	}
	return sc.chunker, nil
}

// hashKeys returns dst (reused) holding the keys of k's hashes under
// scope. This is on the path of every LOOKUP by engine hashes (where
// the hashes are still in the frame, k.Encoded): the keys are sized once
// and filled by index, one copy from the frame, nothing appended.
func hashKeys(dst []chunk.Key, scope uint64, k *wire.Keys) []chunk.Key {
	if k.Encoded == nil {
		dst = slices.Grow(dst[:0], len(k.Hashes))[:len(k.Hashes)]
		for i := range dst {
			dst[i] = chunk.Key{Scope: scope, Hash: k.Hashes[i]}
		}
		return dst
	}
	b := k.HashBytes()
	n := len(b) / chunk.HashSize
	dst = slices.Grow(dst[:0], n)[:n]
	for i := range dst {
		dst[i].Scope = scope
		dst[i].Hash = chunk.Hash(b[i*chunk.HashSize:])
	}
	return dst
}

// tokenBytes views tokens as their bytes; on the little-endian hosts
// that serve request buffers (handleRequestBuffer) those are the
// tokens' little-endian encoding.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
}
