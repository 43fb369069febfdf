package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// maxClearBody bounds the body of POST /api/v1/clear: it is one small object.
const maxClearBody = 4 << 10

// ClearRequest is the optional body of POST /api/v1/clear.
type ClearRequest struct {
	// Scope is the chunk.Scope ID whose chunks to drop; 0 (or no body)
	// drops everything. In JSON it is a number, or a string holding a
	// decimal or 0x-prefixed hexadecimal number (chunk keys print their
	// scope in hex, and JavaScript numbers cannot hold every uint64).
	Scope ScopeID `json:"scope"`
}

// ScopeID is a scope's 64-bit ID, decoded from a JSON number or string.
type ScopeID uint64

// UnmarshalJSON accepts 123, "123" and "0x7b"; null leaves s as it is.
func (s *ScopeID) UnmarshalJSON(data []byte) error {
	text := string(data)
	if text == "null" {
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		if err := json.Unmarshal(data, &text); err != nil {
			return err
		}
	}
	digits, base := text, 10 // not base 0: "010" is ten, not an octal eight
	if hex, ok := strings.CutPrefix(strings.ToLower(text), "0x"); ok {
		digits, base = hex, 16
	}
	v, err := strconv.ParseUint(digits, base, 64)
	if err != nil {
		return fmt.Errorf("scope: want a number below 2^64 (decimal, or hex with 0x), got %.40q", text)
	}
	*s = ScopeID(v)
	return nil
}

// ClearResult is the response of POST /api/v1/clear.
type ClearResult struct {
	Scope uint64 `json:"scope"`
	// Removed counts the chunks dropped, by tier name.
	Removed map[string]int `json:"removed"`
	// NotCleared names the tiers that kept their chunks, and Note says why.
	NotCleared []string `json:"not_cleared,omitempty"`
	Note       string   `json:"note,omitempty"`
}

// notClearedNote explains the tiers clear leaves alone: shared remote
// stores cannot enumerate a scope's chunks.
const notClearedNote = "remote tiers cannot be cleared by scope: they keep their chunks, and later reads promote them back into RAM"

// decodeClear reads a clear request body; an empty body clears everything.
func decodeClear(body []byte) (ClearRequest, error) {
	var req ClearRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return ClearRequest{}, fmt.Errorf("clear request: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ClearRequest{}, errors.New("clear request: want one JSON object, found more after it")
	}
	return req, nil
}

func (a *API) clear(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxClearBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("clear request: %w", err))
		return
	}
	req, err := decodeClear(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	scope := uint64(req.Scope)
	removed, notCleared := []int(nil), []string(nil)
	if t := tenantOf(r); t != nil {
		scopes, err := a.tenantScopes(t, []uint64{scope})
		if err != nil {
			writeError(w, http.StatusForbidden, err)
			return
		}
		removed, notCleared = a.clearScopes(scopes)
	} else {
		removed, notCleared = a.eng.Clear(scope)
	}
	res := ClearResult{Scope: scope, Removed: map[string]int{}, NotCleared: notCleared}
	for i, name := range a.eng.TierNames() {
		if !slices.Contains(notCleared, name) {
			res.Removed[name] = removed[i]
		}
	}
	if len(res.NotCleared) > 0 {
		res.Note = notClearedNote
	}
	a.log.Info("cleared", "scope", scope, "removed", res.Removed, "not_cleared", res.NotCleared)
	writeJSON(w, http.StatusOK, res)
}
