package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/cluster"
	"kvtier/internal/ratelog"
	"kvtier/router/index"
	"kvtier/router/ingest"
	"kvtier/router/redisindex"
)

// Shared registry settings.
const (
	// sharedPrefix starts the registry's keys, next to the index's
	// "kvtier:" keys (router/redisindex).
	sharedPrefix = "kvtier:cluster:"
	// clearLease is how long a replica may take to clear a dropped
	// daemon's entries before another takes the clear over; meanwhile the
	// daemon cannot register again (it is told to retry).
	clearLease = 10 * time.Second
	// reapLimit bounds the daemons one reap call drops.
	reapLimit = 1000
	// redisTimeout bounds each registry call to Redis.
	redisTimeout = 2 * time.Second
	// refreshEvery is how often a replica asks each daemon to resync
	// although nothing was lost: the Redis index forgets a holding that
	// no report refreshed for its TTL (redisindex.DefaultTTL, a day),
	// and a chunk can sit on a daemon's disk for longer than that.
	refreshEvery = redisindex.DefaultTTL / 4
)

// sharedRegistry is the cluster registry kept in Redis, so that several
// controller replicas on one Redis (and one index there, router/
// redisindex) answer alike, and killing one loses nothing
// (docs/cluster.md, "High availability"). Redis holds the registrations,
// sessions and last beats; every replica follows every registered
// daemon's chunk stream into the shared index (the writes are
// idempotent, so the index converges whichever replicas apply them), and
// any replica drops a daemon whose beats stopped, once, by an atomic
// script. Lookups are served by an in-memory registry (look) whose
// table of daemons this one keeps in step with Redis.
type sharedRegistry struct {
	rdb      goredis.UniversalClient
	interval time.Duration
	missed   int
	ix       index.Store
	pods     *index.Pods
	sub      *ingest.Subscriber
	log      *slog.Logger
	logs     ratelog.Set // lines that repeat per registration, beat or request while Redis or a daemon fails
	look     *registry   // serves lookups from the daemon table sync keeps

	beats, clearing, channel string // keys

	// syncMu serializes what changes the streams followed: syncs,
	// clears, registrations. A replica's clear of a daemon therefore
	// always ends before it follows that daemon's next registration,
	// whose resync rebuilds whatever the clear took (see clearDaemon).
	syncMu   sync.Mutex
	followed map[string]string // instance → session followed

	mu        sync.Mutex
	records   map[string]sharedRecord // as of the last sync
	resyncing map[string]bool
	resyncs   map[string]uint64    // requested by this replica
	asked     map[string]time.Time // when this replica last asked for a resync
}

// sharedRecord is one registered daemon as Redis holds it.
type sharedRecord struct {
	reg        cluster.Register
	session    string
	registered time.Time
	lastBeat   time.Time
}

func newSharedRegistry(rdb goredis.UniversalClient, ix index.Store, pods *index.Pods, interval time.Duration, missed int, log *slog.Logger) *sharedRegistry {
	return &sharedRegistry{
		rdb: rdb, interval: interval, missed: missed, ix: ix, pods: pods, log: log,
		look:  newRegistry(nil, ix, pods, interval, missed, log),
		beats: sharedPrefix + "beats", clearing: sharedPrefix + "clearing", channel: sharedPrefix + "changed",
		followed: make(map[string]string), records: make(map[string]sharedRecord),
		resyncing: make(map[string]bool), resyncs: make(map[string]uint64), asked: make(map[string]time.Time),
	}
}

func (r *sharedRegistry) attach(sub *ingest.Subscriber) { r.sub = sub; r.look.sub = sub }

func (r *sharedRegistry) record(instance string) string { return sharedPrefix + "d:" + instance }

func redisCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), redisTimeout)
}

// ServeHTTP answers the registry's writes and its listing from Redis, and
// everything else (lookups) from the in-memory registry's handler.
func (r *sharedRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch {
	case req.URL.Path == "/v1/cluster/instances" && req.Method == http.MethodGet:
		out, err := r.instances()
		if err != nil {
			httpError(w, http.StatusServiceUnavailable, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"instances": out})
	case req.Method == http.MethodPost && req.URL.Path == "/v1/cluster/register":
		r.serveRegister(w, req)
	case req.Method == http.MethodPost && (req.URL.Path == "/v1/cluster/heartbeat" || req.URL.Path == "/v1/cluster/deregister"):
		r.serveBeat(w, req, req.URL.Path == "/v1/cluster/deregister")
	default:
		r.look.ServeHTTP(w, req)
	}
}

