// Package cluster is the registry API between kvtier daemons and the
// controller, and the client both sides use: the request and reply
// bodies of /v1/cluster/* (docs/cluster.md), the holder of a chunk as a
// lookup names it, and Client, which registers, heartbeats and looks
// chunks up. It imports nothing of the daemon's or the controller's, so
// that tiers (the P2P tier) and the controller can both depend on it.
//
// Chunks are named by their index key, chunk.Key.Index: a uint64 that
// the cluster's one block index (router/index) is keyed by. A lookup may
// also name a prompt by its tokens and scope, which the controller turns
// into the same keys (lookup_tokens.go, decoded by lookup_decode.go).
package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// HolderPrefix starts the index pod name of a registered daemon,
// "daemon:<instance>", so that daemons never collide with the vLLM pods
// the same index routes for.
const HolderPrefix = "daemon:"

// Topic is the ZMQ topic of a daemon's chunk stream.
func Topic(instance string) string { return "kvtier@" + instance + "@chunks" }

// MaxBodyBytes bounds every request body of the registry API except
// lookups; MaxLookupKeys bounds a lookup (a 1M-token prompt in 256-token
// chunks is 4096 keys).
const (
	MaxBodyBytes  = 64 << 10
	MaxLookupKeys = 8192
	// MaxLookupBodyBytes fits MaxLookupKeys hex keys with their quotes,
	// commas and some whitespace.
	MaxLookupBodyBytes = MaxLookupKeys*20 + 1024
)

// Tier is one tier of a daemon and its size.
type Tier struct {
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacity_bytes"`
}

// Register is the body of POST /v1/cluster/register.
type Register struct {
	// Instance names the daemon, unique in the cluster.
	Instance string `json:"instance"`
	// Addr is the daemon's TCP protocol address (host:port): peers pull
	// chunks from it.
	Addr string `json:"addr"`
	// Events is the ZMQ endpoint of the daemon's chunk stream.
	Events string `json:"events"`
	// Admin is the base URL of the daemon's admin API, where the
	// controller asks for a resync.
	Admin  string   `json:"admin"`
	Tiers  []Tier   `json:"tiers"`
	Scopes []string `json:"scopes,omitempty"`
	// ChunkSize is the daemon's tokens per chunk (chunk_size), which a
	// lookup by tokens needs to cut a prompt as the daemons do; 0 when
	// the daemon does not say.
	ChunkSize int `json:"chunk_size,omitempty"`
}

// Registered is the reply to a registration.
type Registered struct {
	Session             string `json:"session"`
	HeartbeatIntervalMS int64  `json:"heartbeat_interval_ms"`
}

// Heartbeat is the body of POST /v1/cluster/heartbeat and
// /v1/cluster/deregister.
type Heartbeat struct {
	Instance string `json:"instance"`
	Session  string `json:"session"`
}

// Instance is one registered daemon as GET /v1/cluster/instances lists it.
type Instance struct {
	Register
	Session    string         `json:"session"`
	Registered string         `json:"registered"` // RFC 3339
	LastBeat   string         `json:"last_beat"`  // RFC 3339
	Chunks     map[string]int `json:"chunks"`     // chunk events applied, by kind
	Resyncs    uint64         `json:"resyncs"`
}

// Holder is one daemon holding a chunk in one tier ("cpu" for RAM,
// "disk"), as a lookup reports it.
type Holder struct {
	Instance string `json:"instance"`
	Addr     string `json:"addr"`
	Tier     string `json:"tier"`
}

// LookupRequest is the body of POST /v1/cluster/lookup, in one of two
// forms: Keys, index keys as 16 hex digits each (JSON numbers lose
// precision above 2⁵³); or Scope and Tokens, a prompt the controller cuts
// into chunks and hashes as the daemons do (see lookup_tokens.go).
type LookupRequest struct {
	Keys   []HexKey `json:"keys,omitempty"`
	Scope  *Scope   `json:"scope,omitempty"`
	Tokens []uint32 `json:"tokens,omitempty"`
}

