package controller

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"

	"kvtier/router/api"
)

// upstream is one vLLM instance behind the proxy.
type upstream struct {
	name string // the pod name in the index (prefill) or a label (decode)
	base string // the server's base URL, without a trailing slash
	// pushTo is a decode instance's kvtier daemon TCP address, where the
	// prefill side pushes the KV; empty for prefill instances.
	pushTo   string
	inflight atomic.Int64 // requests the proxy has in flight on it
}

// pool is a fixed set of instances of one role.
type pool struct {
	role string // "prefill" or "decode", for messages
	list []*upstream
	next atomic.Uint64 // rotates the start of tie-breaking scans
}

// parseUpstreams reads instance specs: NAME=URL for prefill instances,
// NAME=URL=HOST:PORT for decode instances (withPush), the address being
// the instance's kvtier daemon.
func parseUpstreams(role string, specs []string, withPush bool) (*pool, error) {
	p := &pool{role: role}
	seen := map[string]bool{}
	for _, spec := range specs {
		u, err := parseUpstream(spec, withPush)
		if err != nil {
			return nil, err
		}
		if seen[u.name] {
			return nil, fmt.Errorf("%q: instance %q given twice", spec, u.name)
		}
		seen[u.name] = true
		p.list = append(p.list, u)
	}
	return p, nil
}

func parseUpstream(spec string, withPush bool) (*upstream, error) {
	want := "NAME=http://HOST:PORT"
	parts := strings.Split(spec, "=")
	if withPush {
		want += "=DAEMON_HOST:PORT"
	}
	if (withPush && len(parts) != 3) || (!withPush && len(parts) != 2) || parts[0] == "" {
		return nil, fmt.Errorf("%q: want %s", spec, want)
	}
	base, err := url.Parse(parts[1])
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" ||
		base.RawQuery != "" || base.Fragment != "" || base.User != nil {
		return nil, fmt.Errorf("%q: %q is not an http(s) base URL; want %s", spec, parts[1], want)
	}
	u := &upstream{name: parts[0], base: strings.TrimRight(base.String(), "/")}
	if withPush {
		host, port, err := net.SplitHostPort(parts[2])
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%q: daemon address %q: want HOST:PORT (its tcp_addr)", spec, parts[2])
		}
		u.pushTo = parts[2]
	}
	return u, nil
}

// leastLoaded returns the instance with the fewest requests in flight
// among those keep accepts (nil: all), scanning from a rotating start so
// that ties are shared out in turn. It reserves the instance (inflight+1);
// the caller releases it.
func (p *pool) leastLoaded(keep func(*upstream) bool) *upstream {
	start := int(p.next.Add(1) % uint64(len(p.list)))
	var best *upstream
	var low int64
	for i := range p.list {
		u := p.list[(start+i)%len(p.list)]
		if keep != nil && !keep(u) {
			continue
		}
		if n := u.inflight.Load(); best == nil || n < low {
			best, low = u, n
		}
	}
	if best != nil {
		best.inflight.Add(1)
	}
	return best
}

// scoreFunc scores pods for a prompt; the controller's score API's Score.
type scoreFunc func(context.Context, api.ScoreRequest) (api.ScoreResponse, error)

// pickPrefill chooses the prefill instance for a prompt: the highest KV
// score, ties (including "nobody holds anything") broken by load. Without
// a scorable prompt (ok false) or a score — no tokenizer for the model, a
// chat request — it is load and rotation alone. The bool reports whether
// the scorer decided.
func (p *pool) pickPrefill(ctx context.Context, score scoreFunc, req api.ScoreRequest, ok bool) (*upstream, bool) {
	if !ok || score == nil {
		return p.leastLoaded(nil), false
	}
	req.Pods = p.names()
	resp, err := score(ctx, req)
	if err != nil {
		// No tokenizer for the model, a prompt too long to score, or the
		// client gone: routing still works, without the cache's help.
		return p.leastLoaded(nil), false
	}
	top := 0.0
	for _, s := range resp.Scores {
		top = max(top, s)
	}
	if top == 0 {
		return p.leastLoaded(nil), false
	}
	return p.leastLoaded(func(u *upstream) bool { return resp.Scores[u.name] == top }), true
}

func (p *pool) names() []string {
	out := make([]string, len(p.list))
	for i, u := range p.list {
		out[i] = u.name
	}
	return out
}