func (r *sharedRegistry) serveRegister(w http.ResponseWriter, req *http.Request) {
	var reg cluster.Register
	if err := cluster.Decode(req.Body, cluster.MaxBodyBytes, &reg); err != nil {
		decodeError(w, err)
		return
	}
	if err := reg.Validate(); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	out, err := r.register(reg)
	if errors.Is(err, errChunkSizeMix) {
		httpError(w, http.StatusConflict, err)
		return
	}
	if err != nil {
		// Redis unreachable, or the instance's old entries still being
		// cleared: the daemon retries at its next beat.
		httpError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// errClearing answers a registration while the instance's previous
// entries are being cleared.
var errClearing = errors.New("the instance's previous entries are being cleared; register again shortly")

// register records a valid registration in Redis and follows its stream.
// A daemon registering again (it restarted) has its old entries cleared
// first, as the in-memory registry does; the new subscription's first
// message asks for the resync that rebuilds them.
func (r *sharedRegistry) register(reg cluster.Register) (cluster.Registered, error) {
	body, err := json.Marshal(reg)
	if err != nil {
		return cluster.Registered{}, err
	}
	if err := r.chunkSizeMix(reg); err != nil {
		return cluster.Registered{}, err
	}
	session := newSession()
	ctx, cancel := redisCtx()
	res, err := registerScript.Run(ctx, r.rdb, []string{r.beats, r.clearing, r.record(reg.Instance)},
		reg.Instance, body, session, r.channel).StringSlice()
	cancel()
	if err != nil {
		return cluster.Registered{}, fmt.Errorf("registry in Redis: %w", err)
	}
	if len(res) != 2 || res[0] != "ok" {
		return cluster.Registered{}, errClearing
	}
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	if res[1] != "" {
		var old cluster.Register
		if json.Unmarshal([]byte(res[1]), &old) == nil && old.Addr != reg.Addr {
			r.logs.Log(r.log, slog.LevelWarn, "instance registered again from another address; instance ids must be unique",
				"instance", reg.Instance, "was", old.Addr, "now", reg.Addr)
		}
		r.clearPod(reg.Instance)
	}
	if err := r.syncLocked(); err != nil {
		r.logs.Log(r.log, slog.LevelWarn, "registry sync after a registration failed", "err", err)
	}
	r.log.Info("daemon registered", "instance", reg.Instance, "addr", reg.Addr, "events", reg.Events)
	return cluster.Registered{Session: session, HeartbeatIntervalMS: r.interval.Milliseconds()}, nil
}

// serveBeat answers a heartbeat or a deregistration: 404 for a session
// the registry does not know, 503 when Redis cannot be reached.
func (r *sharedRegistry) serveBeat(w http.ResponseWriter, req *http.Request, leave bool) {
	var hb cluster.Heartbeat
	if err := cluster.Decode(req.Body, cluster.MaxBodyBytes, &hb); err != nil {
		decodeError(w, err)
		return
	}
	ctx, cancel := redisCtx()
	var n int
	var err error
	if leave {
		n, err = leaveScript.Run(ctx, r.rdb, []string{r.beats, r.clearing, r.record(hb.Instance)},
			hb.Instance, hb.Session, clearLease.Milliseconds(), r.channel).Int()
	} else {
		n, err = beatScript.Run(ctx, r.rdb, []string{r.beats, r.record(hb.Instance)}, hb.Instance, hb.Session).Int()
	}
	cancel()
	switch {
	case err != nil:
		httpError(w, http.StatusServiceUnavailable, fmt.Errorf("registry in Redis: %w", err))
		return
	case n == 0:
		httpError(w, http.StatusNotFound, errors.New("unknown instance or session: register again"))
		return
	}
	if leave {
		r.syncMu.Lock()
		r.clearDaemon(hb.Instance, "deregistered")
		if err := r.syncLocked(); err != nil {
			r.logs.Log(r.log, slog.LevelWarn, "registry sync after a deregistration failed", "err", err)
		}
		r.syncMu.Unlock()
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// clearDaemon removes a dropped daemon's entries from the index and
// releases its clear. Called with syncMu held, by the replica whose
// script dropped the daemon (or took its clear over). While the
// instance is in the clearing set it cannot register again, so no
// replica follows a newer registration's stream during the clear.
func (r *sharedRegistry) clearDaemon(instance, why string) {
	r.clearPod(instance)
	ctx, cancel := redisCtx()
	defer cancel()
	_, err := r.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.ZRem(ctx, r.clearing, instance)
		p.Publish(ctx, r.channel, instance)
		return nil
	})
	if err != nil {
		// The lease runs out and a replica clears it again.
		r.logs.Log(r.log, slog.LevelWarn, "releasing a cleared daemon failed", "instance", instance, "err", err)
		return
	}
	r.log.Info("daemon dropped", "instance", instance, "why", why)
}

// clearPod clears the daemon's pod from the index. The name is
// interned for the call and let go again unless its stream is followed.
func (r *sharedRegistry) clearPod(instance string) {
	pod := cluster.HolderPrefix + instance
	id, err := r.pods.Intern(pod)
	if err != nil {
		r.logs.Log(r.log, slog.LevelWarn, "clearing a daemon's entries failed", "instance", instance, "err", err)
		return
	}
	r.ix.ClearPod(id)
	if _, ok := r.followed[instance]; !ok {
		r.pods.Remove(pod)
	}
}

// load reads every registration from Redis.
func (r *sharedRegistry) load() (map[string]sharedRecord, error) {
	ctx, cancel := redisCtx()
	defer cancel()
	beats, err := r.rdb.ZRangeWithScores(ctx, r.beats, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("registry in Redis: %w", err)
	}
	pipe := r.rdb.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(beats))
	for i, b := range beats {
		cmds[i] = pipe.HGetAll(ctx, r.record(b.Member.(string)))
	}
	if len(beats) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("registry in Redis: %w", err)
		}
	}
	out := make(map[string]sharedRecord, len(beats))
	for i, b := range beats {
		f := cmds[i].Val()
		var rec sharedRecord
		if f["session"] == "" || json.Unmarshal([]byte(f["reg"]), &rec.reg) != nil {
			continue // dropped between the two reads
		}
		rec.session = f["session"]
		ms, _ := strconv.ParseInt(f["registered"], 10, 64)
		rec.registered = time.UnixMilli(ms)
		rec.lastBeat = time.UnixMilli(int64(b.Score))
		out[b.Member.(string)] = rec
	}
	return out, nil
}

