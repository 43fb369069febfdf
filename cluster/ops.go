package cluster

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Cluster operations (docs/cluster.md, "Cluster operations"): the
// controller fans a clear, pin, unpin, copy or move out to daemons' admin
// APIs and tracks it until every daemon answered or the deadline passed.
// This file holds the bodies on both hops: client → controller
// (OpRequest, Op) and controller → daemon (Daemon*).

// Operation kinds.
const (
	OpClear = "clear"
	OpPin   = "pin"
	OpUnpin = "unpin"
	OpCopy  = "copy"
	OpMove  = "move"
)

// Bounds of one operation.
const (
	// MaxOpKeys bounds the chunk keys of one operation: a key is about 52
	// bytes of JSON, so MaxOpKeys fit MaxOpBodyBytes.
	MaxOpKeys = 1024
	// MaxOpBodyBytes bounds an operation's request body, and the body of
	// each daemon-side request the controller sends.
	MaxOpBodyBytes = 96 << 10
	// MaxOpTargets bounds the instances one operation names.
	MaxOpTargets = 256
	// DefaultOpTimeout and MaxOpTimeout bound an operation's run.
	DefaultOpTimeout = 30 * time.Second
	MaxOpTimeout     = 10 * time.Minute
)

// Operation and per-daemon states.
const (
	StateRunning = "running" // the operation, or a daemon's part, is under way
	StatePending = "pending" // a daemon's part has not started (a move's source waits for its destination)
	StateOK      = "ok"      // every daemon, or this one, succeeded
	StateError   = "error"   // this daemon failed, or every daemon did
	StatePartial = "partial" // some daemons succeeded and some failed
)

// ChunkKey names one chunk in full: its scope id and its 128-bit hash,
// written "scope/hash" in hex (16 and 32 digits), as chunk.Key prints
// and the daemon's GET /api/v1/keys lists them.
type ChunkKey struct {
	Scope uint64
	Hash  [16]byte
}

// String returns the key as "scope/hash".
func (k ChunkKey) String() string {
	return fmt.Sprintf("%016x/%s", k.Scope, hex.EncodeToString(k.Hash[:]))
}

// MarshalJSON writes the key as a "scope/hash" string.
func (k ChunkKey) MarshalJSON() ([]byte, error) { return strconv.AppendQuote(nil, k.String()), nil }

// UnmarshalJSON reads a "scope/hash" string.
func (k *ChunkKey) UnmarshalJSON(b []byte) error {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return fmt.Errorf("chunk key %.60s: want a string \"scope/hash\"", b)
	}
	v, err := ParseChunkKey(string(b[1 : len(b)-1]))
	*k = v
	return err
}

// ParseChunkKey parses "scope/hash": a scope id of 1 to 16 hex digits and
// a hash of exactly 32.
func ParseChunkKey(s string) (ChunkKey, error) {
	var k ChunkKey
	scope, hash, ok := cutByte(s, '/')
	if !ok || len(scope) == 0 || len(scope) > 16 || len(hash) != 32 {
		return k, fmt.Errorf("chunk key %.60q: want \"scope/hash\" (up to 16 and exactly 32 hex digits)", s)
	}
	v, err := strconv.ParseUint(scope, 16, 64)
	if err != nil {
		return k, fmt.Errorf("chunk key %.60q: scope is not hex", s)
	}
	if _, err := hex.Decode(k.Hash[:], []byte(hash)); err != nil {
		return k, fmt.Errorf("chunk key %.60q: hash is not hex", s)
	}
	k.Scope = v
	return k, nil
}

