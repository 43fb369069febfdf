package redis

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/remote"
)

// Staged writes (remote.Stager), for per-layer saves: an object is built
// in a staging key a range at a time with SETRANGE, then published under
// its own key with RENAME, so a reader never sees part of it.
//
// The staging key is "{" + the object's key + "}:stage:" + 16 hex digits,
// so in a cluster it hashes to the object key's slot (RENAME needs both
// in one slot); when the key holds a hash tag of its own (the prefix
// has one), the suffix alone is appended, which keeps that tag. Stage
// creates it at its full length (one allocation in Redis, not one per
// write) with a 16-byte marker at offset 0, where the object's header
// goes last, and a TTL of StageTTL. Redis zero-fills the key then, which
// takes time in proportion to its size (tens of milliseconds for 32
// MiB), so Stage's deadline grows with the size as a Put's does.
// Creating the key with the marker alone and letting the writes grow it
// only moves that zero-fill into the first write past the middle (the
// second part's first layer), and costs Redis about as much CPU
// (BenchmarkStageCreate). Every write is a MULTI of its
// SETRANGE and a PEXPIRE that renews the TTL, so a staging key always
// expires StageTTL after its last write: a daemon killed mid-save leaks
// nothing for longer. A write that finds the key gone (expired, evicted,
// the server restarted) recreates it without the marker, which the
// publish checks: such an object is dropped, never published with holes.
//
// Publish is one Lua script, atomic in Redis: check the marker and the
// length, drop the staging key if the object's key exists already
// (content-addressed: same bytes), else write the header over the
// marker, RENAME, and give the object the tier's ttl (PEXPIRE) or none
// (PERSIST), as Put's SET would.

// StageTTL is how long a staging key lives after its last write.
const StageTTL = 60 * time.Second

// stageMarker is the length of the marker at the start of a staging key.
const stageMarker = 16

var (
	_ remote.Stager          = (*Tier)(nil)
	_ remote.StageChooser    = (*Tier)(nil)
	_ remote.StagingReporter = (*Tier)(nil)
)

// Stages implements remote.StageChooser: false with layer_saves=false, in
// a cluster whose prefix lets no staging key share its object key's slot
// (decided at Dial), and after Redis refused a staging command, until its
// back-off has passed (stageoff.go).
func (t *Tier) Stages() bool { return !t.noStage && t.stage.open() }

// Staging implements remote.StagingReporter.
func (t *Tier) Staging() remote.StagingStatus {
	return remote.StagingStatus{On: !t.noStage && t.stage.state.Load() == stagingOn,
		Offs: t.stage.offs.Load(), Refusals: t.stage.refused.Load()}
}

// stageRefused reports whether err is a reply that says Redis will never
// take the staging commands from this client: a command unknown, renamed
// away (rename-command) or forbidden (ACL, or not allowed from a script),
// or keys in different slots.
func stageRefused(msg string) bool {
	lower := strings.ToLower(msg)
	return strings.HasPrefix(msg, "NOPERM") || strings.HasPrefix(msg, "CROSSSLOT") ||
		strings.Contains(lower, "unknown command") || strings.Contains(lower, "unknown redis command") ||
		strings.Contains(lower, "not allowed from script")
}

// unavailableReplies begin the error replies of a server that cannot
// serve now (loading its data, busy in a script, without a master or a
// cluster quorum, a replica that takes no writes): failures of the store,
// as a timeout is.
var unavailableReplies = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "NOREPLICAS"}