// sync makes the streams this replica follows, and the lookup table,
// match the registrations in Redis.
func (r *sharedRegistry) sync() error {
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	return r.syncLocked()
}

func (r *sharedRegistry) syncLocked() error {
	recs, err := r.load()
	if err != nil {
		return err
	}
	for instance, session := range r.followed {
		if rec, ok := recs[instance]; !ok || rec.session != session {
			// Gone, or registered again: stop following (the entries
			// stay; whoever dropped it clears them, a new session's
			// resync replaces them).
			r.sub.Remove(cluster.HolderPrefix + instance)
			delete(r.followed, instance)
			r.mu.Lock()
			delete(r.asked, instance)
			delete(r.resyncs, instance)
			r.mu.Unlock()
		}
	}
	for instance, rec := range recs {
		if _, ok := r.followed[instance]; ok {
			continue
		}
		ep := ingest.Endpoint{Pod: cluster.HolderPrefix + instance, Address: rec.reg.Events,
			Topic: cluster.Topic(instance), FixedPod: true, Shared: true}
		if err := r.sub.Add(ep); err != nil {
			r.logs.Log(r.log, slog.LevelWarn, "cannot follow a daemon's chunk stream", "instance", instance, "events", rec.reg.Events, "err", err)
			continue
		}
		r.followed[instance] = rec.session
	}
	r.mu.Lock()
	r.records = recs
	var stale []string
	for instance := range r.followed {
		if at, ok := r.asked[instance]; ok && time.Since(at) > refreshEvery {
			stale = append(stale, instance)
		}
	}
	r.mu.Unlock()
	r.publish(recs)
	for _, instance := range stale {
		r.onResync(cluster.HolderPrefix+instance, "refresh before the index's entries expire")
	}
	return nil
}

// chunkSizeMix refuses reg when a daemon registered in Redis has another
// chunk size, as the in-memory registry does. Two daemons of different
// sizes registering at the same moment through two replicas can both get
// in; a token lookup then uses one of the sizes, and the other daemon's
// chunks are misses, never wrong holders.
func (r *sharedRegistry) chunkSizeMix(reg cluster.Register) error {
	if reg.ChunkSize <= 0 {
		return nil
	}
	recs, err := r.load()
	if err != nil {
		return fmt.Errorf("registry in Redis: %w", err)
	}
	for name, rec := range recs {
		if name != reg.Instance && rec.reg.ChunkSize > 0 && rec.reg.ChunkSize != reg.ChunkSize {
			return fmt.Errorf("%w: %d tokens here, %d on %s; every daemon of a cluster must use one chunk_size",
				errChunkSizeMix, reg.ChunkSize, rec.reg.ChunkSize, name)
		}
	}
	return nil
}

