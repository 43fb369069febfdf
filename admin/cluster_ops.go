package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/cluster"
	"kvtier/engine"
)

// The daemon's side of the controller's cluster operations
// (docs/cluster.md, "Cluster operations"): POST /api/v1/cluster/{clear,
// pin, unpin, copy, pull, drop}, each answering cluster.DaemonReply.

// maxPins bounds the pins the daemon tracks for unpin; pins whose lease
// ended are forgotten first.
const maxPins = 1 << 16

// pullWindow is how many chunks a pull reads per round trip to the
// source daemon.
const pullWindow = 64

// pullLease is how long the source keeps a window's chunks for the
// pull: long enough for one window's read.
const pullLease = 30 * time.Second

// clusterOps serves the daemon-side cluster operations of one API.
type clusterOps struct {
	a    *API
	mu   sync.Mutex
	pins map[chunk.Key]engine.LeaseID // RAM pins by key, for unpin
}

// routeClusterOps adds the cluster operations' routes to mux.
func (a *API) routeClusterOps(mux *http.ServeMux) {
	o := &clusterOps{a: a, pins: make(map[chunk.Key]engine.LeaseID)}
	mux.HandleFunc("POST "+cluster.DaemonClearPath, o.clear)
	mux.HandleFunc("POST "+cluster.DaemonPinPath, o.pin)
	mux.HandleFunc("POST "+cluster.DaemonUnpinPath, o.unpin)
	mux.HandleFunc("POST "+cluster.DaemonCopyPath, o.copy)
	mux.HandleFunc("POST "+cluster.DaemonPullPath, o.pull)
	mux.HandleFunc("POST "+cluster.DaemonDropPath, o.drop)
}

// decodeOp reads a strict, bounded request body into v; false means the
// error was answered.
func decodeOp(w http.ResponseWriter, r *http.Request, v any) bool {
	err := cluster.Decode(r.Body, cluster.MaxOpBodyBytes, v)
	switch {
	case errors.Is(err, cluster.ErrTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err)
	case err != nil:
		writeError(w, http.StatusBadRequest, err)
	default:
		return true
	}
	return false
}

// chunkKeys converts keys, refusing more than cluster.MaxOpKeys.
func chunkKeys(w http.ResponseWriter, keys []cluster.ChunkKey) ([]chunk.Key, bool) {
	if len(keys) > cluster.MaxOpKeys {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("keys: %d, at most %d", len(keys), cluster.MaxOpKeys))
		return nil, false
	}
	out := make([]chunk.Key, len(keys))
	for i, k := range keys {
		out[i] = chunk.Key{Scope: k.Scope, Hash: chunk.Hash(k.Hash)}
	}
	return out, true
}

func fromChunkKeys(keys []chunk.Key) []cluster.ChunkKey {
	out := make([]cluster.ChunkKey, len(keys))
	for i, k := range keys {
		out[i] = cluster.ChunkKey{Scope: k.Scope, Hash: k.Hash}
	}
	return out
}

func (o *clusterOps) reply(w http.ResponseWriter, what string, rep cluster.DaemonReply) {
	o.a.log.Info("cluster operation", "op", what, "counts", rep.Counts)
	writeJSON(w, http.StatusOK, rep)
}

// clear drops a tier's (or every local tier's) chunks of a scope, of a
// model's scopes, or of every scope.
func (o *clusterOps) clear(w http.ResponseWriter, r *http.Request) {
	var req cluster.DaemonClear
	if !decodeOp(w, r, &req) {
		return
	}
	if req.Scope != 0 && req.Model != "" {
		writeError(w, http.StatusBadRequest, errors.New("scope and model: give one, not both"))
		return
	}
	scopes := []uint64{uint64(req.Scope)}
	rep := cluster.DaemonReply{Counts: map[string]int{}}
	if req.Model != "" {
		if scopes = o.a.eng.ScopesOf(req.Model); len(scopes) == 0 {
			rep.Note = fmt.Sprintf("no scope of model %q was registered with this daemon: nothing to clear", req.Model)
		}
	}
	tierName := cluster.NormalizeTier(req.Tier)
	for _, sc := range scopes {
		if tierName != "" {
			n, err := o.a.eng.ClearTier(sc, tierName)
			if err != nil {
				writeError(w, http.StatusBadRequest, err)
				return
			}
			rep.Counts["removed_"+tierName] += n
			continue
		}
		removed, notCleared := o.a.eng.Clear(sc)
		for i, name := range o.a.eng.TierNames() {
			if !slices.Contains(notCleared, name) {
				rep.Counts["removed_"+name] += removed[i]
			}
		}
		if len(notCleared) > 0 {
			rep.Note = notClearedNote
		}
	}
	o.reply(w, "clear", rep)
}

