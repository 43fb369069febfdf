package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"kvtier/kvevents"
	"kvtier/router/index"
)

// Subscriber subscribes to the KV events of a list of pods and keeps an
// index up to date with them. The list can change while it runs (Update).
type Subscriber struct {
	cfg      Config
	ix       index.Store
	pods     *index.Pods
	counters counterSet

	mu      sync.Mutex
	ctx     context.Context // Start's, for endpoints added later
	cancel  context.CancelFunc
	running map[string]*running // by pod name
	added   map[string]bool     // pods of Add: Update leaves them alone
	wg      sync.WaitGroup
	started bool
}

// running is one endpoint's receiving goroutine.
type running struct {
	ep     Endpoint
	st     *stream // owned by the goroutine until done is closed
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Subscriber that will write into ix, naming pods in pods.
// Nothing runs until Start.
func New(cfg Config, ix index.Store, pods *index.Pods) (*Subscriber, error) {
	if ix == nil || pods == nil {
		return nil, fmt.Errorf("%w: nil index or pod registry", ErrConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.ReconnectInterval == 0 {
		cfg.ReconnectInterval = DefaultReconnectInterval
	}
	cfg.Endpoints = append([]Endpoint(nil), cfg.Endpoints...)
	s := &Subscriber{cfg: cfg, ix: ix, pods: pods}
	for _, ep := range cfg.Endpoints {
		s.counters.get(ep.Pod) // configured pods show in Stats from the start
	}
	return s, nil
}

// Start launches one receiving goroutine per endpoint and returns at once;
// connections are made (and remade) in the background. It runs until ctx is
// done or Close is called. Start may be called once.
func (s *Subscriber) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("ingest: Subscriber already started")
	}
	s.started = true
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.running = make(map[string]*running)
	for _, ep := range s.cfg.Endpoints {
		s.startLocked(ep)
	}
	return nil
}

// startLocked launches ep's receiving goroutine. Called with s.mu held.
func (s *Subscriber) startLocked(ep Endpoint) {
	ctx, cancel := context.WithCancel(s.ctx)
	var replay replayFunc
	if ep.Replay != "" {
		replay = s.replayer(ctx, ep.Replay)
	}
	st := newStream(s.ix, s.pods, &s.counters, ep.Pod, replay)
	st.onResync = s.cfg.OnResync
	st.fixed = ep.FixedPod
	st.shared = ep.Shared && ep.FixedPod
	if p, ok := st.pod(ep.Pod); ok && ep.Model != "" {
		s.pods.SetModel(p.id, ep.Model)
	}
	r := &running{ep: ep, st: st, cancel: cancel, done: make(chan struct{})}
	s.running[ep.Pod] = r
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(r.done)
		s.receive(ctx, ep, st)
	}()
}

// Update makes the running endpoints equal eps: it starts new pods, stops
// pods no longer listed — dropping their entries from the index and their
// names from the registry, so nothing stale is ever scored — and restarts
// pods whose endpoint changed (their entries are dropped too: the new
// publisher's state is unknown). It validates eps first and changes
// nothing when they are invalid. Call it after Start.
func (s *Subscriber) Update(eps []Endpoint) error {
	cfg := s.cfg
	cfg.Endpoints = eps
	if err := cfg.validate(); err != nil {
		return err
	}
	want := make(map[string]Endpoint, len(eps))
	for _, ep := range eps {
		if _, dup := want[ep.Pod]; dup {
			return fmt.Errorf("%w: pod %q listed twice", ErrConfig, ep.Pod)
		}
		want[ep.Pod] = ep
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.ctx.Err() != nil {
		return errors.New("ingest: Update before Start or after Close")
	}
	for name := range want {
		if s.added[name] {
			return fmt.Errorf("%w: pod %q is followed already (added on its own)", ErrConfig, name)
		}
	}
	for name, r := range s.running {
		if ep, keep := want[name]; s.added[name] || keep && ep == r.ep {
			continue
		}
		s.stopLocked(name, r, want)
	}
	for name, ep := range want {
		if _, ok := s.running[name]; !ok {
			s.counters.get(name)
			s.startLocked(ep)
		}
	}
	s.cfg.Endpoints = append([]Endpoint(nil), eps...)
	return nil
}

// stopLocked stops a running endpoint and drops from the index and the
// registry the endpoint's own pod and every pod its topics named, except
// those in keep. Called with s.mu held.
func (s *Subscriber) stopLocked(name string, r *running, keep map[string]Endpoint) {
	r.cancel()
	<-r.done
	delete(s.running, name)
	for pod := range r.st.byName {
		if id, ok := s.pods.ID(pod); ok {
			if !r.st.shared {
				s.ix.ClearPod(id)
			}
			if _, still := keep[pod]; !still {
				s.pods.Remove(pod)
			}
		}
	}
}

// Add follows one more endpoint, apart from the list Update manages (a
// daemon that registered with the controller): Update neither stops it
// nor may list its pod. Adding a pod that is followed restarts it when
// its endpoint changed, dropping its entries. Call it after Start.
func (s *Subscriber) Add(ep Endpoint) error {
	cfg := s.cfg
	cfg.Endpoints = []Endpoint{ep}
	if err := cfg.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.ctx.Err() != nil {
		return errors.New("ingest: Add before Start or after Close")
	}
	if r, ok := s.running[ep.Pod]; ok {
		if !s.added[ep.Pod] {
			return fmt.Errorf("%w: pod %q is configured already", ErrConfig, ep.Pod)
		}
		if r.ep == ep {
			return nil
		}
		s.stopLocked(ep.Pod, r, nil)
	}
	if s.added == nil {
		s.added = make(map[string]bool)
	}
	s.added[ep.Pod] = true
	s.counters.get(ep.Pod)
	s.startLocked(ep)
	return nil
}

// Remove stops following a pod of Add and drops its entries (unless the
// endpoint is Shared) and name.
// It reports whether the pod was followed.
func (s *Subscriber) Remove(pod string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.running[pod]
	if !ok || !s.added[pod] {
		return false
	}
	delete(s.added, pod)
	s.stopLocked(pod, r, nil)
	return true
}

// Endpoints returns the endpoints being followed.
func (s *Subscriber) Endpoints() []Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Endpoint(nil), s.cfg.Endpoints...)
}

