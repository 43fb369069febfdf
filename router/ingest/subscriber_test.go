package ingest

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvtier/router/index"
)

// hang bounds every wait in these tests. It is a hang detector, not a
// performance expectation: on success the waits end as soon as the
// condition holds.
const hang = 5 * time.Second

// waitFor polls cond until it holds, failing the test after hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hang)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// publisher is a vLLM-like ZmqEventPublisher on a real zmq4 PUB socket. It
// keeps every message it numbered, published or not, for replay.
type publisher struct {
	t     *testing.T
	pub   zmq4.Socket
	addr  string
	topic string

	mu     sync.Mutex
	seq    uint64
	buffer []bufferedMsg
}

type bufferedMsg struct {
	seq     uint64
	payload []byte
}

// newPublisher binds a PUB socket on addr ("tcp://127.0.0.1:0" for a free
// port) and numbers its messages from firstSeq.
func newPublisher(t *testing.T, addr, topic string, firstSeq uint64) *publisher {
	t.Helper()
	pub := zmq4.NewPub(context.Background())
	var err error
	deadline := time.Now().Add(hang)
	for {
		// Rebinding the port of a publisher just closed can briefly fail.
		if err = pub.Listen(addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	p := &publisher{t: t, pub: pub, addr: "tcp://" + pub.Addr().String(), topic: topic, seq: firstSeq}
	t.Cleanup(func() { p.pub.Close() })
	return p
}

// next numbers payload and keeps it for replay.
func (p *publisher) next(payload []byte) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	p.buffer = append(p.buffer, bufferedMsg{seq, payload})
	return seq
}

func (p *publisher) send(payload []byte) {
	p.t.Helper()
	seq := p.next(payload)
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.topic), seqFrame(seq), payload)); err != nil {
		p.t.Fatalf("publishing seq %d: %v", seq, err)
	}
}

// lose numbers payload without publishing it, as if the network dropped it.
func (p *publisher) lose(payload []byte) { p.next(payload) }

// warmUp publishes empty batches until cond holds: a SUB socket receives
// nothing published before its subscription reached the publisher (ZMQ's
// "slow joiner"), so the first messages of a test must be expendable.
func (p *publisher) warmUp(enc encoding, what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(hang)
	empty := batch(p.t, enc)
	for !cond() {
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out warming up until %s", what)
		}
		p.send(empty)
		time.Sleep(5 * time.Millisecond)
	}
}

// serveReplay answers vLLM's replay protocol on a ROUTER socket from the
// publisher's buffer: a request (identity, "", start) is answered with
// (identity, "", seq, payload) for every buffered seq ≥ start, then
// (identity, "", -1, ""). withTopic selects newer vLLM's form, which puts
// the topic before seq (an empty one in the end marker).
func (p *publisher) serveReplay(t *testing.T, withTopic bool) (addr string, requests func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	router := zmq4.NewRouter(ctx)
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			req, err := router.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if len(req.Frames) != 3 || len(req.Frames[1]) != 0 || len(req.Frames[2]) != 8 {
				t.Errorf("replay request frames %q, want (identity, empty, 8-byte seq)", req.Frames)
				continue
			}
			mu.Lock()
			n++
			mu.Unlock()
			id := req.Frames[0]
			start := seqOf(req.Frames[2])
			p.mu.Lock()
			buf := append([]bufferedMsg(nil), p.buffer...)
			p.mu.Unlock()
			reply := func(topic []byte, seq uint64, payload []byte) {
				frames := [][]byte{id, nil, seqFrame(seq), payload}
				if withTopic {
					frames = [][]byte{id, nil, topic, seqFrame(seq), payload}
				}
				_ = router.SendMulti(zmq4.NewMsgFrom(frames...))
			}
			for _, m := range buf {
				if m.seq >= start {
					reply([]byte(p.topic), m.seq, m.payload)
				}
			}
			reply(nil, ^uint64(0), nil)
		}
	}()
	t.Cleanup(func() {
		cancel()
		router.Close()
		<-done
	})
	return "tcp://" + router.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

func seqOf(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// startSubscriber starts a Subscriber on one endpoint and registers a check
// that Close leaves no goroutine behind.
func startSubscriber(t *testing.T, f fixture, ep Endpoint) *Subscriber {
	t.Helper()
	return startSubscriberConfig(t, f, Config{Endpoints: []Endpoint{ep}})
}

func startSubscriberConfig(t *testing.T, f fixture, cfg Config) *Subscriber {
	t.Helper()
	before := runtime.NumGoroutine()
	cfg.ReconnectInterval = 20 * time.Millisecond
	s, err := New(cfg, f.ix, f.pods)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		// Sockets wind down asynchronously after Close; allow a little
		// slack for the test's own publisher goroutines still exiting.
		waitFor(t, "goroutines to exit after Close", func() bool {
			return runtime.NumGoroutine() <= before+2
		})
	})
	return s
}

