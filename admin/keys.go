package admin

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"kvtier/chunk"
)

// ScopeInfo is one entry of GET /api/v1/scopes.
type ScopeInfo struct {
	ID        string         `json:"id"` // hex, as keys print it
	Model     string         `json:"model,omitempty"`
	WorldSize int            `json:"world_size,omitempty"`
	Rank      int            `json:"rank,omitempty"`
	Format    string         `json:"format,omitempty"`
	Namespace string         `json:"namespace,omitempty"`
	Chunks    map[string]int `json:"chunks"` // by tier name
	Bytes     map[string]int `json:"bytes"`
}

// KeyInfo is one entry of GET /api/v1/keys.
type KeyInfo struct {
	Scope string `json:"scope"`
	Hash  string `json:"hash"`
	Tier  string `json:"tier"`
	Bytes int    `json:"bytes"`
}

// KeyList is the response of GET /api/v1/keys.
type KeyList struct {
	Keys      []KeyInfo `json:"keys"`
	Truncated bool      `json:"truncated"`
}

// scopes lists every scope with chunks in a local tier, with what the
// engine knows of it from the scopes clients registered.
func (a *API) scopes(w http.ResponseWriter, r *http.Request) {
	t := tenantOf(r)
	byID := map[uint64]*ScopeInfo{}
	a.eng.ListChunks([]uint64{0}, func(name string, k chunk.Key, size int) bool {
		si := byID[k.Scope]
		if si == nil {
			si = &ScopeInfo{ID: fmt.Sprintf("%016x", k.Scope), Chunks: map[string]int{}, Bytes: map[string]int{}}
			byID[k.Scope] = si
		}
		si.Chunks[name]++
		si.Bytes[name] += size
		return true
	})
	out := make([]ScopeInfo, 0, len(byID))
	for id, si := range byID {
		if t != nil && !a.tenantOwns(t, id) {
			continue
		}
		if s, ok := a.eng.Scope(id); ok {
			si.Model, si.WorldSize, si.Rank, si.Format, si.Namespace = s.Model, s.WorldSize, s.Rank, s.Format, s.Namespace
		}
		out = append(out, *si)
	}
	slices.SortFunc(out, func(x, y ScopeInfo) int { return strings.Compare(x.ID, y.ID) })
	writeJSON(w, http.StatusOK, out)
}

const (
	defaultKeyLimit = 100
	maxKeyLimit     = 10000
)

// keys lists stored keys, filtered by scope (?scope=hex id, or ?model=name
// for every scope registered under that model) and by a hex prefix of the
// hash (?prefix=), at most ?limit= of them.
func (a *API) keys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	scopes, err := a.keyScopes(q.Get("scope"), q.Get("model"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if t := tenantOf(r); t != nil {
		var status int
		if scopes, status, err = a.tenantKeyScopes(t, scopes, q.Get("model")); err != nil {
			writeError(w, status, err)
			return
		}
	}
	prefix := strings.ToLower(q.Get("prefix"))
	if _, err := hex.DecodeString(prefix + strings.Repeat("0", len(prefix)%2)); err != nil || len(prefix) > 32 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("prefix: want up to 32 hex digits, got %.40q", prefix))
		return
	}
	limit := defaultKeyLimit
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxKeyLimit {
			writeError(w, http.StatusBadRequest, fmt.Errorf("limit: want 1 to %d, got %.20q", maxKeyLimit, v))
			return
		}
	}
	out := KeyList{Keys: []KeyInfo{}}
	a.eng.ListChunks(scopes, func(name string, k chunk.Key, size int) bool {
		h := hex.EncodeToString(k.Hash[:])
		if !strings.HasPrefix(h, prefix) {
			return true
		}
		if len(out.Keys) == limit {
			out.Truncated = true
			return false
		}
		out.Keys = append(out.Keys, KeyInfo{Scope: fmt.Sprintf("%016x", k.Scope), Hash: h, Tier: name, Bytes: size})
		return true
	})
	writeJSON(w, http.StatusOK, out)
}

// keyScopes turns the scope and model filters into scope ids; [0] means
// every scope.
func (a *API) keyScopes(scope, model string) ([]uint64, error) {
	switch {
	case scope != "" && model != "":
		return nil, fmt.Errorf("give scope or model, not both")
	case scope != "":
		id, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(scope), "0x"), 16, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("scope: want a non-zero hex scope id, got %.40q", scope)
		}
		return []uint64{id}, nil
	case model != "":
		ids := a.eng.ScopesOf(model)
		if len(ids) == 0 {
			return nil, fmt.Errorf("model: no scope of model %.100q was registered", model)
		}
		return ids, nil
	}
	return []uint64{0}, nil
}