// LookupReply lists each daemon holding any of the keys once, and for
// each key (in request order) its holders as indexes into Daemons. A
// lookup by tokens also gives the chunk size the prompt was cut with:
// holders[i] is chunk i, tokens [i·ChunkSize, (i+1)·ChunkSize).
type LookupReply struct {
	ChunkSize int          `json:"chunk_size,omitempty"`
	Daemons   []Daemon     `json:"daemons"`
	Holders   [][]HolderAt `json:"holders"`
}

// Daemon is a holder's identity in a LookupReply.
type Daemon struct {
	Instance string `json:"instance"`
	Addr     string `json:"addr"`
}

// HolderAt is one holding in a LookupReply.
type HolderAt struct {
	Daemon int    `json:"daemon"`
	Tier   string `json:"tier"`
}

// HexKey is an index key written as 16 lowercase hex digits.
type HexKey uint64

// MarshalJSON writes the key as a 16-digit hex string.
func (k HexKey) MarshalJSON() ([]byte, error) { return AppendHexKey(nil, uint64(k)), nil }

// UnmarshalJSON reads a hex string of 1 to 16 digits.
func (k *HexKey) UnmarshalJSON(b []byte) error {
	v, err := ParseHexKey(b)
	*k = HexKey(v)
	return err
}

const hexDigits = "0123456789abcdef"

// AppendHexKey appends k as a quoted 16-digit hex string.
func AppendHexKey(dst []byte, k uint64) []byte {
	dst = append(dst, '"')
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hexDigits[(k>>uint(shift))&0xf])
	}
	return append(dst, '"')
}

// ParseHexKey parses a quoted hex string of 1 to 16 digits.
func ParseHexKey(b []byte) (uint64, error) {
	if len(b) < 3 || len(b) > 18 || b[0] != '"' || b[len(b)-1] != '"' {
		return 0, fmt.Errorf("index key %.40s: want a string of 1 to 16 hex digits", b)
	}
	var v uint64
	for _, c := range b[1 : len(b)-1] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("index key %.40s: want hex digits", b)
		}
		v = v<<4 | uint64(d)
	}
	return v, nil
}

// Decode reads one strict JSON value of at most limit bytes from r into v:
// unknown fields, trailing data and oversized bodies are errors
// (ErrTooLarge for the last, so handlers can answer 413).
func Decode(r io.Reader, limit int64, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if int64(len(data)) > limit {
		return fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding the body: %w", err)
	}
	if dec.More() {
		return errors.New("decoding the body: data after the JSON value")
	}
	return nil
}

// ErrTooLarge reports a request body over its limit.
var ErrTooLarge = errors.New("body too large")

// Validate checks a registration's fields.
func (r *Register) Validate() error {
	var errs []error
	if err := validName(r.Instance); err != nil {
		errs = append(errs, err)
	}
	if r.Addr == "" {
		errs = append(errs, errors.New("addr: required, the daemon's TCP protocol address (host:port)"))
	}
	if r.Events == "" {
		errs = append(errs, errors.New("events: required, the ZMQ endpoint of the daemon's chunk stream"))
	}
	if r.Admin == "" {
		errs = append(errs, errors.New("admin: required, the base URL of the daemon's admin API"))
	}
	if len(r.Tiers) > 16 || len(r.Scopes) > 1024 {
		errs = append(errs, errors.New("tiers or scopes: too many (at most 16 tiers and 1024 scopes)"))
	}
	if r.ChunkSize < 0 {
		errs = append(errs, fmt.Errorf("chunk_size: want a positive number of tokens (or none), got %d", r.ChunkSize))
	}
	return errors.Join(errs...)
}

// validName accepts instance names of 1 to 128 printable ASCII
// characters without '@', which the chunk stream's topic uses as a
// separator.
func validName(s string) error {
	if s == "" || len(s) > 128 {
		return fmt.Errorf("instance: want 1 to 128 characters, got %d", len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '@' {
			return fmt.Errorf("instance %s: character %d is not printable ASCII other than '@'", strconv.Quote(s), i)
		}
	}
	return nil
}