func (f fixture) heldBy(h uint64, want string) func() bool {
	return func() bool { return strings.Join(f.holdings(h), ",") == want }
}

func TestSubscriberAppliesLiveEvents(t *testing.T) {
	for _, enc := range encodings {
		t.Run(enc.String(), func(t *testing.T) {
			f := newFixture(t)
			p := newPublisher(t, "tcp://127.0.0.1:0", "kv@pod-a@org/model", 0)
			s := startSubscriber(t, f, Endpoint{Pod: "configured", Address: p.addr, Topic: "kv@"})
			// The subscriber has its subscription in once a message arrives.
			p.warmUp(enc, "a message arrives", func() bool { return s.Stats()["pod-a"].Messages > 0 })

			p.send(batch(t, enc, stored(enc, nil, 1, 2), stored(enc, "CPU", 2, 3)))
			waitFor(t, "stored blocks", f.heldBy(3, "pod-a/cpu"))
			wantHoldings(t, f, 1, "pod-a/gpu")
			wantHoldings(t, f, 2, "pod-a/cpu", "pod-a/gpu")

			p.send(batch(t, enc, removed(enc, nil, 1, 2)))
			waitFor(t, "removed blocks", f.heldBy(2, "pod-a/cpu"))
			wantHoldings(t, f, 1)

			p.send(batch(t, enc, cleared(enc)))
			waitFor(t, "cleared pod", f.heldBy(3, ""))

			// A malformed message is a lost one (it might have removed
			// blocks): when the next message shows the gap, the pod's
			// entries are dropped and rebuilt from what follows.
			p.send(batch(t, enc, stored(enc, nil, 4)))
			waitFor(t, "block 4", f.heldBy(4, "pod-a/gpu"))
			p.send([]byte{0xc1}) // never valid msgpack
			p.send(batch(t, enc, stored(enc, nil, 5)))
			waitFor(t, "block 5", f.heldBy(5, "pod-a/gpu"))
			wantHoldings(t, f, 4)

			st := s.Stats()["pod-a"]
			if st.Malformed != 1 || st.Lost != 1 || st.BlocksAdded != 6 || st.BlocksRemoved != 2 || st.Clears != 1 {
				t.Errorf("stats %+v, want 1 malformed, 1 lost, 6 added, 2 removed, 1 clear", st)
			}
			if _, ok := s.Stats()["configured"]; !ok {
				t.Error("configured pod missing from Stats")
			}
		})
	}
}

func TestSubscriberReplaysGap(t *testing.T) {
	for _, withTopic := range []bool{false, true} {
		name := map[bool]string{false: "seq-payload", true: "topic-seq-payload"}[withTopic]
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			p := newPublisher(t, "tcp://127.0.0.1:0", "kv@pod-r@m", 0)
			replayAddr, requests := p.serveReplay(t, withTopic)
			s := startSubscriber(t, f, Endpoint{Pod: "pod-r", Address: p.addr, Replay: replayAddr})
			p.warmUp(mapped, "a message arrives", func() bool { return s.Stats()["pod-r"].Messages > 0 })

			p.lose(batch(t, mapped, stored(mapped, nil, 10)))
			p.lose(batch(t, tagged, stored(tagged, "DISK", 11)))
			p.send(batch(t, mapped, stored(mapped, nil, 12)))
			waitFor(t, "the live block after the gap", f.heldBy(12, "pod-r/gpu"))
			wantHoldings(t, f, 10, "pod-r/gpu")
			wantHoldings(t, f, 11, "pod-r/disk")

			st := s.Stats()["pod-r"]
			if st.Gaps != 1 || st.Replays != 1 || st.ReplayFailures != 0 || st.Lost != 0 {
				t.Errorf("stats %+v, want 1 gap, 1 replay, no failure or loss", st)
			}
			if n := requests(); n != 1 {
				t.Errorf("%d replay requests, want 1", n)
			}
		})
	}
}

func TestSubscriberSurvivesPublisherRestart(t *testing.T) {
	f := newFixture(t)
	// The first run's numbers start high, so that whatever the second run
	// publishes before the subscriber reconnects, its numbers go back.
	p1 := newPublisher(t, "tcp://127.0.0.1:0", "kv@pod-x@m", 1_000_000)
	addr := p1.addr
	s := startSubscriber(t, f, Endpoint{Pod: "pod-x", Address: addr})
	p1.warmUp(tagged, "a message arrives", func() bool { return s.Stats()["pod-x"].Messages > 0 })
	p1.send(batch(t, tagged, stored(tagged, nil, 1)))
	waitFor(t, "block of the first run", f.heldBy(1, "pod-x/gpu"))
	p1.pub.Close()

	p2 := newPublisher(t, addr, "kv@pod-x@m", 0)
	p2.warmUp(tagged, "the restart is seen", func() bool { return s.Stats()["pod-x"].Restarts > 0 })
	wantHoldings(t, f, 1) // the restarted engine's cache is empty
	p2.send(batch(t, tagged, stored(tagged, nil, 2)))
	waitFor(t, "block of the second run", f.heldBy(2, "pod-x/gpu"))
}

