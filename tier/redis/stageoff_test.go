package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/tier/remote"
)

// TestStagingRetriedAfterRefusal: Redis refuses the publish script to the
// tier's user (an ACL without scripting: NOPERM), and staging goes off,
// counted once. Until the back-off has passed, saves ask Redis nothing;
// then one chunk tries, is refused again, and the back-off doubles. Once
// the operator grants scripting (ACL SETUSER, no restart of anything),
// the next trial publishes, staging is on again for every chunk, and
// every chunk saved on the way reads back byte-exact through a breaker
// that never counted a failure. The clock is the test's own.
func TestStagingRetriedAfterRefusal(t *testing.T) {
	srv := ownServer(t)
	raw := srv.rawClient()
	ctx := context.Background()
	if err := raw.Do(ctx, "ACL", "SETUSER", "kv", "on", ">pw", "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	rt, g, e := stageStack(t, "redis://kv:pw@"+srv.addr(), strictBreaker)
	var clock atomic.Int64
	clock.Store(time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC).UnixNano())
	rt.stage.now = func() time.Time { return time.Unix(0, clock.Load()) }
	advance := func(d time.Duration) { clock.Add(int64(d)) }

	keys, chunks := stageChunks(8, 70)
	save := func(i int) error { // one chunk, alone, so the order is the test's
		t.Helper()
		return saveWhole(t, e, keys[i:i+1], chunks[i:i+1])[0]
	}
	status := func(what string, on bool, offs, refusals uint64) {
		t.Helper()
		if st := rt.Staging(); st.On != on || st.Offs != offs || st.Refusals != refusals {
			t.Fatalf("%s: staging %+v, want on %v, offs %d, refusals %d", what, st, on, offs, refusals)
		}
	}

	if err := save(0); !errors.Is(err, remote.ErrRefused) || errors.Is(err, remote.ErrNotStaging) {
		t.Fatalf("first save: %v, want Redis' refusal", err)
	}
	status("refused", false, 1, 1)
	if rt.Stages() || e.WritesRanges() {
		t.Fatal("staging on right after a refusal")
	}
	evals := commandCalls(t, raw, "evalsha")
	if err := save(1); err != nil { // written whole, Redis not asked to stage
		t.Fatalf("save during the back-off: %v", err)
	}
	advance(StageRetry)
	if !rt.Stages() {
		t.Fatal("no retry once the back-off has passed")
	}
	if err := save(2); !errors.Is(err, remote.ErrRefused) || errors.Is(err, remote.ErrNotStaging) {
		t.Fatalf("trial: %v, want Redis' refusal again", err)
	}
	if n := commandCalls(t, raw, "evalsha"); n != evals+1 {
		t.Fatalf("%d publishes asked of Redis since the refusal, want the trial's 1", n-evals)
	}
	status("trial refused", false, 1, 2)
	advance(StageRetry)
	if rt.Stages() {
		t.Fatal("retrying again after one back-off; it should have doubled")
	}
	// Asked directly while no trial is due, the tier refuses by itself,
	// which the breaker does not count.
	if _, err := g.Stage(ctx, keys[3], 1000); !errors.Is(err, remote.ErrNotStaging) {
		t.Fatalf("Stage during the back-off: %v", err)
	}

	if err := raw.Do(ctx, "ACL", "SETUSER", "kv", "+@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	advance(StageRetry)
	if err := save(4); err != nil {
		t.Fatalf("trial after the ACL was mended: %v", err)
	}
	status("accepted", true, 1, 2)
	for i := 5; i < 8; i++ {
		if err := save(i); err != nil {
			t.Fatalf("save %d with staging on again: %v", i, err)
		}
	}
	if n := commandCalls(t, raw, "evalsha"); n != evals+5 {
		t.Fatalf("%d publishes since the refusal, want 5 (the trials and the 3 after)", n-evals)
	}
	checkStoredWhole(t, "retried", g, e, append(keys[:3:3], keys[4:]...), append(chunks[:3:3], chunks[4:]...))
}

// TestStagingTrialThatLostItsKeyTurnsItOn: a trial whose staging key was
// lost before its publish (expired, evicted) fails with ErrStageLost, but
// the publish script ran, so Redis takes the staging commands: staging is
// on again (was: off until the next trial, a back-off later).
func TestStagingTrialThatLostItsKeyTurnsItOn(t *testing.T) {
	srv := sharedServer(t)
	rt, _, e := stageStack(t, srv.url(""), strictBreaker)
	raw := srv.rawClient()
	ctx := context.Background()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC).UnixNano())
	rt.stage.now = func() time.Time { return time.Unix(0, clock.Load()) }
	rt.stage.refusedBy("publish", "NOPERM (as a test's)")
	if rt.Staging().On {
		t.Fatal("staging on after a refusal")
	}
	clock.Add(int64(StageRetry))

	keys, chunks := stageChunks(1, 80)
	w, err := e.OpenWrite(ctx, keys[0], len(chunks[0]))
	if err != nil || w == nil {
		t.Fatalf("no trial once the back-off has passed: %v, %v", w, err)
	}
	if err := w.WriteRange(ctx, chunks[0], 0, stageChunk-100); err != nil {
		t.Fatal(err)
	}
	if err := raw.Del(ctx, stagingKeys(t, raw, rt, keys[0])...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx, chunks[0], chunk.Key{}, false); !errors.Is(err, remote.ErrStageLost) {
		t.Fatalf("commit of a trial that lost its staging key: %v", err)
	}
	if st := rt.Staging(); !st.On {
		t.Fatalf("after the trial's publish ran: %+v, want staging on", st)
	}
}
