package p2p_test

import (
	"context"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/client"
	"kvtier/tier"
	"kvtier/tier/mem"
	"kvtier/tier/p2p"
)

// 8 layers of K and V: a 128 KiB chunk is 16 ranges of 8 KiB.
var streamGeo = tier.LayerGeometry{Layers: 8, Parts: 2}

const streamChunk = 128 << 10

// gatedPeers is the P2P tier with the ranges of layers after the first
// held back until gate is closed.
type gatedPeers struct {
	*p2p.Tier
	gate chan struct{}
}

func (g gatedPeers) OpenRange(ctx context.Context, k chunk.Key, dst []byte) (tier.RangeRead, error) {
	r, err := g.Tier.OpenRange(ctx, k, dst)
	if err != nil {
		return nil, err
	}
	if pr, ok := r.(tier.PipelinedRead); ok {
		return &gatedPipe{PipelinedRead: pr, gate: g.gate}, nil
	}
	return gatedRange{r, g.gate}, nil
}

// gatedPipe holds back the replies to requests for layers after the
// first: those requests are sent, and in flight when the gate opens.
type gatedPipe struct {
	tier.PipelinedRead
	gate   chan struct{}
	layers []int // first layer of each request in flight
}

func (g *gatedPipe) Send(ctx context.Context, spans []tier.Span) error {
	g.layers = append(g.layers, spans[0].From%(streamChunk/2)/(streamChunk/16))
	return g.PipelinedRead.Send(ctx, spans)
}

func (g *gatedPipe) Recv(ctx context.Context) error {
	layer := g.layers[0]
	g.layers = g.layers[1:]
	if layer > 0 {
		<-g.gate
	}
	return g.PipelinedRead.Recv(ctx)
}

type gatedRange struct {
	tier.RangeRead
	gate chan struct{}
}

func (g gatedRange) ReadRange(ctx context.Context, from, to int) error {
	if layer := from % (streamChunk / 2) / (streamChunk / 16); layer > 0 {
		<-g.gate
	}
	return g.RangeRead.ReadRange(ctx, from, to)
}

