package config

import (
	"errors"
	"fmt"
	"strings"
)

// KeyError is a problem with one configuration key. Loaders join one per
// bad key with errors.Join, so errors.As finds the first and the message
// lists them all, one per line.
type KeyError struct {
	Key    string // the key as written, e.g. "chunk_size"
	Source string // "file.yaml:12", "env KVTIER_CHUNK_SIZE", or "" if unknown
	Err    error
}

func (e *KeyError) Error() string {
	msg := "key " + e.Key + ": " + e.Err.Error()
	if e.Source == "" {
		return msg
	}
	return e.Source + ": " + msg
}

func (e *KeyError) Unwrap() error { return e.Err }

var (
	// ErrUnknownKey: the key is neither a kvtier key nor an LMCache one
	// (nor an older LMCache name, nor an ec_ override of an LMCache key).
	ErrUnknownKey = errors.New("unknown key")
	// ErrDuplicateKey: the same key (or a synonym) is set twice in one source.
	ErrDuplicateKey = errors.New("set more than once")
	// ErrUnsupported: an LMCache option kvtier refuses (see lmcache.go), set
	// to a value other than LMCache's default.
	ErrUnsupported = errors.New("is an LMCache option kvtier does not support yet")
)

// nearestKey returns the known key closest to key when it is near enough
// to be a typo, or "".
func nearestKey(key string) string { return nearestIn(key, allKeyNames) }

// nearestIn returns the name in names closest to key, if it is at most two
// edits away, or "".
func nearestIn(key string, names []string) string {
	if len(key) > 64 { // no key is this long; spare the quadratic work
		return ""
	}
	best, bestDist := "", 3 // more than two edits away is not a typo
	for _, k := range names {
		if d := editDistance(key, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance, using one row of memory.
func editDistance(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		diag := row[0]
		row[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			next := min(row[j]+1, row[j-1]+1, diag+cost)
			diag, row[j] = row[j], next
		}
	}
	return row[len(b)]
}

// oneOf formats the error for a value outside an enumeration.
func oneOf(got string, valid []string) error {
	return fmt.Errorf("want one of %s, got %q", strings.Join(valid, ", "), got)
}

// keyErrors flattens err (a *KeyError or a join of them) for inspection.
func keyErrors(err error) []*KeyError {
	var out []*KeyError
	var walk func(error)
	walk = func(e error) {
		if ke, ok := e.(*KeyError); ok {
			out = append(out, ke)
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, inner := range j.Unwrap() {
				walk(inner)
			}
		}
	}
	walk(err)
	return out
}