// pin pins each chunk where this daemon holds it, for the TTL asked
// (capped by the lease rule).
func (o *clusterOps) pin(w http.ResponseWriter, r *http.Request) {
	var req cluster.DaemonPin
	if !decodeOp(w, r, &req) {
		return
	}
	keys, ok := chunkKeys(w, req.Keys)
	if !ok {
		return
	}
	if req.TTLMS <= 0 {
		writeError(w, http.StatusBadRequest, errors.New("ttl_ms: want a positive number of milliseconds"))
		return
	}
	ttl := o.a.eng.LeaseTTL(time.Duration(req.TTLMS) * time.Millisecond)
	rep := cluster.DaemonReply{Counts: map[string]int{"ttl_ms": int(ttl.Milliseconds())}}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range keys {
		if len(o.pins) >= maxPins {
			o.prune()
		}
		if len(o.pins) >= maxPins {
			writeError(w, http.StatusServiceUnavailable, fmt.Errorf("%d pins held: unpin some first", maxPins))
			return
		}
		if old, ok := o.pins[k]; ok {
			o.a.eng.Release(old) // pinned again: the new TTL replaces the old
			delete(o.pins, k)
		}
		lease, where := o.a.eng.PinKey(k, ttl)
		if lease != 0 {
			o.pins[k] = lease
		}
		if len(where) == 0 {
			rep.Counts["missing"]++
			continue
		}
		rep.Counts["pinned"]++
		for _, name := range where {
			rep.Counts["pinned_"+name]++
		}
	}
	if rep.Counts["pinned"] > 0 {
		rep.Note = "pins in RAM end at unpin or after the TTL; pins on disk are deadlines and end after the TTL only"
	}
	o.reply(w, "pin", rep)
}

// prune forgets the pins whose lease ended. Called with o.mu held.
func (o *clusterOps) prune() {
	for k, id := range o.pins {
		if !o.a.eng.LeaseActive(id) {
			delete(o.pins, k)
		}
	}
}

// unpin ends the RAM pins of keys.
func (o *clusterOps) unpin(w http.ResponseWriter, r *http.Request) {
	var req cluster.DaemonKeys
	if !decodeOp(w, r, &req) {
		return
	}
	keys, ok := chunkKeys(w, req.Keys)
	if !ok {
		return
	}
	rep := cluster.DaemonReply{Counts: map[string]int{"unpinned": 0, "not_pinned": 0},
		Note: "pins on disk are deadlines: they end after their TTL"}
	o.mu.Lock()
	for _, k := range keys {
		id, ok := o.pins[k]
		delete(o.pins, k)
		if ok && o.a.eng.Release(id) {
			rep.Counts["unpinned"]++
		} else {
			rep.Counts["not_pinned"]++
		}
	}
	o.mu.Unlock()
	o.reply(w, "unpin", rep)
}

// copy copies or moves chunks between this daemon's tiers.
func (o *clusterOps) copy(w http.ResponseWriter, r *http.Request) {
	var req cluster.DaemonCopy
	if !decodeOp(w, r, &req) {
		return
	}
	keys, ok := chunkKeys(w, req.Keys)
	if !ok {
		return
	}
	res, err := o.a.eng.CopyToTier(r.Context(), keys, cluster.NormalizeTier(req.Tier), req.Move)
	switch {
	case errors.Is(err, engine.ErrNotLocalTier):
		writeError(w, http.StatusBadRequest, err)
		return
	case err != nil: // a tier that failed a read or a write
		writeError(w, http.StatusInternalServerError, fmt.Errorf("%w (after %d copied)", err, res.Copied))
		return
	}
	counts := map[string]int{"copied": res.Copied, "already": res.Already, "missing": res.Missing}
	if req.Move {
		counts["dropped_elsewhere"] = res.Dropped
	}
	o.reply(w, "copy", cluster.DaemonReply{Counts: counts})
}

// drop removes chunks from this daemon's local tiers: a move's source
// lets go of what the destination confirmed.
func (o *clusterOps) drop(w http.ResponseWriter, r *http.Request) {
	var req cluster.DaemonKeys
	if !decodeOp(w, r, &req) {
		return
	}
	keys, ok := chunkKeys(w, req.Keys)
	if !ok {
		return
	}
	n := o.a.eng.DropLocal(keys)
	o.reply(w, "drop", cluster.DaemonReply{Counts: map[string]int{"dropped": n, "missing": len(keys) - n}})
}