func cutByte(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// OpRequest is the body of POST /v1/cluster/ops.
type OpRequest struct {
	// Kind is clear, pin, unpin, copy or move.
	Kind string `json:"kind"`
	// Instances names the daemons to run on; All runs on every daemon
	// registered when the operation starts. Exactly one of the two. A
	// copy or move to another daemon names its one source here.
	Instances []string `json:"instances,omitempty"`
	All       bool     `json:"all,omitempty"`
	// Tier narrows a clear to one tier ("mem" or "cpu" for RAM, "disk");
	// empty clears RAM and every tier that can enumerate its chunks.
	Tier string `json:"tier,omitempty"`
	// Scope (a scope id) or Model (every scope the daemon saw of that
	// model) narrows a clear; neither clears every scope.
	Scope HexKey `json:"scope,omitempty"`
	Model string `json:"model,omitempty"`
	// Keys are the chunks a pin, unpin, copy or move is about.
	Keys []ChunkKey `json:"keys,omitempty"`
	// TTLMS is how long a pin lasts, in milliseconds (required for pin;
	// the daemon caps it at its maximum lease, 10 minutes by default).
	TTLMS int64 `json:"ttl_ms,omitempty"`
	// To names the destination daemon of a copy or move between daemons;
	// ToTier the destination tier, within a daemon (required then) or on
	// To ("mem" or "disk"; RAM by default).
	To     string `json:"to,omitempty"`
	ToTier string `json:"to_tier,omitempty"`
	// TimeoutMS bounds the operation: DefaultOpTimeout when 0, at most
	// MaxOpTimeout. A daemon that has not answered by then is an error.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// Timeout returns the operation's deadline from its start.
func (r *OpRequest) Timeout() time.Duration {
	if r.TimeoutMS <= 0 {
		return DefaultOpTimeout
	}
	return time.Duration(r.TimeoutMS) * time.Millisecond
}

// Between reports whether the request copies or moves chunks to another
// daemon, rather than between the tiers of each daemon.
func (r *OpRequest) Between() bool { return (r.Kind == OpCopy || r.Kind == OpMove) && r.To != "" }

// NormalizeTier turns a tier name of an operation into the daemon's name:
// "cpu" (the index's name for RAM) is "mem".
func NormalizeTier(name string) string {
	if name == "cpu" {
		return "mem"
	}
	return name
}

// Validate checks an operation's fields for its kind and normalizes its
// tier names.
func (r *OpRequest) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch r.Kind {
	case OpClear, OpPin, OpUnpin, OpCopy, OpMove:
	default:
		return fmt.Errorf("kind %.40q: want clear, pin, unpin, copy or move", r.Kind)
	}
	r.Tier, r.ToTier = NormalizeTier(r.Tier), NormalizeTier(r.ToTier)
	if len(r.Instances) == 0 {
		r.Instances = nil // [] and none are the same request
	}
	if len(r.Keys) == 0 {
		r.Keys = nil
	}
	errs = append(errs, r.validateTargets())
	if len(r.Keys) > MaxOpKeys {
		add("keys: %d, at most %d", len(r.Keys), MaxOpKeys)
	}
	if r.TimeoutMS < 0 || time.Duration(r.TimeoutMS)*time.Millisecond > MaxOpTimeout {
		add("timeout_ms: want 0 (the default, %v) to %d", DefaultOpTimeout, MaxOpTimeout.Milliseconds())
	}
	if len(r.Model) > 256 || len(r.Tier) > 32 || len(r.ToTier) > 32 {
		add("model, tier or to_tier: too long")
	}
	if r.Kind != OpClear && (r.Tier != "" || r.Scope != 0 || r.Model != "") {
		add("tier, scope and model: only for clear")
	}
	if r.Kind != OpPin && r.TTLMS != 0 {
		add("ttl_ms: only for pin")
	}
	if r.Kind != OpCopy && r.Kind != OpMove && (r.To != "" || r.ToTier != "") {
		add("to and to_tier: only for copy and move")
	}
	switch r.Kind {
	case OpClear:
		if len(r.Keys) > 0 {
			add("keys: a clear takes a tier, scope or model, not keys")
		}
		if r.Scope != 0 && r.Model != "" {
			add("scope and model: give one, not both")
		}
	case OpPin:
		if r.TTLMS <= 0 {
			add("ttl_ms: required for pin, a positive number of milliseconds")
		}
	case OpCopy, OpMove:
		errs = append(errs, r.validateCopy())
	}
	if r.Kind != OpClear && len(r.Keys) == 0 {
		add("keys: required for %s", r.Kind)
	}
	return errors.Join(errs...)
}

func (r *OpRequest) validateTargets() error {
	if r.All == (len(r.Instances) > 0) {
		return errors.New("instances or all: give one of them")
	}
	if len(r.Instances) > MaxOpTargets {
		return fmt.Errorf("instances: %d, at most %d", len(r.Instances), MaxOpTargets)
	}
	for i, name := range r.Instances {
		if err := validName(name); err != nil {
			return err
		}
		if slices.Contains(r.Instances[:i], name) {
			return fmt.Errorf("instances: %q named twice", name)
		}
	}
	return nil
}

func (r *OpRequest) validateCopy() error {
	if r.To == "" {
		if r.ToTier == "" {
			return fmt.Errorf("to or to_tier: a %s needs a destination daemon or tier", r.Kind)
		}
		return nil
	}
	if err := validName(r.To); err != nil {
		return fmt.Errorf("to: %w", err)
	}
	if r.All || len(r.Instances) != 1 {
		return fmt.Errorf("instances: a %s to another daemon names exactly one source", r.Kind)
	}
	if r.Instances[0] == r.To {
		return fmt.Errorf("to: %q is the source; for another tier of the same daemon give to_tier alone", r.To)
	}
	return nil
}

// OpStarted is the reply to POST /v1/cluster/ops (202 Accepted).
type OpStarted struct {
	ID string `json:"id"`
}

// Op is an operation's status, GET /v1/cluster/ops/{id}.
type Op struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	State string `json:"state"` // running, ok, partial or error
	// Created, Deadline and Finished are RFC 3339 times; Finished is
	// empty while the operation runs.
	Created  string         `json:"created"`
	Deadline string         `json:"deadline"`
	Finished string         `json:"finished,omitempty"`
	Request  OpRequest      `json:"request"`
	Results  []DaemonResult `json:"results"`
}

