package ingest

import (
	"errors"
	"math"
	"slices"
	"testing"

	"kvtier/router/index"
)

type fixture struct {
	ix   *index.Index
	pods *index.Pods
	cs   *counterSet
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	ix, err := index.New(index.Config{MaxBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	return fixture{ix: ix, pods: index.NewPods(), cs: new(counterSet)}
}

// holdings returns the (pod name, tier) holdings of block h, sorted.
func (f fixture) holdings(h uint64) []string {
	var out []string
	for _, e := range f.ix.Holders(h, nil) {
		name, _ := f.pods.Name(e.Pod)
		out = append(out, name+"/"+e.Tier.String())
	}
	slices.Sort(out)
	return out
}

func (f fixture) stats(pod string) PodStats { return f.cs.get(pod).snapshot() }

func wantHoldings(t *testing.T, f fixture, h uint64, want ...string) {
	t.Helper()
	if got := f.holdings(h); !slices.Equal(got, want) {
		t.Errorf("block %#x held by %v, want %v", h, got, want)
	}
}

func TestTierOf(t *testing.T) {
	for _, c := range []struct {
		medium string
		tier   index.Tier
		ok     bool
	}{
		{"", index.GPU, true}, {"GPU", index.GPU, true}, {"gpu", index.GPU, true},
		{"CPU", index.CPU, true}, {"cpu", index.CPU, true},
		{"DISK", index.Disk, true}, {"disk", index.Disk, true},
		{"LocalDisk", 0, false}, {"nvme", 0, false},
	} {
		tier, ok := TierOf(c.medium)
		if ok != c.ok || (ok && tier != c.tier) {
			t.Errorf("TierOf(%q) = %v, %v; want %v, %v", c.medium, tier, ok, c.tier, c.ok)
		}
	}
}

func TestStreamAppliesEvents(t *testing.T) {
	for _, enc := range encodings {
		t.Run(enc.String(), func(t *testing.T) {
			f := newFixture(t)
			s := newStream(f.ix, f.pods, f.cs, "fallback", nil)
			topic := "kv@pod-a@org/model"

			s.handle(frames(topic, 0, batch(t, enc,
				stored(enc, nil, 1, 2, 3), stored(enc, "CPU", 3, 4), stored(enc, "DISK", 5),
				stored(enc, "nvme", 6))))
			wantHoldings(t, f, 1, "pod-a/gpu")
			wantHoldings(t, f, 3, "pod-a/cpu", "pod-a/gpu")
			wantHoldings(t, f, 4, "pod-a/cpu")
			wantHoldings(t, f, 5, "pod-a/disk")
			wantHoldings(t, f, 6) // unknown medium: skipped

			s.handle(frames(topic, 1, batch(t, enc, removed(enc, nil, 1, 3), removed(enc, "CPU", 4))))
			wantHoldings(t, f, 1)
			wantHoldings(t, f, 3, "pod-a/cpu")
			wantHoldings(t, f, 4)

			// An empty topic (vLLM's default) falls back to the configured pod.
			s.handle(frames("", 0, batch(t, enc, stored(enc, nil, 7))))
			wantHoldings(t, f, 7, "fallback/gpu")

			s.handle(frames(topic, 2, batch(t, enc, cleared(enc))))
			wantHoldings(t, f, 2)
			wantHoldings(t, f, 3)
			wantHoldings(t, f, 5)
			wantHoldings(t, f, 7, "fallback/gpu") // another pod is untouched

			got := f.stats("pod-a")
			want := PodStats{Messages: 3, Events: 6, BlocksAdded: 6, BlocksRemoved: 3, Clears: 1, Skipped: 1}
			if got != want {
				t.Errorf("stats\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestStreamCountsMalformed(t *testing.T) {
	f := newFixture(t)
	s := newStream(f.ix, f.pods, f.cs, "fallback", nil)
	good := batch(t, tagged, stored(tagged, nil, 1))
	for _, fr := range [][][]byte{
		{[]byte("kv@p@m"), seqFrame(0)},                             // two frames
		{[]byte("kv@p@m"), []byte{1, 2, 3}, good},                   // short seq
		frames("kv@p@m", 0, []byte{0xc1}),                           // invalid msgpack
		frames("kv@p@m", 0, good[:len(good)-3]),                     // truncated
		frames("kv@p@m", 0, []byte{0x93, 0xcb}),                     // lying length
		frames("kv@p@m", 0, batch(t, tagged, []any{"BlockStored"})), // missing hashes
	} {
		s.handle(fr)
	}
	if got := f.stats("fallback").Malformed; got != 2 {
		t.Errorf("fallback pod: %d malformed, want 2 (bad framing)", got)
	}
	if got := f.stats("p"); got.Malformed != 4 || got.Events != 0 {
		t.Errorf("pod p: %+v, want 4 malformed and no events", got)
	}
	s.handle(frames("kv@p@m", 1, good))
	wantHoldings(t, f, 1, "p/gpu")
}

func TestStreamGapWithoutReplayIsCounted(t *testing.T) {
	f := newFixture(t)
	s := newStream(f.ix, f.pods, f.cs, "p", nil)
	s.handle(frames("", 10, batch(t, tagged, stored(tagged, nil, 1))))
	s.handle(frames("", 14, batch(t, tagged, stored(tagged, nil, 2))))
	wantHoldings(t, f, 2, "p/gpu")
	if got := f.stats("p"); got.Gaps != 1 || got.Lost != 3 || got.Replays != 0 {
		t.Errorf("stats %+v, want 1 gap, 3 lost, no replay", got)
	}
}

func TestStreamGapIsReplayedInOrder(t *testing.T) {
	f := newFixture(t)
	buffer := map[uint64][]byte{
		// Seq 11 stores block 5, seq 12 removes it again: applying the
		// replay out of order would leave block 5 behind.
		11: batch(t, mapped, stored(mapped, nil, 5)),
		12: batch(t, mapped, removed(mapped, nil, 5), stored(mapped, nil, 6)),
		13: batch(t, mapped, stored(mapped, nil, 7)),
		14: batch(t, mapped, stored(mapped, nil, 8)),
	}
	var starts []uint64
	replay := func(start uint64, visit func(uint64, []byte)) error {
		starts = append(starts, start)
		for seq := start; seq <= 14; seq++ {
			visit(seq, buffer[seq])
			if seq == 11 {
				visit(seq, buffer[seq]) // a duplicate is ignored
			}
		}
		return nil
	}
	s := newStream(f.ix, f.pods, f.cs, "p", replay)
	s.handle(frames("kv@p@m", 10, batch(t, mapped, stored(mapped, nil, 1))))
	s.handle(frames("kv@p@m", 14, buffer[14]))
	if !slices.Equal(starts, []uint64{11}) {
		t.Errorf("replay requested from %v, want [11]", starts)
	}
	wantHoldings(t, f, 5)
	wantHoldings(t, f, 6, "p/gpu")
	wantHoldings(t, f, 7, "p/gpu")
	wantHoldings(t, f, 8, "p/gpu")
	got := f.stats("p")
	if got.Gaps != 1 || got.Replays != 1 || got.Lost != 0 || got.Messages != 5 || got.BlocksAdded != 5 {
		t.Errorf("stats %+v, want 1 gap, 1 replay, 0 lost, 5 messages, 5 blocks added", got)
	}
}

func TestStreamReplayFailureCountsLoss(t *testing.T) {
	f := newFixture(t)
	replay := func(start uint64, visit func(uint64, []byte)) error {
		visit(start, batch(t, tagged, stored(tagged, nil, 3))) // one, then the socket dies
		return errors.New("timeout")
	}
	s := newStream(f.ix, f.pods, f.cs, "p", replay)
	s.handle(frames("", 0, batch(t, tagged)))
	s.handle(frames("", 5, batch(t, tagged)))
	// Three messages are gone: the pod's state is unknown, so even what
	// the replay did deliver is dropped.
	wantHoldings(t, f, 3)
	if got := f.stats("p"); got.ReplayFailures != 1 || got.Lost != 3 {
		t.Errorf("stats %+v, want 1 replay failure and 3 lost", got)
	}
}

func TestStreamRestartClearsPod(t *testing.T) {
	f := newFixture(t)
	s := newStream(f.ix, f.pods, f.cs, "p", nil)
	s.handle(frames("kv@p@m", 100, batch(t, tagged, stored(tagged, nil, 1), stored(tagged, "CPU", 2))))
	s.handle(frames("kv@q@m", 100, batch(t, tagged, stored(tagged, nil, 1))))
	s.handle(frames("kv@p@m", 0, batch(t, tagged, stored(tagged, nil, 3))))
	wantHoldings(t, f, 1, "q/gpu")
	wantHoldings(t, f, 2)
	wantHoldings(t, f, 3, "p/gpu")
	if got := f.stats("p"); got.Restarts != 1 || got.Gaps != 0 {
		t.Errorf("stats %+v, want 1 restart and no gap", got)
	}
}

// TestStreamSequenceNumbersNearTheTop: a sequence number beyond int64 is
// malformed (never observed), a gap wider than any replay buffer is not
// asked for, and repeated huge gaps saturate the lost counter instead of
// wrapping it.
func TestStreamSequenceNumbersNearTheTop(t *testing.T) {
	f := newFixture(t)
	asked := 0
	replay := func(start uint64, visit func(uint64, []byte)) error {
		asked++
		return nil
	}
	s := newStream(f.ix, f.pods, f.cs, "p", replay)
	s.handle(frames("", 0, batch(t, tagged, stored(tagged, nil, 1))))
	s.handle(frames("", 1<<63, batch(t, tagged, stored(tagged, nil, 2)))) // not an int64
	wantHoldings(t, f, 1, "p/gpu")
	wantHoldings(t, f, 2)
	if got := f.stats("p"); got.Malformed != 1 || got.Gaps != 0 {
		t.Errorf("stats %+v, want 1 malformed and no gap", got)
	}
	s.handle(frames("", 1<<63-2, batch(t, tagged, stored(tagged, nil, 3))))
	s.handle(frames("", 0, batch(t, tagged)))                               // a restart
	s.handle(frames("", 1<<63-1, batch(t, tagged, stored(tagged, nil, 4)))) // another huge gap
	s.handle(frames("", 0, batch(t, tagged)))
	s.handle(frames("", 1<<62, batch(t, tagged, stored(tagged, nil, 4)))) // the sum passes 2^64
	if asked != 0 {
		t.Errorf("replay asked %d times for gaps no publisher buffers", asked)
	}
	wantHoldings(t, f, 4, "p/gpu")
	if got := f.stats("p"); got.Lost != math.MaxUint64 || got.Gaps != 3 {
		t.Errorf("stats %+v, want 3 gaps and the lost counter saturated", got)
	}
}
