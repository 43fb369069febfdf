package disk

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// ckptSteps are the steps writeCheckpoint reports to its hook, in order.
var ckptSteps = []string{"written", "synced", "renamed", "done"}

// crashCkptOptions make a crash child checkpoint every few records.
func crashCkptOptions(o Options) Options {
	o.CheckpointRecords = 5
	o.CheckpointInterval = -1
	return o
}

// TestCrashDuringCheckpoint SIGKILLs children that write a checkpoint
// every five records, each time at a step of writing one (after the
// temporary file is written, after it is synced, after the rename, after
// the directory sync), alternating plain runs and eviction churn, with
// O_DIRECT and through the page cache, and in every third run with the
// child's policy taking in the checkpoint it opened from late (warm.go).
// Whatever checkpoint the kill leaves, acknowledged Puts must read back exactly,
// acknowledged Removes must stay removed, and nothing may read back wrong.
func TestCrashDuringCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	// Churn runs in a tier too small for the plain runs' keys: one
	// directory for each.
	dirs := [2]string{t.TempDir(), t.TempDir()}
	r := rand.New(rand.NewPCG(2026, 17))
	puts := [2]map[uint64]bool{{}, {}}
	removes := [2]map[uint64]bool{{}, {}}
	const trials = 24
	used, atStep := 0, map[string]int{}
	for trial := range trials {
		base := uint64(trial) * 1_000_000
		churn := trial%2 == 1
		dir, put, removed := dirs[trial%2], puts[trial%2], removes[trial%2]
		step := ckptSteps[trial%len(ckptSteps)]
		nth := 1 + r.IntN(6) // kill at this checkpoint's step
		seenCkpt := 0
		kill := func(line string, _ int) bool {
			if line == fmt.Sprintf("C %d", trial%len(ckptSteps)) {
				seenCkpt++
				return seenCkpt == nth
			}
			return false
		}
		mode := DirectAuto
		if trial%3 == 2 {
			mode = DirectOff // through the page cache
		}
		if trial%3 == 1 {
			// The child's policy takes in its checkpoint late: the kill
			// may come while operations wait for it or sit in its queue.
			t.Setenv(crashSlowWarm, strconv.Itoa(r.IntN(40)))
		} else {
			t.Setenv(crashSlowWarm, "")
		}
		seen := runCrashChildUntil(t, dir, base, mode, churn, true, kill, false, 0, put, removed)
		if seenCkpt >= nth {
			atStep[step]++
		}
		opts := crashCkptOptions(crashOptions(DirectAuto, churn))
		d := openTier(t, dir, opts)
		if d.Recovered().Checkpoint {
			used++
		}
		// Evicted, or removed unacknowledged.
		checkAfterCrash(t, d, trial, base, seen, put, removed, func(n uint64) bool { return churn || removable(n) })
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d acknowledged puts, %d removes; killed at steps %v; %d of %d recoveries used a checkpoint",
		len(puts[0])+len(puts[1]), len(removes[0])+len(removes[1]), atStep, used, trials)
	if used == 0 {
		t.Fatal("no recovery used a checkpoint")
	}
}