// stageErr wraps a staging call's error. An error reply from Redis is an
// answer, not a failure of the server (remote.ErrRefused: the breaker
// does not count it, the chunk is written whole), unless it says the
// server cannot serve now. A reply that says Redis will not take the
// staging commands also turns staging off for the tier until a retry
// after a back-off succeeds (stageoff.go), so that later saves write
// whole chunks without asking again meanwhile.
func (t *Tier) stageErr(what string, key chunk.Key, err error) error {
	var reply goredis.Error
	if !errors.As(err, &reply) || errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis: %s %v: %w", what, key, closedOr(err))
	}
	msg := reply.Error()
	for _, p := range unavailableReplies {
		if strings.HasPrefix(msg, p) {
			return fmt.Errorf("redis: %s %v: %w", what, key, err)
		}
	}
	if stageRefused(msg) {
		t.stage.refusedBy(what, msg)
	}
	return fmt.Errorf("redis: %s %v: %w: %w", what, key, remote.ErrRefused, err)
}

// publishScript: KEYS[1] staging key, KEYS[2] object key; ARGV[1] marker,
// ARGV[2] length, ARGV[3] header, ARGV[4] ttl in ms (0: none). It returns
// 1 published, 0 the object existed, -1 the staging key was lost.
var publishScript = goredis.NewScript(`
if redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] - 1) ~= ARGV[1]
   or redis.call('STRLEN', KEYS[1]) ~= tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1])
  return -1
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('SETRANGE', KEYS[1], 0, ARGV[3])
redis.call('RENAME', KEYS[1], KEYS[2])
if tonumber(ARGV[4]) > 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
else
  redis.call('PERSIST', KEYS[2])
end
return 1
`)

// staged is one staging key.
type staged struct {
	t      *Tier
	key    chunk.Key
	name   string // the object's key
	stage  string // the staging key
	marker [stageMarker]byte
	size   int
	found  bool // Publish found the object's key stored already
}

var _ remote.FoundStoredReporter = (*staged)(nil)

// FoundStored implements remote.FoundStoredReporter.
func (s *staged) FoundStored() bool { return s.found }

// Stage implements remote.Stager.
func (t *Tier) Stage(ctx context.Context, key chunk.Key, size int) (remote.Staged, error) {
	if t.closed.Load() {
		return nil, fmt.Errorf("redis: stage %v: %w", key, tier.ErrClosed)
	}
	if size <= stageMarker || size > maxValue {
		return nil, fmt.Errorf("redis: stage %v: %d bytes (%d to Redis' 512 MiB value limit): %w", key, size, stageMarker+1, tier.ErrTooLarge)
	}
	if !t.stage.claim() {
		return nil, fmt.Errorf("redis: stage %v: staging refused before, retried later: %w", key, remote.ErrNotStaging)
	}
	s := &staged{t: t, key: key, name: t.keyName(key), size: size}
	copy(s.marker[:], "KVTSTAGE")
	if _, err := rand.Read(s.marker[8:]); err != nil {
		return nil, fmt.Errorf("redis: stage %v: %w", key, err)
	}
	var sameSlot bool
	s.stage, sameSlot = stageName(s.name, binary.LittleEndian.Uint64(s.marker[8:]))
	if !sameSlot && t.topology == Cluster {
		return nil, fmt.Errorf("redis: stage %v: prefix %q has a \"}\" but no hash tag: no staging key shares its slot: %w", key, t.prefix, remote.ErrNotStaging)
	}
	ctx, cancel := remote.BoundCall(ctx, t.timeout, t.bandwidth, size)
	defer cancel()
	_, err := t.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Set(ctx, s.stage, s.marker[:], StageTTL)
		p.SetRange(ctx, s.stage, int64(size-1), "\x00")
		return nil
	})
	if err != nil {
		err = t.stageErr(fmt.Sprintf("stage (%d bytes)", size), key, err)
		if !errors.Is(err, remote.ErrRefused) {
			// Cut off at the deadline, the MULTI may still run: drop the
			// key it makes rather than leave it for StageTTL (best
			// effort, on the connection pool's next connection).
			dctx, dcancel := context.WithTimeout(context.Background(), t.timeout)
			_ = t.client.Del(dctx, s.stage).Err()
			dcancel()
		}
		return nil, err
	}
	return s, nil
}

