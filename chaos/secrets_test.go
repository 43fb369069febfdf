package chaos

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/internal/redistest"
	"kvtier/internal/servetest"
	"kvtier/internal/tlstest"
)

// TestSecretsNeverLogged runs a controller and a daemon at debug level
// with every secret configured — admin, TCP and cluster tokens, a Redis
// URL with a password, a TLS key — makes them log what they log when
// things go wrong (requests with wrong tokens, a Redis that refuses a
// wrong password, a daemon that cannot register), and fails if any
// secret, or a token a client presented, appears in either log.
func TestSecretsNeverLogged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a controller, a daemon and redis-server")
	}
	const (
		adminToken   = "admin-SECRET-4f1c9a"
		tcpToken     = "tcp-SECRET-8b2d7e"
		clusterToken = "cluster-SECRET-c3e5a1"
		redisPass    = "redis-SECRET-9d0f6b"
		wrongToken   = "presented-SECRET-77aa01"
	)
	redis := redistest.StartPassword(t, redisPass)
	bad := redistest.StartPassword(t, redisPass) // given the wrong password below

	dir := t.TempDir()
	ca := tlstest.NewCA(t, "chaos-secrets")
	cert, key := ca.WriteServer(t, dir, "127.0.0.1")
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}

	ctrl := freeAddr(t)
	ctrlConf := filepath.Join(dir, "controller.yaml")
	if err := os.WriteFile(ctrlConf, fmt.Appendf(nil, "cluster_token: %s\nlog_level: debug\n", clusterToken), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startControllerArgs(t, ctrl, "--config", ctrlConf)

	conf := "chunk_size: 16\n" + fmt.Sprintf("log_level: debug\nmax_local_cpu_size: 0.0078125\n"+
		"remote_url: \"redis://:%s@%s/0\"\nadmin_token: %s\ntcp_token: %s\ntcp_tls_cert: %s\ntcp_tls_key: %s\n"+
		"controller_url: http://%s\ncontroller_token: %s\ninstance_id: secrets\ncluster_events_endpoint: tcp://127.0.0.1:0\n",
		redisPass, redis.Addr, adminToken, tcpToken, cert, key, ctrl, clusterToken)
	d := servetest.Start(t, dir, conf)

	// Wrong tokens everywhere a client presents one.
	for _, url := range []string{d.Admin + "/api/v1/stats", "http://" + ctrl + "/v1/cluster/instances"} {
		req, _ := http.NewRequest(http.MethodPost, url, nil)
		req.Header.Set("Authorization", "Bearer "+wrongToken)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	if cl, err := client.DialTCP(ctx, d.TCP, client.Options{Token: wrongToken, TLS: ca.ClientConfig()}); err == nil {
		cl.Close()
		t.Error("a TCP client with a wrong token was let in")
	}

	// A daemon whose controller token is wrong: its registrations fail,
	// and it logs that.
	dir2 := t.TempDir()
	conf2 := "chunk_size: 16\n" + fmt.Sprintf("log_level: debug\nmax_local_cpu_size: 0.0078125\n"+
		"remote_url: \"redis://:%s@%s/0\"\ncontroller_url: http://%s\ncontroller_token: %s\ninstance_id: wrong\ncluster_events_endpoint: tcp://127.0.0.1:0\n",
		redisPass, redis.Addr, ctrl, wrongToken)
	d2 := servetest.Start(t, dir2, conf2)
	c2 := dialUnix(t, d2.Sock, newRun())
	for i := range 8 {
		c2.put(i)
	}
	c2.flush()
	time.Sleep(time.Second) // a few failed registrations

	// A daemon given a wrong Redis password refuses to start, saying why.
	refused := startRefused(t, "chunk_size: 16\n"+fmt.Sprintf("log_level: debug\nremote_url: \"redis://:%s@%s/0\"\n", wrongToken, bad.Addr))

	secrets := map[string]string{"admin_token": adminToken, "tcp_token": tcpToken, "cluster_token": clusterToken,
		"redis password": redisPass, "presented token": wrongToken}
	// The key's base64 body, line by line: any line of it in a log is a leak.
	for _, line := range strings.Split(string(keyPEM), "\n") {
		if len(line) >= 32 && !strings.HasPrefix(line, "-----") {
			secrets["TLS key line"] = line
			if _, err := base64.StdEncoding.DecodeString(line); err != nil && len(line)%4 == 0 {
				t.Fatalf("key line %q is not base64: %v", line, err)
			}
		}
	}
	logs := map[string]string{"daemon": d.Log.String(), "daemon with a wrong controller token": d2.Log.String(),
		"daemon with a wrong Redis password": refused, "controller": c.log.String()}
	for who, log := range logs {
		if len(log) == 0 {
			t.Errorf("the %s logged nothing: the scan would prove nothing", who)
		}
		for what, secret := range secrets {
			if strings.Contains(log, secret) {
				t.Errorf("the %s's log holds the %s:\n%s", who, what, log)
			}
		}
	}
	// The scan must have seen the failures it is about.
	for who, want := range map[string]string{"daemon with a wrong controller token": "cluster registration failed",
		"daemon with a wrong Redis password": "WRONGPASS", "controller": "refused", "daemon": "redis://:xxxxx@"} {
		if !strings.Contains(logs[who], want) {
			t.Errorf("the %s's log lacks %q, so the failure paths did not run:\n%s", who, want, logs[who])
		}
	}
}

// startRefused runs `kvtier serve` on conf, which must make it exit with
// an error, and returns what it wrote.
func startRefused(t *testing.T, conf string) string {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "kvtier.yaml")
	conf += fmt.Sprintf("socket_path: %s\nadmin_addr: 127.0.0.1:0\ntcp_addr: 127.0.0.1:0\ndata_dir: %s\n", filepath.Join(dir, "s.sock"), dir)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--config", path).CombinedOutput()
	if err == nil {
		t.Fatalf("kvtier serve with a wrong Redis password ran:\n%s", out)
	}
	return string(out)
}
