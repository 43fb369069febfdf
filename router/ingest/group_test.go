package ingest

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/internal/redistest"
	"kvtier/router/index"
	"kvtier/router/redisindex"
)

// noGroup asks storedIn for an event without group_idx, as vLLM wrote
// before hybrid-model events.
const noGroup = -1 << 31

// storedIn is a BlockStored event of KV-cache group g.
func storedIn(enc encoding, g int, hashes ...uint64) any {
	if enc == tagged {
		e := []any{"BlockStored", hashes, nil, []uint32{}, 4, nil, nil}
		if g != noGroup {
			e = append(e, nil, nil, g, "full_attention")
		}
		return e
	}
	m := omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", nil},
		{"token_ids", []uint32{}}, {"block_size", 4}, {"lora_id", nil}, {"medium", nil}, {"lora_name", nil}}
	if g != noGroup {
		m = append(m, field{"group_idx", g}, field{"kv_cache_spec_kind", "full_attention"})
	}
	return m
}

func removedIn(enc encoding, g int, hashes ...uint64) any {
	if enc == tagged {
		return []any{"BlockRemoved", hashes, nil, g}
	}
	return omap{{"type", "BlockRemoved"}, {"block_hashes", hashes}, {"medium", nil}, {"group_idx", g}}
}

// TestGroupsScoreSeparately: pods holding the same block hashes in
// different KV-cache groups of a hybrid model never count towards each
// other's score; events without a group_idx are group 0. It runs over the
// in-memory index and, when a Redis server is available, the Redis one.
func TestGroupsScoreSeparately(t *testing.T) {
	stores := map[string]func(t *testing.T, pods *index.Pods) index.Store{
		"memory": func(t *testing.T, _ *index.Pods) index.Store {
			ix, err := index.New(index.Config{MaxBlocks: 1 << 12})
			if err != nil {
				t.Fatal(err)
			}
			return ix
		},
		"redis": func(t *testing.T, pods *index.Pods) index.Store {
			srv := redistest.Start(t)
			rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
			t.Cleanup(func() { rdb.Close() })
			ix, err := redisindex.New(redisindex.Config{Client: rdb, Prefix: "group-test:"}, pods)
			if err != nil {
				t.Fatal(err)
			}
			return ix
		},
	}
	for name, open := range stores {
		for _, enc := range encodings {
			t.Run(name+"/"+enc.String(), func(t *testing.T) {
				pods := index.NewPods()
				ix := open(t, pods)
				s := newStream(ix, pods, new(counterSet), "fallback", nil)
				hashes := []uint64{11, 12, 13}
				s.handle(frames("kv@pod-a@m", 0, batch(t, enc, storedIn(enc, 0, hashes...))))
				s.handle(frames("kv@pod-b@m", 0, batch(t, enc, storedIn(enc, 1, hashes...))))
				s.handle(frames("kv@pod-c@m", 0, batch(t, enc, storedIn(enc, noGroup, hashes...))))
				s.handle(frames("kv@pod-d@m", 0, batch(t, enc, storedIn(enc, -7, hashes...))))

				if st := s.counters.get("pod-d").snapshot(); st.Skipped != 1 {
					t.Errorf("an event of group -7 was not skipped: %+v", st)
				}

				score := func(g int) map[string]float64 {
					keys := append([]uint64(nil), hashes...)
					index.GroupKeys(keys, g)
					out := map[string]float64{}
					for _, ps := range (index.LongestPrefix{}).Score(ix, keys, nil, nil) {
						name, _ := pods.Name(ps.Pod)
						out[name] = ps.Score
					}
					return out
				}
				wantScores(t, "group 0", score(0), map[string]float64{"pod-a": 3, "pod-c": 3})
				wantScores(t, "group 1", score(1), map[string]float64{"pod-b": 3})
				wantScores(t, "group 2", score(2), map[string]float64{})

				// A removal in group 1 leaves group 0's holdings alone.
				s.handle(frames("kv@pod-b@m", 1, batch(t, enc, removedIn(enc, 1, 11))))
				s.handle(frames("kv@pod-a@m", 1, batch(t, enc, removedIn(enc, 1, 12))))
				wantScores(t, "group 0 after removals", score(0), map[string]float64{"pod-a": 3, "pod-c": 3})
				wantScores(t, "group 1 after removals", score(1), map[string]float64{})
			})
		}
	}
}

func wantScores(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: scores %v, want %v", what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: scores %v, want %v", what, got, want)
			return
		}
	}
}

func TestGroupKeys(t *testing.T) {
	if index.GroupKey(42, 0) != 42 {
		t.Error("group 0 must key blocks by their hash")
	}
	seen := map[uint64]int{}
	for g := 0; g < 1000; g++ {
		k := index.GroupKey(42, g)
		if prev, dup := seen[k]; dup {
			t.Fatalf("groups %d and %d share key %#x", prev, g, k)
		}
		seen[k] = g
	}
	hs := []uint64{1, 2}
	index.GroupKeys(hs, 3)
	if hs[0] != index.GroupKey(1, 3) || hs[1] != index.GroupKey(2, 3) {
		t.Errorf("GroupKeys = %v", hs)
	}
	for g, ok := range map[int]bool{-1: false, 0: true, index.MaxGroup: true, index.MaxGroup + 1: false} {
		if index.ValidGroup(g) != ok {
			t.Errorf("ValidGroup(%d) = %v", g, !ok)
		}
	}
}
