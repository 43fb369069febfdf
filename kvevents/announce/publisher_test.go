package announce_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/kvevents"
	"kvtier/kvevents/announce"
	"kvtier/router/index"
	"kvtier/router/ingest"
	"kvtier/server"
)

// TestEventsReachTheRouter stores a prompt through the daemon and checks
// that a router subscribed to the daemon's KV events credits the pod with
// the prompt's vLLM blocks in its CPU tier, and forgets them once the
// chunks leave RAM, in both event encodings.
func TestEventsReachTheRouter(t *testing.T) {
	for _, enc := range []kvevents.Encoding{kvevents.Map, kvevents.Array} {
		t.Run(enc.String(), func(t *testing.T) { testEventsReachTheRouter(t, enc) })
	}
}

func testEventsReachTheRouter(t *testing.T, enc kvevents.Encoding) {
	const blockSize = 4 // vLLM blocks of 4 tokens: 4 per 16-token chunk
	eng, err := engine.Open(engine.Options{ChunkSize: pChunkTokens, RAMBytes: 16 << 20, Policy: "LRU"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	pub, err := announce.New(announce.Options{Endpoint: "tcp://127.0.0.1:0", Pod: "pod-a", Model: "m",
		HashSeed: "0", BlockSize: blockSize, ChunkTokens: pChunkTokens, Encoding: enc})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	eng.SetObserver(pub)
	svc := server.NewService(eng, server.ServiceOptions{Events: pub})
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := server.ListenUnix(sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	go svc.Serve(ln)
	defer svc.Shutdown(context.Background())

	ix, _ := index.New(index.Config{MaxBlocks: 1 << 12})
	pods := index.NewPods()
	sub, err := ingest.New(ingest.Config{Endpoints: []ingest.Endpoint{{Pod: "kvtier-node", Address: "tcp://" + pub.Addr()}},
		ReconnectInterval: 20 * time.Millisecond}, ix, pods)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	ctx := context.Background()
	c, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, _ := c.Scope(ctx, pScope)
	tokens := prompt(3*pChunkTokens, 30)
	hasher, _ := chunk.NewVLLMHasher("0", blockSize)
	var want []uint64
	for _, d := range hasher.BlockHashes(nil, tokens, chunk.VLLMRequest{}) {
		want = append(want, chunk.EventHash(d))
	}
	// PUB drops messages sent before the subscription is in: keep storing
	// fresh prompts until the router has seen one, then store the test's.
	deadline := time.Now().Add(10 * time.Second)
	for salt := uint32(100); sub.Stats()["pod-a"].Messages == 0; salt++ {
		if time.Now().After(deadline) {
			t.Fatal("no event reached the router")
		}
		storeLocal(t, c, h, prompt(pChunkTokens, salt), salt)
		time.Sleep(20 * time.Millisecond)
	}
	storeLocal(t, c, h, tokens, 30)
	podA := func() index.PodID { id, _ := pods.ID("pod-a"); return id }
	score := func() float64 {
		s := index.TierWeightedPrefix{Weights: index.DefaultTierWeights()}.Score(ix, want, []index.PodID{podA()}, nil)
		return s[0].Score
	}
	deadline = time.Now().Add(5 * time.Second)
	for math.Abs(score()-12*index.DefaultTierWeights()[index.CPU]) > 1e-9 {
		if time.Now().After(deadline) {
			t.Fatalf("score %v; stats %+v; holders of block 0 %+v", score(), sub.Stats(), ix.Holders(want[0], nil))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if hs := ix.Holders(want[5], nil); len(hs) != 1 || hs[0].Tier != index.CPU {
		t.Errorf("holders of block 5: %+v", hs)
	}
	if _, err := c.Clear(ctx, h); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the router to forget the cleared chunks", func() bool { return score() == 0 })
	if sent, dropped := pub.Stats(); sent == 0 || dropped != 0 {
		t.Errorf("events sent %d, dropped %d", sent, dropped)
	}
	if st := sub.Stats()["pod-a"]; st.Malformed != 0 || st.Gaps != 0 || st.Restarts != 0 {
		t.Errorf("router saw %+v", st)
	}
}