// pull reads chunks from the daemon at req.From over its TCP protocol,
// as a P2P peer does (leased on the source, every chunk checked against
// the source's checksum), and stores them here: in RAM, written on to
// the lower tiers as any store, or moved into req.Tier.
func (o *clusterOps) pull(w http.ResponseWriter, r *http.Request) {
	var req cluster.DaemonPull
	if !decodeOp(w, r, &req) {
		return
	}
	keys, ok := chunkKeys(w, req.Keys)
	if !ok {
		return
	}
	if req.From == "" {
		writeError(w, http.StatusBadRequest, errors.New("from: required, the source daemon's TCP address"))
		return
	}
	p := puller{eng: o.a.eng, counts: map[string]int{"pulled": 0, "already": 0, "missing": 0, "bytes": 0}}
	err := p.run(r.Context(), req.From, o.a.cfg.TCPToken, keys)
	if err == nil && req.Tier != "" && cluster.NormalizeTier(req.Tier) != "mem" {
		var res engine.CopyResult
		res, err = o.a.eng.CopyToTier(r.Context(), p.held, cluster.NormalizeTier(req.Tier), true)
		p.counts["in_"+cluster.NormalizeTier(req.Tier)] = res.Copied + res.Already
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Errorf("pull from %s: %w (%d chunks stored before)", req.From, err, len(p.held)))
		return
	}
	o.reply(w, "pull", cluster.DaemonReply{Counts: p.counts, Keys: fromChunkKeys(p.held)})
}

// puller is one pull's state.
type puller struct {
	eng    *engine.Engine
	counts map[string]int
	held   []chunk.Key // the keys this daemon holds afterwards
	bufs   [][]byte
	writes engine.Writes
}

func (p *puller) run(ctx context.Context, from, token string, keys []chunk.Key) error {
	c, err := client.DialTCP(ctx, from, client.Options{Token: token, Name: "kvtier-pull", Peer: true})
	if err != nil {
		return err
	}
	defer c.Close()
	for rest := keys; len(rest) > 0; {
		n, err := p.window(ctx, c, rest[:min(pullWindow, len(rest))])
		if err != nil {
			return err
		}
		if n == 0 { // the source lacks the first chunk: skip it
			p.counts["missing"]++
			n = 1
		}
		rest = rest[n:]
	}
	return nil
}

// window pulls the leading chunks of keys the source holds and returns
// how many it stored.
func (p *puller) window(ctx context.Context, c *client.Client, keys []chunk.Key) (int, error) {
	// The chunks already here need no transfer.
	if p.eng.InRAM(keys[0]) {
		p.counts["already"]++
		p.held = append(p.held, keys[0])
		return 1, nil
	}
	hit, err := c.Lookup(ctx, client.Raw(keys), uint32(pullLease.Milliseconds()))
	if err != nil || hit.Chunks == 0 {
		return 0, err
	}
	m, lease := int(hit.Chunks), hit.Lease
	if lease != 0 {
		defer c.Release(ctx, lease) // failing, it lapses on its own
	}
	sizes, err := c.Sizes(ctx, client.Raw(keys[:m]))
	if err != nil {
		return 0, err
	}
	m = min(m, len(sizes))
	for len(p.bufs) < m {
		p.bufs = append(p.bufs, nil)
	}
	for j, s := range sizes[:m] {
		if cap(p.bufs[j]) < int(s) {
			p.bufs[j] = make([]byte, s)
		}
		p.bufs[j] = p.bufs[j][:s]
	}
	n, _, err := c.Retrieve(ctx, client.Raw(keys[:m]), p.bufs[:m])
	if err != nil {
		return 0, err // a checksum mismatch among them: nothing is stored
	}
	for j := range n {
		if p.eng.InRAM(keys[j]) { // stored here meanwhile
			p.counts["already"]++
			p.held = append(p.held, keys[j])
			continue
		}
		if err := p.store(ctx, keys[j], p.bufs[j]); err != nil {
			return j, err
		}
	}
	return n, nil
}

// store puts one pulled chunk into RAM, to be written to the lower tiers
// as any stored chunk. RAM full of chunks whose writes to disk are still
// queued (a pull larger than RAM outruns the disk) waits for those
// writes once, then gives up.
func (p *puller) store(ctx context.Context, k chunk.Key, data []byte) error {
	p.writes.Begin(p.eng)
	buf, err := p.writes.Reserve(k, len(data))
	// Flush's writes free RAM even when some lower tier still lacks a
	// chunk (ErrNotDurable): try again unless ctx ended.
	if errors.Is(err, engine.ErrNoSpace) && (p.eng.Flush(ctx) == nil || ctx.Err() == nil) {
		buf, err = p.writes.Reserve(k, len(data))
	}
	if err != nil {
		p.writes.Abort()
		return fmt.Errorf("storing %v: %w", k, err)
	}
	copy(buf, data)
	if err := p.writes.Commit(); err != nil {
		return fmt.Errorf("storing %v: %w", k, err)
	}
	p.counts["pulled"]++
	p.counts["bytes"] += len(data)
	p.held = append(p.held, k)
	return nil
}
