package member

import (
	"context"
	"sync"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/engine"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

const testChunkTokens = 16

var testScope = chunk.Scope{Model: "m", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

// rig is a real engine reporting to a real Stream, followed by the
// router's ingest into an index, as the controller does.
type rig struct {
	eng    *engine.Engine
	stream *Stream
	ix     *index.Index
	pods   *index.Pods
	asked  chan string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: testChunkTokens, RAMBytes: 8 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	stream, err := NewStream("tcp://127.0.0.1:0", "d1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stream.Close() })
	eng.SetObserver(stream)
	ix, err := index.New(index.Config{MaxBlocks: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{eng: eng, stream: stream, ix: ix, pods: index.NewPods(), asked: make(chan string, 64)}
	sub, err := ingest.New(ingest.Config{OnResync: func(_, reason string) { r.asked <- reason }}, ix, r.pods)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); sub.Close() })
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ep := ingest.Endpoint{Pod: cluster.HolderPrefix + "d1", Address: "tcp://" + stream.Addr(), Topic: cluster.Topic("d1"), FixedPod: true}
	if err := sub.Add(ep); err != nil {
		t.Fatal(err)
	}
	return r
}

// store puts n one-chunk prompts into the engine and returns their keys.
func (r *rig) store(t *testing.T, from, n int) []chunk.Key {
	t.Helper()
	var keys []chunk.Key
	for i := from; i < from+n; i++ {
		tokens := make([]uint32, testChunkTokens)
		for j := range tokens {
			tokens[j] = uint32(i*100 + j + 1)
		}
		req := engine.Request{Scope: testScope, Tokens: tokens}
		if n, err := r.eng.Store(context.Background(), req, [][]byte{make([]byte, 4096)}); err != nil || n != 1 {
			t.Fatalf("store %d: %d %v", i, n, err)
		}
		ks, _, _, err := r.eng.Keys(nil, req)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ks...)
	}
	return keys
}

// held counts the keys the index credits to d1 in RAM.
func (r *rig) held(keys []chunk.Key) int {
	n := 0
	for _, k := range keys {
		for _, e := range r.ix.Holders(k.Index(), nil) {
			if name, _ := r.pods.Name(e.Pod); name == "daemon:d1" && e.Tier == index.CPU {
				n++
			}
		}
	}
	return n
}

// joined waits until the subscription hears the stream (ZMQ drops what
// a PUB socket sends before a subscriber is connected).
func (r *rig) joined(t *testing.T) {
	t.Helper()
	waitFor(t, "the subscription's first message", func() bool {
		r.stream.Keepalive()
		select {
		case reason := <-r.asked:
			return reason == "first message"
		case <-time.After(20 * time.Millisecond):
			return false
		}
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStreamResyncRebuildsIndex stores chunks before anyone listens, then
// checks a resync brings every one of them into the index, and that live
// events keep applying alongside a resync.
func TestStreamResyncRebuildsIndex(t *testing.T) {
	r := newRig(t)
	before := r.store(t, 0, 50) // published before the subscription joined: lost
	r.joined(t)
	var wg sync.WaitGroup
	wg.Add(1)
	var during []chunk.Key
	go func() {
		defer wg.Done()
		during = r.store(t, 50, 50)
	}()
	if n := r.stream.Resync(r.eng); n < 50 {
		t.Errorf("resync listed %d chunks, want at least 50", n)
	}
	wg.Wait()
	all := append(before, during...)
	waitFor(t, "every chunk in the index", func() bool { return r.held(all) == len(all) })
	if sent, dropped := r.stream.Stats(); dropped != 0 || sent == 0 {
		t.Errorf("stream sent %d, dropped %d", sent, dropped)
	}
}

// TestMemberResyncRequestsAreNotLost starts resyncs faster than they run:
// they are coalesced into passes, the loop ends when none is wanted, and
// the index holds every chunk.
func TestMemberResyncRequestsAreNotLost(t *testing.T) {
	r := newRig(t)
	keys := r.store(t, 0, 20)
	r.joined(t)
	m := New(Options{Register: cluster.Register{Instance: "d1"}, Stream: r.stream, Lister: r.eng})
	for range 5 {
		m.StartResync()
	}
	waitFor(t, "the resyncs to finish", func() bool { return m.wanted.Load() == 0 })
	waitFor(t, "every chunk in the index", func() bool { return r.held(keys) == len(keys) })
}
