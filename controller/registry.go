package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/cluster"
	"kvtier/internal/ratelog"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

// Registry defaults: a daemon beats every second and is dropped after
// three beats missed.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultMissedHeartbeats  = 3
)

// resyncTimeout bounds one resync request to a daemon: the daemon only
// starts the resync before answering.
const resyncTimeout = 5 * time.Second

// registry is the cluster's membership: the daemons that registered, the
// subscription to each one's chunk stream, and who holds what by way of
// the one block index the router also scores with (a daemon is the index
// pod "daemon:<instance>").
type registry struct {
	interval time.Duration
	missed   int
	sub      *ingest.Subscriber
	ix       index.Store
	pods     *index.Pods
	log      *slog.Logger
	hc       *http.Client
	// resyncErrs: a daemon that refuses the controller (a token mismatch)
	// fails every resync asked of it; one line per 10 s says so.
	resyncErrs *ratelog.Limiter
	logs       ratelog.Set // lines a misconfigured daemon would repeat at every beat

	// changing serializes registrations and drops, which wait for the
	// subscriber; mu guards members and is never held across that wait,
	// because the stream being stopped may be calling onResync.
	changing sync.Mutex
	mu       sync.Mutex
	members  map[string]*daemonRecord // by instance

	// daemons is read by lookups without a lock: a copy-on-write table
	// from index pod id to the daemon's identity, nil for other pods.
	daemons atomic.Pointer[[]*daemonEntry]
	lookups sync.Pool // *lookupScratch
	// chunkSize is the registered daemons' chunk_size (they all share
	// one: register refuses a mix), 0 when none gave it.
	chunkSize atomic.Int64
}

// daemonRecord is one registered daemon.
type daemonRecord struct {
	reg        cluster.Register
	session    string
	registered time.Time
	lastBeat   time.Time
	resyncs    uint64
	resyncing  bool
}

// daemonEntry is what a lookup reports of a daemon, its JSON written once.
type daemonEntry struct {
	instance, addr string
	json           []byte // {"instance":...,"addr":...}
}

func newRegistry(sub *ingest.Subscriber, ix index.Store, pods *index.Pods, interval time.Duration, missed int, log *slog.Logger) *registry {
	r := &registry{interval: interval, missed: missed, sub: sub, ix: ix, pods: pods, log: log,
		hc: &http.Client{Timeout: resyncTimeout}, members: make(map[string]*daemonRecord),
		resyncErrs: ratelog.New(log, slog.LevelWarn, "resync request failed", 10*time.Second)}
	r.daemons.Store(new([]*daemonEntry))
	r.lookups.New = func() any { return new(lookupScratch) }
	return r
}

// onResync is the subscriber's hook: a daemon's chunk stream needs a full
// inventory. It only starts the request.
func (r *registry) onResync(pod, reason string) {
	instance, ok := strings.CutPrefix(pod, cluster.HolderPrefix)
	if !ok {
		return
	}
	r.mu.Lock()
	m, ok := r.members[instance]
	if !ok || m.resyncing {
		r.mu.Unlock()
		return
	}
	m.resyncing = true
	m.resyncs++
	url := strings.TrimRight(m.reg.Admin, "/") + "/api/v1/cluster/resync"
	r.mu.Unlock()
	go r.requestResync(instance, url, reason)
}

// requestResync asks a daemon to publish its whole inventory again.
func (r *registry) requestResync(instance, url, reason string) {
	defer func() {
		r.mu.Lock()
		if m, ok := r.members[instance]; ok {
			m.resyncing = false
		}
		r.mu.Unlock()
	}()
	r.log.Info("asking a daemon to resync", "instance", instance, "reason", reason)
	ctx, cancel := context.WithTimeout(context.Background(), resyncTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err == nil {
		var resp *http.Response
		if resp, err = r.hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				err = fmt.Errorf("%s", resp.Status)
			}
		}
	}
	if err != nil {
		// The next beat of a live daemon is not affected; the stream's
		// next loss or a re-registration asks again.
		r.resyncErrs.Log("instance", instance, "err", err)
	}
}

