// Package member is the daemon's side of the cluster: it registers the
// daemon with the controller, keeps it registered with heartbeats
// (registering again when the controller forgot it), publishes the
// daemon's chunk admissions and drops on the cluster's chunk stream
// (Stream), and answers the controller's requests for a resync with the
// whole inventory of RAM and disk.
package member

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"kvtier/cluster"
	"kvtier/internal/ratelog"
)

// Options configure a Member.
type Options struct {
	// Controller is the controller's base URL, e.g. "http://10.0.0.2:7481".
	Controller string
	// Controllers, when set, replaces Controller: the base URLs of
	// controller replicas sharing one registry. Registration and beats
	// go to one of them and fail over to the next when it cannot be
	// reached or answers 5xx (cluster.NewFailoverClient).
	Controllers []string
	// Token is presented to the controller (its cluster_token), if set.
	Token string
	// Register is what the daemon registers as.
	Register cluster.Register
	// Interval is the heartbeat interval until the controller names its own.
	Interval time.Duration
	Stream   *Stream
	Lister   Lister
	Log      *slog.Logger
}

// Member keeps the daemon registered.
type Member struct {
	opts   Options
	client *cluster.Client
	wanted atomic.Int64 // resync requests not yet served by a pass that began after them
	logs   ratelog.Set  // failed beats and registrations: one per beat while the controller is away
}

// New returns a Member; nothing runs until Run.
func New(o Options) *Member {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	// A beat that takes longer than the interval is as good as missed.
	hc := &http.Client{Timeout: max(o.Interval, time.Second)}
	if len(o.Controllers) == 0 {
		o.Controllers = []string{o.Controller}
	}
	return &Member{opts: o, client: cluster.NewFailoverClient(o.Controllers, hc).WithToken(o.Token)}
}

// StartResync publishes the inventory again in the background. A request
// that arrives while a resync runs is not lost: that resync's listing may
// have begun before the controller that asked could hear it, so one more
// runs after it (however many requests came meanwhile).
func (m *Member) StartResync() {
	if m.wanted.Add(1) != 1 {
		return // the running loop sees the request
	}
	go func() {
		for {
			start := time.Now()
			n := m.opts.Stream.Resync(m.opts.Lister)
			m.opts.Log.Info("cluster resync published", "chunks", n, "took", time.Since(start))
			// Requests that came during this pass: run once more for
			// all of them, or stop when there were none.
			if m.wanted.Add(-1) == 0 {
				return
			}
			m.wanted.Store(1)
		}
	}()
}

// Run registers and heartbeats until ctx is done, then deregisters.
func (m *Member) Run(ctx context.Context) {
	interval := m.opts.Interval
	session := ""
	tick := time.NewTimer(0)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			m.leave(session)
			return
		case <-tick.C:
		}
		// The keepalive tells a newly subscribed controller that its
		// subscription is live (see Stream.Keepalive).
		m.opts.Stream.Keepalive()
		if session == "" {
			session, interval = m.register(ctx, interval)
		} else if err := m.client.Heartbeat(ctx, m.opts.Register.Instance, session); err != nil {
			if errors.Is(err, cluster.ErrUnknown) {
				// The controller restarted or dropped us: register again
				// at once; its new subscription then asks for a resync.
				m.opts.Log.Warn("controller forgot this daemon; registering again")
				session, interval = m.register(ctx, interval)
			} else if ctx.Err() == nil {
				m.logs.Log(m.opts.Log, slog.LevelWarn, "cluster heartbeat failed", "err", err)
			}
		}
		tick.Reset(interval)
	}
}

// register returns the new session ("" when it failed) and the interval
// to beat at.
func (m *Member) register(ctx context.Context, interval time.Duration) (string, time.Duration) {
	reply, err := m.client.Register(ctx, m.opts.Register)
	if err != nil {
		if ctx.Err() == nil {
			m.logs.Log(m.opts.Log, slog.LevelWarn, "cluster registration failed; retrying", "controllers", m.opts.Controllers, "err", err)
		}
		return "", interval
	}
	if reply.HeartbeatIntervalMS > 0 {
		interval = time.Duration(reply.HeartbeatIntervalMS) * time.Millisecond
	}
	m.opts.Log.Info("registered with the controller", "controller", m.client.Current(),
		"instance", m.opts.Register.Instance, "heartbeat_interval", interval)
	return reply.Session, interval
}

// leave deregisters, briefly: the controller drops a silent daemon anyway.
func (m *Member) leave(session string) {
	if session == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := m.client.Deregister(ctx, m.opts.Register.Instance, session); err != nil {
		m.opts.Log.Warn("cluster deregistration failed", "err", err)
	}
}
