package controller

import (
	"context"
	"net/http"

	"kvtier/cluster"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

// membership is the cluster registry as the controller runs it: the
// in-memory registry of one process (registry, the default), or the
// registry shared by controller replicas through Redis (sharedRegistry,
// with index_redis). Both serve /v1/cluster/ and follow the registered
// daemons' chunk streams into the index.
type membership interface {
	http.Handler
	// onResync is the subscriber's hook (ingest.Config.OnResync).
	onResync(pod, reason string)
	// attach hands over the subscriber, which needs onResync first.
	attach(sub *ingest.Subscriber)
	// run drops the daemons whose beats stopped (and, shared, follows
	// what other replicas changed) until ctx is done.
	run(ctx context.Context)
	// registered lists the registered daemons (for cluster operations); an
	// error means the registry could not be read (Redis unreachable).
	registered() ([]cluster.Instance, error)
	// setDaemonTransport sets how resync requests reach the daemons
	// (daemonTransport: with the cluster token).
	setDaemonTransport(rt http.RoundTripper)
}

var (
	_ membership = (*registry)(nil)
	_ membership = (*sharedRegistry)(nil)
)

func (r *registry) attach(sub *ingest.Subscriber) { r.sub = sub }
func (r *registry) run(ctx context.Context)       { r.reap(ctx) }

func (r *registry) registered() ([]cluster.Instance, error)       { return r.instances(), nil }
func (r *registry) setDaemonTransport(rt http.RoundTripper)       { r.hc.Transport = rt }
func (r *sharedRegistry) setDaemonTransport(rt http.RoundTripper) { r.look.setDaemonTransport(rt) }
func (r *sharedRegistry) registered() ([]cluster.Instance, error) { return r.instances() }

// reader returns the store a lookup of keys reads: the index itself, or,
// for an index across the network (Redis), a snapshot of every key read
// in one round trip. A failed read leaves an empty snapshot: no holders,
// which the P2P tier takes as a miss. It is not logged here, once per
// lookup: the index counts it, and the shared registry logs Redis being
// unreachable once.
func (r *registry) reader(keys []uint64) index.Store {
	s, ok := r.ix.(index.Snapshotter)
	if !ok {
		return r.ix
	}
	snap, _ := s.Snapshot(keys)
	return snap
}