// TestStreamFromPeerKilledMidStream streams four chunks layer by layer
// from a real daemon: layer 0 of each arrives from the peer, checked;
// the peer is then killed before the later layers are taken (their
// requests are in flight, pipelined), and every chunk
// becomes unusable (a recompute), none is made visible in RAM, and
// nothing stays pinned.
func TestStreamFromPeerKilledMidStream(t *testing.T) {
	d1 := startProc(t, "chunk_size: 16\nmax_local_cpu_size: 0.0625")
	c1 := dial(t, d1.TCP)
	ctx := context.Background()
	keys := keysOf(4)
	for i, k := range keys {
		if n, err := c1.Store(ctx, client.Raw([]chunk.Key{k}), [][]byte{payload(i, streamChunk)}); err != nil || n != 1 {
			t.Fatalf("store chunk %d: %d, %v", i, n, err)
		}
	}
	a, err := arena.New(arena.Options{Capacity: 64 * streamChunk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ram, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	tr := p2p.NewStatic([]string{d1.TCP}, p2p.Options{Token: token, Timeout: 2 * time.Second})
	gate := make(chan struct{})
	m, err := tier.NewManager(ram, []tier.Tier{gatedPeers{tr, gate}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	ids := make([]arena.ID, len(keys))
	n, s, err := m.AcquireStream(ctx, keys, ids, func() tier.LayerGeometry { return streamGeo }, time.Now().Add(time.Minute))
	if err != nil || n != 4 || s == nil || s.Chunks() != 4 {
		t.Fatalf("AcquireStream = %d, %v, %v", n, s, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	usable, ready, err := s.Wait(wctx, 0)
	if err != nil || usable != 4 || ready != 1 {
		t.Fatalf("Wait(0) = %d usable, %d ready, %v; want 4, 1", usable, ready, err)
	}
	for i, id := range ids {
		got, want := a.Bytes(id), payload(i, streamChunk)
		for part := range streamGeo.Parts {
			from, to, _ := streamGeo.Range(streamChunk, 0, part)
			if string(got[from:to]) != string(want[from:to]) {
				t.Fatalf("chunk %d layer 0 part %d: wrong bytes", i, part)
			}
		}
	}

	d1.kill()
	close(gate)
	usable, _, err = s.Wait(wctx, streamGeo.Layers-1)
	if err != nil || usable != 0 {
		t.Fatalf("after the peer died: %d usable, %v; want 0 (recompute)", usable, err)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if ram.Contains(k) {
			t.Fatalf("chunk %d became visible in RAM from a dead peer", i)
		}
	}
	for _, id := range ids {
		a.Unref(id)
	}
	if p := a.Pinned(); p != 0 {
		t.Fatalf("%d bytes pinned after the stream", p)
	}
}

// TestStreamFromPeer streams chunks from a real daemon layer by layer
// through the manager: every layer holds the stored bytes once Wait says
// so, and the chunks become this daemon's RAM chunks.
func TestStreamFromPeer(t *testing.T) {
	streamFromPeer(t, "", 3, p2p.Options{})
}

// TestStreamFromPeerPastRangedConns streams more chunks than RangedConns
// from a peer that serves few connections: the chunks past the bound are
// read whole, a few at a time, so the peer refuses none and every chunk
// arrives. Unbounded, the stream would ask for ten connections at once and
// the peer, serving eight, would refuse some of them.
func TestStreamFromPeerPastRangedConns(t *testing.T) {
	streamFromPeer(t, "\nmax_connections: 8", 10, p2p.Options{Conns: 2, RangedConns: 2})
}

// streamFromPeer stores n chunks on a daemon started with peerConf and
// streams them through a manager over a P2P tier with options o: every
// layer holds the stored bytes once Wait says so, all n stay usable, and
// the chunks become RAM chunks.
func streamFromPeer(t *testing.T, peerConf string, n int, o p2p.Options) {
	d1 := startProc(t, "chunk_size: 16\nmax_local_cpu_size: 0.0625"+peerConf)
	c1 := dial(t, d1.TCP)
	ctx := context.Background()
	keys := keysOf(n)
	for i, k := range keys {
		if got, err := c1.Store(ctx, client.Raw([]chunk.Key{k}), [][]byte{payload(i, streamChunk)}); err != nil || got != 1 {
			t.Fatalf("store chunk %d: %d, %v", i, got, err)
		}
	}
	a, err := arena.New(arena.Options{Capacity: 64 * streamChunk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ram, err := mem.New(a, "LRU")
	if err != nil {
		t.Fatal(err)
	}
	o.Token, o.Timeout = token, 2*time.Second
	tr := p2p.NewStatic([]string{d1.TCP}, o)
	m, err := tier.NewManager(ram, []tier.Tier{tr}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := make([]arena.ID, len(keys))
	got, s, err := m.AcquireStream(ctx, keys, ids, func() tier.LayerGeometry { return streamGeo }, time.Now().Add(time.Minute))
	if err != nil || got != n || s == nil {
		t.Fatalf("AcquireStream = %d, %v, %v", got, s, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for layer := range streamGeo.Layers {
		usable, ready, err := s.Wait(wctx, layer)
		if err != nil || usable != n || ready <= layer {
			t.Fatalf("Wait(%d) = %d, %d, %v", layer, usable, ready, err)
		}
		for i, id := range ids {
			got, want := a.Bytes(id), payload(i, streamChunk)
			for part := range streamGeo.Parts {
				from, to, _ := streamGeo.Range(streamChunk, layer, part)
				if string(got[from:to]) != string(want[from:to]) {
					t.Fatalf("chunk %d layer %d part %d: wrong bytes", i, layer, part)
				}
			}
		}
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if !ram.Contains(k) {
			t.Fatalf("chunk %d not in RAM after its stream", i)
		}
	}
	if st := tr.Stats(); st.Hits != uint64(n) || st.BytesRead != uint64(n*streamChunk) {
		t.Fatalf("p2p stats %+v", st)
	}
	for _, id := range ids {
		a.Unref(id)
	}
}