// DaemonResult is one daemon's part of an operation.
type DaemonResult struct {
	Instance string `json:"instance"`
	// Role is "source" or "destination" in a copy or move between
	// daemons, empty otherwise.
	Role  string `json:"role,omitempty"`
	State string `json:"state"` // pending, running, ok or error
	Error string `json:"error,omitempty"`
	// Counts are what the daemon did, by name (see docs/cluster.md).
	Counts   map[string]int `json:"counts,omitempty"`
	Note     string         `json:"note,omitempty"`
	Started  string         `json:"started,omitempty"`
	Finished string         `json:"finished,omitempty"`
}

// OpList is the reply to GET /v1/cluster/ops: the recent operations,
// newest first.
type OpList struct {
	Ops []Op `json:"ops"`
}

// Daemon-side requests: the controller POSTs them to
// <admin>/api/v1/cluster/<action>, and the daemon answers DaemonReply.
const (
	DaemonClearPath = "/api/v1/cluster/clear" // DaemonClear
	DaemonPinPath   = "/api/v1/cluster/pin"   // DaemonPin
	DaemonUnpinPath = "/api/v1/cluster/unpin" // DaemonKeys
	DaemonCopyPath  = "/api/v1/cluster/copy"  // DaemonCopy: between this daemon's tiers
	DaemonPullPath  = "/api/v1/cluster/pull"  // DaemonPull: from another daemon
	DaemonDropPath  = "/api/v1/cluster/drop"  // DaemonKeys: a move's source lets go
)

// DaemonClear asks a daemon to clear a tier ("" for all it can) of a
// scope or a model's scopes (neither: every scope).
type DaemonClear struct {
	Tier  string `json:"tier,omitempty"`
	Scope HexKey `json:"scope,omitempty"`
	Model string `json:"model,omitempty"`
}

// DaemonPin asks a daemon to pin chunks for TTLMS milliseconds.
type DaemonPin struct {
	Keys  []ChunkKey `json:"keys"`
	TTLMS int64      `json:"ttl_ms"`
}

// DaemonKeys names chunks to unpin or to drop.
type DaemonKeys struct {
	Keys []ChunkKey `json:"keys"`
}

// DaemonCopy asks a daemon to copy (or move) chunks into one of its tiers.
type DaemonCopy struct {
	Keys []ChunkKey `json:"keys"`
	Tier string     `json:"tier"`
	Move bool       `json:"move,omitempty"`
}

// DaemonPull asks a daemon to read chunks from the daemon at From (its
// TCP protocol address) and store them, in RAM or in Tier.
type DaemonPull struct {
	From string     `json:"from"`
	Keys []ChunkKey `json:"keys"`
	Tier string     `json:"tier,omitempty"`
}

// DaemonReply is a daemon's answer: what it did, by count, and for a
// pull the keys it now holds.
type DaemonReply struct {
	Counts map[string]int `json:"counts"`
	Keys   []ChunkKey     `json:"keys,omitempty"`
	Note   string         `json:"note,omitempty"`
}