// register adds or replaces a daemon. A daemon registering again (it
// restarted, or this controller did) gets a new session; its old entries
// are dropped and its stream followed afresh, whose first message asks
// for the resync that rebuilds them.
func (r *registry) register(reg cluster.Register) (cluster.Registered, error) {
	if err := reg.Validate(); err != nil {
		return cluster.Registered{}, err
	}
	pod := cluster.HolderPrefix + reg.Instance
	now := time.Now()
	m := &daemonRecord{reg: reg, session: newSession(), registered: now, lastBeat: now}
	r.changing.Lock()
	defer r.changing.Unlock()
	r.mu.Lock()
	if err := r.chunkSizeMixLocked(reg); err != nil {
		r.mu.Unlock()
		return cluster.Registered{}, err
	}
	if old, ok := r.members[reg.Instance]; ok && old.reg.Addr != reg.Addr {
		// Two daemons sharing an instance id would take the name from
		// each other at every beat: say so, since nothing else will.
		r.logs.Log(r.log, slog.LevelWarn, "instance registered again from another address; instance ids must be unique",
			"instance", reg.Instance, "was", old.reg.Addr, "now", reg.Addr)
	}
	delete(r.members, reg.Instance)
	r.mu.Unlock()
	r.sub.Remove(pod) // a stream followed before: its entries go with it
	ep := ingest.Endpoint{Pod: pod, Address: reg.Events, Topic: cluster.Topic(reg.Instance), FixedPod: true}
	err := r.sub.Add(ep)
	r.mu.Lock()
	if err == nil {
		r.members[reg.Instance] = m
	}
	r.publishLocked()
	r.mu.Unlock()
	if err != nil {
		return cluster.Registered{}, err
	}
	r.log.Info("daemon registered", "instance", reg.Instance, "addr", reg.Addr, "events", reg.Events)
	return cluster.Registered{Session: m.session, HeartbeatIntervalMS: r.interval.Milliseconds()}, nil
}

// errChunkSizeMix refuses a daemon whose chunk size differs from the
// registered daemons': their keys for the same prompt would differ, and a
// lookup by tokens could not name both.
var errChunkSizeMix = errors.New("chunk_size differs from the registered daemons'")

// chunkSizeMixLocked refuses reg when another registered daemon has a
// different chunk size. Called with r.mu held.
func (r *registry) chunkSizeMixLocked(reg cluster.Register) error {
	if reg.ChunkSize <= 0 {
		return nil
	}
	for name, m := range r.members {
		if name != reg.Instance && m.reg.ChunkSize > 0 && m.reg.ChunkSize != reg.ChunkSize {
			return fmt.Errorf("%w: %d tokens here, %d on %s; every daemon of a cluster must use one chunk_size",
				errChunkSizeMix, reg.ChunkSize, m.reg.ChunkSize, name)
		}
	}
	return nil
}

// beat records a heartbeat; false means the session is unknown.
func (r *registry) beat(instance, session string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.members[instance]
	if !ok || m.session != session {
		return false
	}
	m.lastBeat = time.Now()
	return true
}

// drop removes a daemon and its entries; session "" drops any session.
func (r *registry) drop(instance, session, why string) bool {
	r.changing.Lock()
	defer r.changing.Unlock()
	r.mu.Lock()
	m, ok := r.members[instance]
	if !ok || session != "" && m.session != session {
		r.mu.Unlock()
		return false
	}
	delete(r.members, instance)
	r.publishLocked()
	r.mu.Unlock()
	r.sub.Remove(cluster.HolderPrefix + instance)
	r.log.Info("daemon dropped", "instance", instance, "why", why)
	return true
}

// reap drops the daemons whose beats stopped, every interval, until ctx
// is done.
func (r *registry) reap(ctx context.Context) {
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		deadline := time.Now().Add(-time.Duration(r.missed) * r.interval)
		r.mu.Lock()
		var late []*daemonRecord
		for _, m := range r.members {
			if m.lastBeat.Before(deadline) {
				late = append(late, m)
			}
		}
		r.mu.Unlock()
		for _, m := range late {
			// By session: a daemon that registered again since is kept.
			r.drop(m.reg.Instance, m.session, fmt.Sprintf("missed %d heartbeats", r.missed))
		}
	}
}

// publishLocked rebuilds the lookup table of daemons. Called with r.mu
// held, after the subscriber interned or removed the daemon's pod.
func (r *registry) publishLocked() {
	var table []*daemonEntry
	r.chunkSize.Store(0)
	for name, m := range r.members {
		if m.reg.ChunkSize > 0 {
			r.chunkSize.Store(int64(m.reg.ChunkSize))
		}
		id, ok := r.pods.ID(cluster.HolderPrefix + name)
		if !ok {
			continue
		}
		for int(id) >= len(table) {
			table = append(table, nil)
		}
		e := &daemonEntry{instance: name, addr: m.reg.Addr}
		e.json = appendDaemonJSON(nil, name, m.reg.Addr)
		table[id] = e
	}
	r.daemons.Store(&table)
}

// instances lists the registered daemons, sorted by name.
func (r *registry) instances() []cluster.Instance {
	stats := r.sub.Stats()
	r.mu.Lock()
	out := make([]cluster.Instance, 0, len(r.members))
	for name, m := range r.members {
		st := stats[cluster.HolderPrefix+name]
		out = append(out, cluster.Instance{Register: m.reg, Session: m.session,
			Registered: m.registered.UTC().Format(time.RFC3339Nano),
			LastBeat:   m.lastBeat.UTC().Format(time.RFC3339Nano),
			Chunks: map[string]int{"stored": int(st.BlocksAdded), "removed": int(st.BlocksRemoved),
				"clears": int(st.Clears), "lost": int(st.Lost)},
			Resyncs: m.resyncs})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Instance < out[j].Instance })
	return out
}

func newSession() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.New("crypto/rand failed")) // never on Linux ≥ 3.17
	}
	return hex.EncodeToString(b[:])
}
