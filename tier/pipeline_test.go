package tier_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/tier"
	"kvtier/tier/disk"
)

// pipedDisk is the disk tier read through tier.PipelinedRead, as a peer
// is: Send queues a request, Recv reads the oldest one's spans from disk.
// Replies to requests past layer 0 wait for gate; every request is
// logged by chunk as its first and last layer.
type pipedDisk struct {
	*disk.Tier
	gate chan struct{}
	mu   *sync.Mutex
	sent map[chunk.Key][][2]int
	most *int // most requests in flight on one chunk at once
}

func (p pipedDisk) OpenRange(ctx context.Context, k chunk.Key, dst []byte) (tier.RangeRead, error) {
	r, err := p.Tier.OpenRange(ctx, k, dst)
	if err != nil {
		return nil, err
	}
	return &pipedRead{RangeRead: r, p: p, k: k, n: len(dst)}, nil
}

type pipedRead struct {
	tier.RangeRead
	p     pipedDisk
	k     chunk.Key
	n     int
	queue [][]tier.Span
}

func (r *pipedRead) layer(off int) int {
	return off / (r.n / (testGeo.Layers * testGeo.Parts)) % testGeo.Layers
}

func (r *pipedRead) Send(ctx context.Context, spans []tier.Span) error {
	if len(spans) != testGeo.Parts || len(r.queue) == tier.PipelineDepth {
		panic("a request of the wrong shape, or one too many in flight")
	}
	r.queue = append(r.queue, append([]tier.Span(nil), spans...))
	r.p.mu.Lock()
	r.p.sent[r.k] = append(r.p.sent[r.k], [2]int{r.layer(spans[0].From), r.layer(spans[0].To - 1)})
	*r.p.most = max(*r.p.most, len(r.queue))
	r.p.mu.Unlock()
	return nil
}

func (r *pipedRead) Recv(ctx context.Context) error {
	spans := r.queue[0]
	r.queue = r.queue[1:]
	if r.layer(spans[0].From) > 0 {
		select {
		case <-r.p.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, sp := range spans {
		if err := r.RangeRead.ReadRange(ctx, sp.From, sp.To); err != nil {
			return err
		}
	}
	return nil
}

// TestStreamPipelined: a tier whose range reads pipeline gets layer 0 of
// every chunk alone first, and only then, per chunk, a request for every
// part of layers 1 to 3 and — before that one's reply — one for layers 4
// to 6 (the window widened by one request while one is in flight), never
// more than two at once; then layer 7. Every layer holds the stored
// bytes, and the chunks become RAM chunks.
func TestStreamPipelined(t *testing.T) {
	most := 0
	p := pipedDisk{gate: make(chan struct{}), mu: new(sync.Mutex), sent: map[chunk.Key][][2]int{}, most: &most}
	m, _, _, keys, chunks := streamFixture(t, 4, nil, func(d *disk.Tier) tier.Tier {
		p.Tier = d
		return p
	})
	ids := make([]arena.ID, len(keys))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, s, err := m.AcquireStream(ctx, keys, ids, func() tier.LayerGeometry { return testGeo }, time.Now().Add(time.Minute))
	if err != nil || s == nil {
		t.Fatalf("AcquireStream: %v, %v", s, err)
	}
	if usable, ready, err := s.Wait(ctx, 0); err != nil || usable != 4 || ready != 1 {
		t.Fatalf("Wait(0) = %d usable, %d ready, %v", usable, ready, err)
	}
	checkLayer(t, m.RAM().Arena(), ids, chunks, 0)
	// With the replies past layer 0 held, each chunk sends two requests
	// and waits.
	for sent := 0; sent < 3*len(keys); time.Sleep(time.Millisecond) {
		if ctx.Err() != nil {
			t.Fatalf("%d requests sent, want 3 per chunk", sent)
		}
		p.mu.Lock()
		sent = 0
		for _, k := range keys {
			sent += len(p.sent[k])
		}
		p.mu.Unlock()
	}
	close(p.gate)
	if usable, _, err := s.Wait(ctx, testGeo.Layers-1); err != nil || usable != 4 {
		t.Fatalf("Wait = %d usable, %v", usable, err)
	}
	for layer := range testGeo.Layers {
		checkLayer(t, m.RAM().Arena(), ids, chunks, layer)
	}
	p.mu.Lock()
	for c, k := range keys {
		if got, want := p.sent[k], [][2]int{{0, 0}, {1, 3}, {4, 6}, {7, 7}}; len(got) != len(want) || [4][2]int(got) != [4][2]int(want) {
			t.Fatalf("chunk %d: requests for layers %v, want %v", c, got, want)
		}
	}
	p.mu.Unlock()
	if most != tier.PipelineDepth {
		t.Fatalf("at most %d requests in flight on a chunk, want %d", most, tier.PipelineDepth)
	}
	for !s.Done() {
		time.Sleep(time.Millisecond)
	}
	for i, k := range keys {
		if !m.RAM().Contains(k) {
			t.Fatalf("chunk %d not committed", i)
		}
	}
	for _, id := range ids {
		m.RAM().Arena().Unref(id)
	}
}
