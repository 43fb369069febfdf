package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
)

// ErrUnknown is returned by Heartbeat when the controller does not know
// the session (it restarted, or dropped the daemon): register again.
var ErrUnknown = errors.New("cluster: the controller does not know this instance")

// Client talks to a controller's registry API: one controller, or
// several replicas sharing one registry (docs/cluster.md, "High
// availability"), of which it asks one at a time.
type Client struct {
	bases []string
	cur   atomic.Int32 // the replica that answered last
	hc    *http.Client
}

// NewClient returns a client of the controller at base
// ("http://host:port"); hc nil means http.DefaultClient. Bound each
// call with its context.
func NewClient(base string, hc *http.Client) *Client {
	return NewFailoverClient([]string{base}, hc)
}

// NewFailoverClient returns a client of the controller replicas at
// bases (at least one). A call goes to the replica that answered last;
// when it cannot be reached or answers 5xx, the call is tried on the
// next ones in turn, within the call's context, and the first that
// answers becomes the one asked first.
func NewFailoverClient(bases []string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	c := &Client{hc: hc}
	for _, b := range bases {
		c.bases = append(c.bases, strings.TrimRight(b, "/"))
	}
	return c
}

// Current returns the base URL of the replica asked first.
func (c *Client) Current() string {
	if len(c.bases) == 0 {
		return ""
	}
	return c.bases[int(c.cur.Load())%len(c.bases)]
}

// Register registers a daemon.
func (c *Client) Register(ctx context.Context, r Register) (Registered, error) {
	var out Registered
	err := c.post(ctx, "/v1/cluster/register", r, &out)
	return out, err
}

// Heartbeat tells the controller the daemon is alive; ErrUnknown means
// register again.
func (c *Client) Heartbeat(ctx context.Context, instance, session string) error {
	return c.post(ctx, "/v1/cluster/heartbeat", Heartbeat{Instance: instance, Session: session}, nil)
}

// Deregister removes the daemon and its chunks from the cluster.
func (c *Client) Deregister(ctx context.Context, instance, session string) error {
	return c.post(ctx, "/v1/cluster/deregister", Heartbeat{Instance: instance, Session: session}, nil)
}

// Lookup returns, for each of keys (chunk.Key.Index values), the daemons
// and tiers holding it, in the order of keys; a key nobody holds has no
// holders. Holders sharing a daemon share its strings.
func (c *Client) Lookup(ctx context.Context, keys []uint64) ([][]Holder, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if len(keys) > MaxLookupKeys {
		return nil, fmt.Errorf("cluster: lookup of %d keys, more than %d", len(keys), MaxLookupKeys)
	}
	body := make([]byte, 0, 16+len(keys)*19)
	body = append(body, `{"keys":[`...)
	for i, k := range keys {
		if i > 0 {
			body = append(body, ',')
		}
		body = AppendHexKey(body, k)
	}
	body = append(body, "]}"...)
	var reply LookupReply
	if err := c.do(ctx, "/v1/cluster/lookup", body, &reply); err != nil {
		return nil, err
	}
	return reply.Resolve(len(keys))
}

// Resolve turns a reply into holders per key, checking it answers n keys
// and names only daemons it lists.
func (r *LookupReply) Resolve(n int) ([][]Holder, error) {
	if len(r.Holders) != n {
		return nil, fmt.Errorf("cluster: lookup answered %d keys, asked %d", len(r.Holders), n)
	}
	out := make([][]Holder, n)
	for i, hs := range r.Holders {
		if len(hs) == 0 {
			continue
		}
		out[i] = make([]Holder, len(hs))
		for j, h := range hs {
			if h.Daemon < 0 || h.Daemon >= len(r.Daemons) {
				return nil, fmt.Errorf("cluster: lookup names daemon %d of %d", h.Daemon, len(r.Daemons))
			}
			d := r.Daemons[h.Daemon]
			out[i][j] = Holder{Instance: d.Instance, Addr: d.Addr, Tier: h.Tier}
		}
	}
	return out, nil
}

func (c *Client) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return c.do(ctx, path, body, out)
}

// do posts body to the replica that answered last, failing over to the
// others in turn while the error is the replica's (unreachable, 5xx),
// not the request's; see post1 for the reply.
func (c *Client) do(ctx context.Context, path string, body []byte, out any) error {
	start := int(c.cur.Load())
	var errs []error
	for i := range c.bases {
		at := (start + i) % len(c.bases)
		err := c.post1(ctx, c.bases[at], path, body, out)
		if err == nil || !failover(err) {
			c.cur.Store(int32(at))
			return err
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return errors.New("cluster: no controller URL")
	}
	return errors.Join(errs...)
}

// replicaError is a failure of the replica rather than of the request:
// another replica may answer.
type replicaError struct{ err error }

func (e replicaError) Error() string { return e.err.Error() }
func (e replicaError) Unwrap() error { return e.err }

func failover(err error) bool {
	var re replicaError
	return errors.As(err, &re)
}

// post1 posts body to one replica and decodes a 200 reply into out (if
// not nil). A 404 is ErrUnknown; other statuses carry the controller's
// message.
func (c *Client) post1(ctx context.Context, base, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return replicaError{fmt.Errorf("cluster: %s%s: %w", base, path, err)}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%w (%s)", ErrUnknown, path)
	case resp.StatusCode != http.StatusOK:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("cluster: %s%s: %s: %s", base, path, resp.Status, bytes.TrimSpace(msg))
		if resp.StatusCode >= 500 {
			return replicaError{err}
		}
		return err
	case out == nil:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil
	}
	// Replies are trusted no more than requests: bounded and strict.
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("cluster: %s: decoding the reply: %w", path, err)
	}
	return nil
}