func TestSubscriberReplayTimeoutCountsLoss(t *testing.T) {
	f := newFixture(t)
	p := newPublisher(t, "tcp://127.0.0.1:0", "kv@pod-t@m", 0)
	// Nothing answers on the replay address: the request runs into its
	// timeout, and the live stream goes on.
	s := startSubscriberConfig(t, f, Config{
		Endpoints:     []Endpoint{{Pod: "pod-t", Address: p.addr, Replay: "tcp://127.0.0.1:1"}},
		ReplayTimeout: 100 * time.Millisecond,
	})
	p.warmUp(tagged, "a message arrives", func() bool { return s.Stats()["pod-t"].Messages > 0 })
	p.lose(batch(t, tagged, stored(tagged, nil, 1)))
	p.send(batch(t, tagged, stored(tagged, nil, 2)))
	waitFor(t, "the live block after the failed replay", f.heldBy(2, "pod-t/gpu"))
	wantHoldings(t, f, 1)
	if st := s.Stats()["pod-t"]; st.ReplayFailures != 1 || st.Lost != 1 || st.Replays != 0 {
		t.Errorf("stats %+v, want 1 replay failure, 1 lost, no replay", st)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	f := newFixture(t)
	if _, err := New(Config{}, f.ix, f.pods); err != nil {
		t.Errorf("no endpoints (a controller that only follows registered daemons): %v", err)
	}
	for _, cfg := range []Config{
		{Endpoints: []Endpoint{{Address: "tcp://127.0.0.1:1"}}},
		{Endpoints: []Endpoint{{Pod: "p"}}},
		{Endpoints: []Endpoint{{Pod: "p", Address: "tcp://127.0.0.1:1"}}, ReplayTimeout: -1},
	} {
		if _, err := New(cfg, f.ix, f.pods); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	if _, err := New(Config{Endpoints: []Endpoint{{Pod: "p", Address: "tcp://x:1"}}}, nil, f.pods); err == nil {
		t.Error("New with a nil index succeeded")
	}
}

func TestCloseWithoutPublisher(t *testing.T) {
	f := newFixture(t)
	// Nothing listens: the subscriber keeps dialing until closed.
	s := startSubscriber(t, f, Endpoint{Pod: "p", Address: "tcp://127.0.0.1:1"})
	if err := s.Start(context.Background()); err == nil {
		t.Error("second Start succeeded")
	}
}

// TestSubscriberUpdate adds a pod while running, then removes one: the
// removed pod's entries leave the index and its name the registry, and the
// remaining pod keeps being followed.
func TestSubscriberUpdate(t *testing.T) {
	enc := encodings[0]
	f := newFixture(t)
	pa := newPublisher(t, "tcp://127.0.0.1:0", "kv@pod-a@m", 0)
	s := startSubscriber(t, f, Endpoint{Pod: "pod-a", Address: pa.addr, Topic: "kv@"})
	pa.warmUp(enc, "pod-a's first message", func() bool { return s.Stats()["pod-a"].Messages > 0 })
	pa.send(batch(t, enc, stored(enc, nil, 1)))
	waitFor(t, "pod-a's block", f.heldBy(1, "pod-a/gpu"))

	pb := newPublisher(t, "tcp://127.0.0.1:0", "kv@pod-b@m", 0)
	eps := []Endpoint{{Pod: "pod-a", Address: pa.addr, Topic: "kv@"}, {Pod: "pod-b", Address: pb.addr, Topic: "kv@", Model: "m"}}
	if err := s.Update(eps); err != nil {
		t.Fatal(err)
	}
	pb.warmUp(enc, "pod-b's first message", func() bool { return s.Stats()["pod-b"].Messages > 0 })
	pb.send(batch(t, enc, stored(enc, nil, 2)))
	waitFor(t, "pod-b's block", f.heldBy(2, "pod-b/gpu"))
	wantHoldings(t, f, 1, "pod-a/gpu") // untouched by the update

	if err := s.Update(eps[1:]); err != nil {
		t.Fatal(err)
	}
	wantHoldings(t, f, 1)
	if _, ok := f.pods.ID("pod-a"); ok {
		t.Error("a removed pod is still registered")
	}
	if len(s.Endpoints()) != 1 {
		t.Errorf("endpoints %v", s.Endpoints())
	}
	pb.send(batch(t, enc, stored(enc, nil, 3)))
	waitFor(t, "pod-b followed after the update", f.heldBy(3, "pod-b/gpu"))

	if err := s.Update([]Endpoint{{Pod: "", Address: pb.addr}}); err == nil {
		t.Error("an invalid update was accepted")
	}
	if err := s.Update([]Endpoint{eps[1], eps[1]}); err == nil {
		t.Error("a pod listed twice was accepted")
	}
}

// TestSubscriberAddRemoveAndResync follows a pod added on its own (a
// registered daemon): Update leaves it alone, its first message and a loss
// ask for a resync, and Remove drops its entries and name.
func TestSubscriberAddRemoveAndResync(t *testing.T) {
	enc := encodings[0]
	f := newFixture(t)
	var mu sync.Mutex
	var reasons []string
	s := startSubscriberConfig(t, f, Config{OnResync: func(pod, reason string) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, pod+": "+reason)
	}})
	asked := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), reasons...)
	}
	p := newPublisher(t, "tcp://127.0.0.1:0", "kvtier@d1@chunks", 0)
	ep := Endpoint{Pod: "daemon:d1", Address: p.addr, Topic: "kvtier@d1@chunks", FixedPod: true}
	if err := s.Add(ep); err != nil {
		t.Fatal(err)
	}
	p.warmUp(enc, "the first message", func() bool { return s.Stats()["daemon:d1"].Messages > 0 })
	if got := asked(); len(got) != 1 || got[0] != "daemon:d1: first message" {
		t.Fatalf("resyncs asked %q, want one for the first message", got)
	}
	p.send(batch(t, enc, stored(enc, "CPU", 7)))
	waitFor(t, "the daemon's chunk", f.heldBy(7, "daemon:d1/cpu"))

	// Update manages the configured pods only.
	if err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	wantHoldings(t, f, 7, "daemon:d1/cpu")
	if err := s.Update([]Endpoint{ep}); err == nil {
		t.Error("Update took over an added pod")
	}

	// A lost message (no replay) drops the pod's entries and asks again.
	p.lose(batch(t, enc, removed(enc, "CPU", 7)))
	p.send(batch(t, enc, stored(enc, "DISK", 8)))
	waitFor(t, "the loss to be seen", func() bool { return len(asked()) == 2 })
	if got := asked()[1]; got != "daemon:d1: messages lost" {
		t.Errorf("second resync asked for %q", got)
	}
	waitFor(t, "the new chunk", f.heldBy(8, "daemon:d1/disk"))
	wantHoldings(t, f, 7)

	if !s.Remove("daemon:d1") {
		t.Fatal("Remove did not find the pod")
	}
	wantHoldings(t, f, 8)
	if _, ok := f.pods.ID("daemon:d1"); ok {
		t.Error("a removed pod is still registered")
	}
	if s.Remove("daemon:d1") {
		t.Error("a second Remove found the pod")
	}
}

