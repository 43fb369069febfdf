package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// maxReplyBytes bounds the replies the operations' clients read: an
// operation's status lists at most MaxOpTargets daemons, and the list of
// recent operations a few hundred of those.
const maxReplyBytes = 64 << 20

// StartOp asks the controller to start an operation and returns its id.
func (c *Client) StartOp(ctx context.Context, r OpRequest) (string, error) {
	var out OpStarted
	err := c.call(ctx, http.MethodPost, "/v1/cluster/ops", r, http.StatusAccepted, &out)
	return out.ID, err
}

// Op returns an operation's status.
func (c *Client) Op(ctx context.Context, id string) (Op, error) {
	var out Op
	err := c.call(ctx, http.MethodGet, "/v1/cluster/ops/"+url.PathEscape(id), nil, http.StatusOK, &out)
	return out, err
}

// Ops returns the recent operations, newest first.
func (c *Client) Ops(ctx context.Context) ([]Op, error) {
	var out OpList
	err := c.call(ctx, http.MethodGet, "/v1/cluster/ops", nil, http.StatusOK, &out)
	return out.Ops, err
}

// Instances lists the registered daemons.
func (c *Client) Instances(ctx context.Context) ([]Instance, error) {
	var out struct {
		Instances []Instance `json:"instances"`
	}
	err := c.call(ctx, http.MethodGet, "/v1/cluster/instances", nil, http.StatusOK, &out)
	return out.Instances, err
}

// call asks the replica asked first only: an operation is remembered by the
// replica that started it.
func (c *Client) call(ctx context.Context, method, path string, in any, want int, out any) error {
	return callJSON(ctx, c.hc, method, c.Current()+path, in, want, out)
}

// CallDaemon POSTs in to a daemon's admin API (base URL admin, path one
// of the Daemon*Path) and decodes its 200 reply into out.
func CallDaemon(ctx context.Context, hc *http.Client, admin, path string, in any, out *DaemonReply) error {
	return callJSON(ctx, hc, http.MethodPost, strings.TrimRight(admin, "/")+path, in, http.StatusOK, out)
}

// callJSON sends in (nil: no body) and decodes a reply of status want
// into out; another status is an error carrying the server's message.
func callJSON(ctx context.Context, hc *http.Client, method, url string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(msg, &e) == nil && e.Error != "" {
			msg = []byte(e.Error)
		}
		return fmt.Errorf("cluster: %s %s: %s: %s", method, req.URL.Path, resp.Status, bytes.TrimSpace(msg))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxReplyBytes)).Decode(out); err != nil {
		return fmt.Errorf("cluster: %s %s: decoding the reply: %w", method, req.URL.Path, err)
	}
	return nil
}
