package p2p_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"kvtier/engine"
	"kvtier/tier"
	"kvtier/tier/p2p"
	"kvtier/tier/remote"
)

// silentPeers are listeners that accept connections and answer nothing
// until all of them hold one: only a lookup that asks every peer at once
// gets past them before its deadline. Then they close everything.
type silentPeers struct {
	lns      []net.Listener
	mu       sync.Mutex
	accepted map[int]bool
	conns    []net.Conn
	released chan struct{}
}

func startSilentPeers(t *testing.T, n int) *silentPeers {
	t.Helper()
	s := &silentPeers{accepted: map[int]bool{}, released: make(chan struct{})}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.lns = append(s.lns, ln)
	}
	for i, ln := range s.lns {
		go s.accept(i, ln)
	}
	t.Cleanup(func() {
		for _, ln := range s.lns {
			ln.Close()
		}
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	return s
}

func (s *silentPeers) accept(i int, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.accepted[i] = true
		if len(s.accepted) == len(s.lns) {
			select {
			case <-s.released:
			default:
				close(s.released)
				for _, c := range s.conns {
					c.Close()
				}
			}
		}
		select {
		case <-s.released:
			c.Close()
		default:
		}
		s.mu.Unlock()
	}
}

func (s *silentPeers) addrs() []string {
	var out []string
	for _, ln := range s.lns {
		out = append(out, ln.Addr().String())
	}
	return out
}

// TestStaticLookupAsksPeersAtOnce: with two peers that answer nothing
// until both are asked, a lookup still finds the chunks the third peer
// holds, within the one deadline; peers asked one after another would
// wait out the first silent peer's deadline (here longer than the test
// waits).
func TestStaticLookupAsksPeersAtOnce(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	store(t, d1, 4, 1000)
	silent := startSilentPeers(t, 2)
	pt := p2p.NewStatic(append(silent.addrs(), d1.addr), p2p.Options{Token: token, Timeout: 2 * hangBound})
	defer pt.Close()
	got := make(chan int, 1)
	go func() { got <- pt.PrefixContains(keysOf(6)) }()
	select {
	case n := <-got:
		if n != 4 {
			t.Fatalf("PrefixContains = %d, want the 4 chunks the third peer holds", n)
		}
	case <-time.After(hangBound):
		t.Fatalf("the lookup still waits after %v: the silent peers were not asked at once", hangBound)
	}
	select {
	case <-silent.released:
	default:
		t.Fatal("the lookup returned without asking both silent peers")
	}
}

// hangBound is how long a test waits for something that, done right,
// takes milliseconds.
const hangBound = 15 * time.Second

// TestCorruptingPeerOpensItsCircuit: a peer whose chunks keep failing
// their checksums is cut off like a failing one, while each read is a
// miss, never wrong bytes; its pings, which it answers, do not close the
// circuit again before the corruption back-off has passed.
func TestCorruptingPeerOpensItsCircuit(t *testing.T) {
	d1 := startDaemon(t, "127.0.0.1:0", engine.Options{})
	store(t, d1, 6, 1<<20)
	r := startRelay(t, d1.addr)
	pt := p2p.NewStatic([]string{r.addr()}, p2p.Options{Token: token, Timeout: time.Second, Threshold: 3})
	defer pt.Close()
	ctx := context.Background()
	dst := make([]byte, 1<<20)

	// One damaged read among good ones leaves the circuit closed.
	r.corrupt.Store(true)
	if _, err := pt.Get(ctx, key(0), dst); !errors.Is(err, tier.ErrCorrupt) {
		t.Fatalf("damaged read: %v, want ErrCorrupt", err)
	}
	r.corrupt.Store(false)
	if n, err := pt.Get(ctx, key(1), dst); err != nil || n != len(dst) {
		t.Fatalf("good read: %d, %v %+v", n, err, pt.Health())
	}
	if h := pt.Health()[r.addr()]; h.Opens != 0 {
		t.Fatalf("one damaged read opened the circuit: %+v", h)
	}

	// Three in a row (the threshold) open it.
	r.corrupt.Store(true)
	for i := 2; i < 5; i++ {
		if _, err := pt.Get(ctx, key(i), dst); !errors.Is(err, tier.ErrCorrupt) {
			t.Fatalf("damaged read %d: %v, want ErrCorrupt", i, err)
		}
	}
	if h := pt.Health()[r.addr()]; h.Opens != 1 {
		t.Fatalf("three damaged reads in a row: %+v, want the circuit opened once", h)
	}
	if c := pt.Stats().Corrupt; c != 4 {
		t.Fatalf("corrupt count %d, want 4", c)
	}
	if h := pt.Health()[r.addr()]; h.Corrupt != 4 || h.CorruptOpens != 1 || h.Failures != 0 {
		t.Fatalf("breaker: %+v, want 4 corrupt reads, opened for them, no failure", h)
	}

	// The peer answers its pings, but the probes that would close the
	// circuit on them are held for the corruption back-off (30 s).
	deadline := time.Now().Add(hangBound)
	for pt.Health()[r.addr()].ProbesHeld < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no probe ran: %+v", pt.Health()[r.addr()])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h := pt.Health()[r.addr()]; h.State != remote.StateOpen || h.ProbeOK != 0 {
		t.Fatalf("a corrupting peer was probed within its back-off: %+v", h)
	}
}