// Close stops every receiving goroutine, closes the sockets and waits for
// them. It is safe to call more than once, and without Start.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
	return nil
}

// Stats returns the counters of every pod seen so far (configured or named
// by a topic), by pod name.
func (s *Subscriber) Stats() map[string]PodStats { return s.counters.snapshot() }

// receive runs the SUB socket of one endpoint until ctx is done. The
// socket's automatic reconnect re-dials a publisher that went away (vLLM
// restarting on the same port) and re-sends the subscription.
func (s *Subscriber) receive(ctx context.Context, ep Endpoint, st *stream) {
	sub := zmq4.NewSub(ctx,
		zmq4.WithAutomaticReconnect(true),
		zmq4.WithDialerRetry(s.cfg.ReconnectInterval),
		zmq4.WithDialerMaxRetries(-1), // until ctx is done
	)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ep.Topic); err != nil {
		return // only fails for a bad option name
	}
	addr, err := guarded(ep.Address) // validated by New: cannot fail here
	if err != nil {
		return
	}
	// zmq4 retries refused connections itself, but a failed handshake (a
	// peer that is not a ZMTP publisher, or one refused by the frame guard)
	// ends Dial with an error: try again after a pause until ctx is done.
	for {
		err := sub.Dial(addr)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(s.cfg.ReconnectInterval, 100*time.Millisecond)):
		}
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue // a dropped connection; the socket re-dials it
		}
		st.handle(msg.Frames)
	}
}

// replayer returns the replayFunc of one replay endpoint. Each request uses
// a fresh DEALER socket bounded by the replay timeout, so a publisher that
// never answers costs one timeout and leaves nothing behind.
func (s *Subscriber) replayer(ctx context.Context, addr string) replayFunc {
	return func(start uint64, visit func(seq uint64, payload []byte)) error {
		return requestReplay(ctx, addr, s.cfg.ReplayTimeout, s.cfg.ReconnectInterval, start, visit)
	}
}

// requestReplay asks vLLM's replay ROUTER socket for the buffered messages
// with seq ≥ start. vLLM's server expects (identity, empty delimiter, start)
// at its ROUTER, so the DEALER sends the delimiter itself; answers arrive as
// (empty, [topic,] seq, payload) and end with seq = -1 (see
// kvevents.DecodeReplayReply).
func requestReplay(ctx context.Context, addr string, timeout, retry time.Duration, start uint64, visit func(seq uint64, payload []byte)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmq4.WithDialerRetry(retry), zmq4.WithDialerMaxRetries(-1))
	defer dealer.Close()
	dialAddr, err := guarded(addr)
	if err != nil {
		return err
	}
	if err := dealer.Dial(dialAddr); err != nil {
		return fmt.Errorf("ingest: dialing replay socket %s: %w", addr, err)
	}
	req := zmq4.NewMsgFrom([]byte{}, kvevents.AppendReplayRequest(nil, start))
	if err := dealer.SendMulti(req); err != nil {
		return fmt.Errorf("ingest: sending replay request to %s: %w", addr, err)
	}
	for {
		msg, err := dealer.Recv()
		if err != nil {
			return fmt.Errorf("ingest: reading replay from %s: %w", addr, err)
		}
		reply, err := kvevents.DecodeReplayReply(msg.Frames)
		if err != nil {
			return fmt.Errorf("ingest: replay from %s: %w", addr, err)
		}
		if reply.End {
			return nil
		}
		visit(reply.Seq, reply.Payload)
	}
}