// A Shared stream owns its pod in an index other replicas write too: a
// clear drops entries it never wrote, and stopping it leaves them.
func TestSubscriberSharedPod(t *testing.T) {
	enc := encodings[0]
	f := newFixture(t)
	s := startSubscriberConfig(t, f, Config{})
	// Another replica (or an earlier process) wrote d1's disk tier.
	id, err := f.pods.Intern("daemon:d1")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.ix.Add(id, index.Disk, []uint64{5}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, "tcp://127.0.0.1:0", "kvtier@d1@chunks", 0)
	ep := Endpoint{Pod: "daemon:d1", Address: p.addr, Topic: "kvtier@d1@chunks", FixedPod: true, Shared: true}
	if err := s.Add(ep); err != nil {
		t.Fatal(err)
	}
	p.warmUp(enc, "the first message", func() bool { return s.Stats()["daemon:d1"].Messages > 0 })
	wantHoldings(t, f, 5, "daemon:d1/disk") // joining clears nothing
	p.send(batch(t, enc, cleared(enc), stored(enc, "CPU", 7)))
	waitFor(t, "the daemon's chunk", f.heldBy(7, "daemon:d1/cpu"))
	wantHoldings(t, f, 5) // the clear took the tier this stream never wrote

	if !s.Remove("daemon:d1") {
		t.Fatal("Remove did not find the pod")
	}
	// The name goes (other replicas' entries name it again when read);
	// the entry stays.
	if got := f.ix.HolderWords(7, nil); len(got) != 1 {
		t.Fatalf("holders of 7 after Remove of a shared stream: %v, want d1's entry kept", got)
	}
}
