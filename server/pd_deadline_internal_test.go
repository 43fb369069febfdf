package server

import (
	"fmt"
	"testing"
	"time"

	"kvtier/wire"
)

// TestBudgetDeadlineFollowsTheTransfer: every RECEIVE batch of a transfer
// waits for budget only until the transfer's time is up, counted from its
// first batch on the connection, not a full hold from each batch; another
// transfer on the connection starts its own clock.
func TestBudgetDeadlineFollowsTheTransfer(t *testing.T) {
	var sc pdScratch
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ttl := time.Minute
	if got := sc.budgetDeadline(5, ttl, t0); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("first batch: %v", got)
	}
	if got := sc.budgetDeadline(5, ttl, t0.Add(50*time.Second)); !got.Equal(t0.Add(ttl)) {
		t.Fatalf("a later batch of the transfer waits until %v, want %v", got, t0.Add(ttl))
	}
	t1 := t0.Add(70 * time.Second)
	if got := sc.budgetDeadline(6, ttl, t1); !got.Equal(t1.Add(ttl)) {
		t.Fatalf("the next transfer on the connection: %v", got)
	}
}

// TestBudgetDeadlineOfAReusedID: a RECEIVE of the connection's last
// transfer id after that transfer's deadline is a new transfer reusing
// the id: its own clock, and not admitted past the budget's queue.
func TestBudgetDeadlineOfAReusedID(t *testing.T) {
	var sc pdScratch
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ttl := time.Minute
	sc.budgetDeadline(5, ttl, t0)
	sc.recvAdmitted = true // it took budget
	t1 := t0.Add(ttl + time.Second)
	if got := sc.budgetDeadline(5, ttl, t1); !got.Equal(t1.Add(ttl)) || sc.recvAdmitted {
		t.Fatalf("id 5 reused past its deadline: waits until %v (want %v), admitted %v", got, t1.Add(ttl), sc.recvAdmitted)
	}
}

// TestPooledConnNotReusedForTheSameID: the producer does not send a
// transfer over a pooled connection whose last transfer had its id; it
// takes another, or dials.
func TestPooledConnNotReusedForTheSameID(t *testing.T) {
	p := newPD(nil, 1<<20, "", nil, nil)
	const dest = "127.0.0.1:1"
	p.conns[dest] = []pushConn{{lastID: 7, budget: 1}, {lastID: 5, budget: 2}}
	c, pooled, err := p.conn(&transfer{id: 5, dest: dest})
	if err != nil || !pooled || c.budget != 1 || len(p.conns[dest]) != 1 || p.conns[dest][0].lastID != 5 {
		t.Fatalf("transfer 5 got %+v (pooled %v, %v); left %+v", c, pooled, err, p.conns[dest])
	}
}

// TestNoLayersIsBounded: destinations found without RECEIVE_LAYERS are
// forgotten once their answer is past its time, and never more than
// maxNoLayers are kept.
func TestNoLayersIsBounded(t *testing.T) {
	p := newPD(nil, 1<<20, "", nil, nil)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 * maxNoLayers {
		p.noteNoLayers(fmt.Sprintf("10.0.%d.%d:7000", i/256, i%256), t0)
	}
	if n := p.noLayersLen(); n != maxNoLayers {
		t.Fatalf("%d destinations remembered, bound %d", n, maxNoLayers)
	}
	p.sweep(t0.Add(layerProbeTTL / 2))
	if n := p.noLayersLen(); n != maxNoLayers {
		t.Fatalf("%d destinations remembered before their time is up", n)
	}
	p.sweep(t0.Add(layerProbeTTL))
	if n := p.noLayersLen(); n != 0 {
		t.Fatalf("%d destinations remembered past their time", n)
	}
}

// TestLayerScratchShrinks: a session's RECEIVE_LAYERS scratch does not
// keep the tables of an oversized request; a usual one is kept.
func TestLayerScratchShrinks(t *testing.T) {
	var s session
	s.pdl.reset(64)
	s.pdl.msg.Ranges = make([]wire.ByteRange, 0, 64*2*32)
	s.endLayers()
	if cap(s.pdl.chunks) < 64 || cap(s.pdl.msg.Ranges) == 0 {
		t.Fatalf("a usual request's scratch was dropped: %d chunks, %d ranges", cap(s.pdl.chunks), cap(s.pdl.msg.Ranges))
	}
	s.pdl.reset(300000) // what an 8 MiB body of keys and sizes can name
	s.pdl.msg.Ranges = make([]wire.ByteRange, 0, wire.MaxRanges)
	s.endLayers()
	if cap(s.pdl.chunks) > maxLayerScratch || cap(s.pdl.msg.Ranges) > maxRangeScratch {
		t.Fatalf("kept %d chunks and %d ranges of scratch", cap(s.pdl.chunks), cap(s.pdl.msg.Ranges))
	}
}