// publish rebuilds the lookup table of daemons, by index pod id, and the
// chunk size a lookup by tokens cuts prompts with.
func (r *sharedRegistry) publish(recs map[string]sharedRecord) {
	var table []*daemonEntry
	r.look.chunkSize.Store(0)
	for name, rec := range recs {
		if rec.reg.ChunkSize > 0 {
			r.look.chunkSize.Store(int64(rec.reg.ChunkSize))
		}
		id, ok := r.pods.ID(cluster.HolderPrefix + name)
		if !ok {
			continue
		}
		for int(id) >= len(table) {
			table = append(table, nil)
		}
		table[id] = &daemonEntry{instance: name, addr: rec.reg.Addr, json: appendDaemonJSON(nil, name, rec.reg.Addr)}
	}
	r.look.daemons.Store(&table)
}

// reap drops the daemons whose beats stopped, and takes over clears
// whose replica died; each is handled by exactly one replica.
func (r *sharedRegistry) reap() error {
	window := time.Duration(r.missed) * r.interval
	ctx, cancel := redisCtx()
	dropped, err := reapScript.Run(ctx, r.rdb, []string{r.beats, r.clearing}, sharedPrefix+"d:",
		window.Milliseconds(), clearLease.Milliseconds(), r.channel, reapLimit).StringSlice()
	cancel()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("registry in Redis: %w", err)
	}
	if len(dropped) == 0 {
		return nil
	}
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	for _, instance := range dropped {
		r.clearDaemon(instance, fmt.Sprintf("missed %d heartbeats", r.missed))
	}
	return r.syncLocked()
}

// run reaps every interval and syncs on every change another replica
// announces (Redis pub/sub) and every interval (in case an announcement
// was missed), until ctx is done.
func (r *sharedRegistry) run(ctx context.Context) {
	ps := r.rdb.Subscribe(ctx, r.channel)
	defer ps.Close()
	changes := ps.Channel()
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	// A replica starting follows the daemons registered already.
	err := r.sync()
	failing := err != nil
	if failing {
		r.logs.Log(r.log, slog.LevelWarn, "shared registry: Redis unreachable; serving the last view", "err", err)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
			err = r.sync()
		case <-tick.C:
			err = errors.Join(r.reap(), r.sync())
		}
		// Log the first failure of a run, and the recovery.
		if err != nil && !failing {
			r.logs.Log(r.log, slog.LevelWarn, "shared registry: Redis unreachable; serving the last view", "err", err)
		} else if err == nil && failing {
			r.log.Info("shared registry: Redis reachable again")
		}
		failing = err != nil
	}
}

// onResync asks a daemon for its whole inventory, once at a time.
func (r *sharedRegistry) onResync(pod, reason string) {
	instance, ok := strings.CutPrefix(pod, cluster.HolderPrefix)
	if !ok {
		return
	}
	r.mu.Lock()
	rec, ok := r.records[instance]
	if !ok || r.resyncing[instance] {
		r.mu.Unlock()
		return
	}
	r.resyncing[instance] = true
	r.resyncs[instance]++
	r.asked[instance] = time.Now()
	r.mu.Unlock()
	url := strings.TrimRight(rec.reg.Admin, "/") + "/api/v1/cluster/resync"
	go func() {
		r.look.requestResync(instance, url, reason)
		r.mu.Lock()
		delete(r.resyncing, instance)
		r.mu.Unlock()
	}()
}

// instances lists the registered daemons as Redis has them, sorted by
// name; chunk counts and resyncs are this replica's own.
func (r *sharedRegistry) instances() ([]cluster.Instance, error) {
	recs, err := r.load()
	if err != nil {
		return nil, err
	}
	stats := r.sub.Stats()
	r.mu.Lock()
	out := make([]cluster.Instance, 0, len(recs))
	for name, rec := range recs {
		st := stats[cluster.HolderPrefix+name]
		out = append(out, cluster.Instance{Register: rec.reg, Session: rec.session,
			Registered: rec.registered.UTC().Format(time.RFC3339Nano),
			LastBeat:   rec.lastBeat.UTC().Format(time.RFC3339Nano),
			Chunks: map[string]int{"stored": int(st.BlocksAdded), "removed": int(st.BlocksRemoved),
				"clears": int(st.Clears), "lost": int(st.Lost)},
			Resyncs: r.resyncs[name]})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Instance < out[j].Instance })
	return out, nil
}