// stageName is the staging key of the object key name (see above). It
// reports false when no staging key can share name's cluster slot: a
// name with a "}" but no hash tag (only a prefix could hold one) is
// hashed whole, and wrapped in braces it would be cut at that "}".
func stageName(name string, nonce uint64) (string, bool) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], nonce)
	suffix := ":stage:" + hex.EncodeToString(n[:])
	if open := strings.IndexByte(name, '{'); open >= 0 {
		if end := strings.IndexByte(name[open+1:], '}'); end > 0 {
			return name + suffix, true // keep the key's own hash tag
		}
	}
	return "{" + name + "}" + suffix, !strings.Contains(name, "}")
}

// WriteAt implements remote.Staged.
func (s *staged) WriteAt(ctx context.Context, off int, data []byte) error {
	if s.t.closed.Load() {
		return fmt.Errorf("redis: staged write %v: %w", s.key, tier.ErrClosed)
	}
	if off < stageMarker || off+len(data) > s.size {
		return fmt.Errorf("redis: staged write %v: [%d, %d) of %d bytes", s.key, off, off+len(data), s.size)
	}
	ctx, cancel := remote.BoundCall(ctx, s.t.timeout, s.t.bandwidth, len(data))
	defer cancel()
	var n *goredis.Cmd
	_, err := s.t.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		// Do with a []byte argument: go-redis writes the slice to the
		// socket as it is, where SetRange would copy it into a string.
		n = p.Do(ctx, "setrange", s.stage, off, data)
		p.PExpire(ctx, s.stage, StageTTL)
		return nil
	})
	if err != nil {
		return s.t.stageErr(fmt.Sprintf("staged write (%d bytes at %d)", len(data), off), s.key, err)
	}
	if got, _ := n.Int64(); got != int64(s.size) {
		// The key was gone and this write made a new, shorter one.
		return fmt.Errorf("redis: staged write %v: staging key of %d bytes, want %d: %w", s.key, got, s.size, remote.ErrStageLost)
	}
	s.t.stats.bytesWritten.Add(uint64(len(data)))
	return nil
}

// Publish implements remote.Staged.
func (s *staged) Publish(ctx context.Context, head []byte) error {
	if s.t.closed.Load() {
		return fmt.Errorf("redis: publish %v: %w", s.key, tier.ErrClosed)
	}
	if len(head) < stageMarker || len(head) > s.size {
		return fmt.Errorf("redis: publish %v: header of %d bytes for %d", s.key, len(head), s.size)
	}
	ctx, cancel := remote.BoundCall(ctx, s.t.timeout, s.t.bandwidth, len(head))
	defer cancel()
	got, err := publishScript.Run(ctx, s.t.client, []string{s.stage, s.name},
		s.marker[:], s.size, head, s.t.ttl.Milliseconds()).Int()
	switch {
	case err != nil:
		return s.t.stageErr("publish", s.key, err)
	case got < 0:
		// The script ran, so Redis takes the staging commands: a trial
		// that lost its staging key still turns staging back on.
		s.t.stage.accepted()
		return fmt.Errorf("redis: publish %v: %w", s.key, remote.ErrStageLost)
	case got == 1:
		s.t.stats.puts.Add(1)
		s.t.stats.bytesWritten.Add(uint64(len(head)))
	default:
		s.found = true
	}
	s.t.stage.accepted()
	s.t.known.add(s.key, s.size)
	return nil
}

// Discard implements remote.Staged.
func (s *staged) Discard(ctx context.Context) error {
	if s.t.closed.Load() {
		return fmt.Errorf("redis: discard %v: %w", s.key, tier.ErrClosed)
	}
	ctx, cancel := remote.BoundCall(ctx, s.t.timeout, s.t.bandwidth, 0)
	defer cancel()
	if err := s.t.client.Del(ctx, s.stage).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return s.t.stageErr("discard", s.key, err)
	}
	return nil
}
