package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"kvtier/admin"
	"kvtier/cluster"
	"kvtier/cluster/member"
	"kvtier/config"
	"kvtier/engine"
	"kvtier/kvevents/announce"
)

// startCluster opens the cluster's chunk stream and prepares the member
// that registers with the controller, when controller_url is set. tcpAddr
// and adminAddr are the bound listeners' addresses.
func startCluster(cfg config.Config, eng *engine.Engine, opts engine.Options, adm *admin.API,
	tcpAddr, adminAddr string, log *slog.Logger) (*member.Member, *member.Stream, error) {
	if cfg.ControllerURL == "" {
		return nil, nil, nil
	}
	bases, err := cfg.ControllerBases()
	if err != nil {
		return nil, nil, fmt.Errorf("controller_url: %w", err)
	}
	instance := instanceOf(cfg, tcpAddr)
	stream, err := member.NewStream(cfg.ClusterEventsEndpoint, instance, log)
	if err != nil {
		return nil, nil, err
	}
	host, _, _ := net.SplitHostPort(tcpAddr)
	reg := cluster.Register{
		Instance: instance,
		Addr:     tcpAddr,
		Events:   "tcp://" + advertise(stream.Addr(), host),
		Admin:    adminScheme(cfg) + advertise(adminAddr, host),
		Tiers:    tiersOf(eng, opts),
		// A lookup by tokens at the controller cuts prompts with it.
		ChunkSize: eng.ChunkSize(),
	}
	m := member.New(member.Options{Controllers: bases, Token: cfg.ControllerToken, Register: reg, Interval: cfg.HeartbeatInterval,
		Stream: stream, Lister: eng, Log: log})
	adm.HandleClusterResync(m.StartResync)
	log.Info("cluster chunk stream publishing", "endpoint", reg.Events, "instance", instance, "controllers", bases)
	return m, stream, nil
}

// runMember runs m until ctx is done; the channel closes once it has
// deregistered (at once when there is no member).
func runMember(ctx context.Context, m *member.Member) <-chan struct{} {
	done := make(chan struct{})
	if m == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	return done
}

// instanceOf returns the instance id the daemon registers as.
func instanceOf(cfg config.Config, tcpAddr string) string {
	if cfg.InstanceID != "" {
		return cfg.InstanceID
	}
	return defaultInstance(tcpAddr)
}

// defaultInstance names the daemon by host name and TCP port, unique per
// daemon on a host since two cannot share the port.
func defaultInstance(tcpAddr string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "kvtier"
	}
	_, port, _ := net.SplitHostPort(tcpAddr)
	return host + ":" + port
}

// advertise turns a bound address into one a peer can dial: a wildcard
// host ("*", "", 0.0.0.0, ::) becomes host, the TCP protocol's host.
func advertise(bound, host string) string {
	bound = strings.TrimPrefix(bound, "tcp://")
	h, port, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if ip := net.ParseIP(h); h == "" || h == "*" || ip != nil && ip.IsUnspecified() {
		h = host
	}
	return net.JoinHostPort(h, port)
}

// tiersOf lists the daemon's local tiers and their sizes for the registry.
func tiersOf(eng *engine.Engine, opts engine.Options) []cluster.Tier {
	var out []cluster.Tier
	for _, name := range eng.TierNames() {
		t := cluster.Tier{Name: name}
		switch name {
		case "mem":
			t.CapacityBytes = opts.RAMBytes
		case "disk":
			t.CapacityBytes = opts.DiskBytes
		}
		out = append(out, t)
	}
	return out
}

// observers joins the router's and the cluster's listeners; either may be
// absent (a nil pointer must not become a non-nil interface).
func observers(pub *announce.Publisher, stream *member.Stream) engine.Observer {
	var obs []engine.Observer
	if pub != nil {
		obs = append(obs, pub)
	}
	if stream != nil {
		obs = append(obs, stream)
	}
	return engine.Observers(obs...)
}

// adminScheme is how the controller reaches this daemon's admin API.
func adminScheme(cfg config.Config) string {
	if cfg.AdminTLSCert != "" {
		return "https://"
	}
	return "http://"
}
