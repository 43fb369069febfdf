package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/cluster"
	"kvtier/internal/servetest"
	"kvtier/internal/tlstest"
)

// runToExit runs kvtier with args and returns its exit error and stderr;
// it must exit within hang.
func runToExit(t *testing.T, env []string, args ...string) (error, string) {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "KVTIER_SOCKET_PATH="+filepath.Join(t.TempDir(), "s.sock"))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("kvtier %v did not exit within %v:\n%s", args, hang, out)
	}
	return err, string(out)
}

// TestOpenBindsAreRefused: the daemon's admin API and the controller
// refuse to start on a wildcard address without their token, naming it.
func TestOpenBindsAreRefused(t *testing.T) {
	err, out := runToExit(t, []string{"KVTIER_ADMIN_ADDR=0.0.0.0:0"}, "serve")
	if err == nil || !strings.Contains(out, "admin_token") || !strings.Contains(out, "beyond loopback") {
		t.Errorf("serve on 0.0.0.0 without admin_token: %v\n%s", err, out)
	}
	err, out = runToExit(t, nil, "controller", "--listen", "0.0.0.0:0", "--hash-seed", "0")
	if err == nil || !strings.Contains(out, "cluster_token") || !strings.Contains(out, "beyond loopback") {
		t.Errorf("controller on 0.0.0.0 without cluster_token: %v\n%s", err, out)
	}
}

// securedHolders is holders with the cluster token.
func securedHolders(ctrl, token, instance string, keys []uint64) map[uint64]int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs, err := cluster.NewClient("http://"+ctrl, nil).WithToken(token).Lookup(ctx, keys)
	if err != nil {
		return nil
	}
	out := map[uint64]int{}
	for i, list := range hs {
		for _, h := range list {
			if h.Instance == instance {
				out[keys[i]]++
			}
		}
	}
	return out
}

// TestTokensAcrossTheCluster runs a controller with a cluster_token and a
// daemon with an admin_token and the controller's token: the daemon
// registers, a controller restart makes the controller ask the daemon for
// a resync through its guarded admin API (with the cluster token), and a
// cluster operation reaches the daemon the same way. Without the token
// the daemon refuses the same request.
func TestTokensAcrossTheCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a controller and a daemon")
	}
	const ctlToken, admToken = "ctl-token-123", "adm-token-456"
	ctrl := freePort(t)
	c := startController(t, ctrl, "--cluster-token", ctlToken)
	d, sock := clusterDaemonWith(t, ctrl, "d1",
		fmt.Sprintf("admin_token: %s\nadmin_read_open: true\ncontroller_token: %s\n", admToken, ctlToken))
	storeChunks(t, sock, 0, 4)
	var keys []uint64
	waitFor(t, "the daemon's disk writes", func() bool {
		keys = keysOf(inventory(t, d))
		return len(keys) == 4
	}, d.stderr)
	waitFor(t, "the controller to see the chunks", func() bool {
		return len(securedHolders(ctrl, ctlToken, "d1", keys)) == 4
	}, c.stderr, d.stderr)

	// A new controller knows nothing: only the resync it asks for, which
	// the daemon's admin API accepts with the cluster token, brings the
	// chunks back (they were stored before, so no stream message will).
	c.kill(t)
	c = startController(t, ctrl, "--cluster-token", ctlToken)
	waitFor(t, "the index to come back by resync", func() bool {
		return len(securedHolders(ctrl, ctlToken, "d1", keys)) == 4
	}, c.stderr, d.stderr)
	if strings.Contains(d.stderr.String(), "admin request refused") || strings.Contains(c.stderr.String(), "resync request failed") {
		t.Fatalf("a resync was refused:\n%s\n%s", c.stderr, d.stderr)
	}

	// A cluster operation: the controller calls the daemon's guarded
	// clear with the cluster token.
	op, ok := clusterCLI(t, ctrl, "clear", "--instance", "d1", "--token", ctlToken)
	if counts := mustOK(t, op, ok, "d1"); counts["removed_mem"] != 4 {
		t.Fatalf("cluster clear removed %v, want 4 from mem", counts)
	}
	// The same request to the daemon without a token is refused.
	resp, err := http.Post(d.url+cluster.DaemonClearPath, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("cluster clear without a token = %d, want 401", resp.StatusCode)
	}
	for _, l := range []*servetest.Log{c.stderr, d.stderr} {
		for _, secret := range []string{ctlToken, admToken} {
			if strings.Contains(l.String(), secret) {
				t.Fatalf("a token was logged:\n%s", l)
			}
		}
	}
	d.stop(t)
}

// TestTLSReloadOnSIGHUP runs a daemon with TLS on its admin API and its
// TCP protocol, replaces both certificates, sends SIGHUP and checks that
// the new ones are served by the same process.
func TestTLSReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "kvtier test CA")
	adminCert, adminKey := ca.WriteServer(t, dir, "admin-1")
	tcpCert, tcpKey := ca.WriteServer(t, dir, "tcp-1")
	conf := fmt.Sprintf("admin_addr: 127.0.0.1:0\nadmin_tls_cert: %s\nadmin_tls_key: %s\n"+
		"tcp_addr: 127.0.0.1:0\ntcp_tls_cert: %s\ntcp_tls_key: %s\nmax_local_cpu_size: 0.01\ndata_dir: %s\n",
		adminCert, adminKey, tcpCert, tcpKey, dir)
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir, "KVTIER_SOCKET_PATH="+filepath.Join(dir, "s.sock"))
	logs := &servetest.Log{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	var adminAddr, tcpAddr string
	waitFor(t, "the daemon to listen", func() bool {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			adminAddr = m[1]
		}
		if _, rest, ok := strings.Cut(logs.String(), `msg="tcp protocol listening" addr=`); ok {
			tcpAddr, _, _ = strings.Cut(rest, " ")
		}
		return adminAddr != "" && tcpAddr != ""
	}, logs)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
	resp, err := client.Get("https://" + adminAddr + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz over TLS: %v %v\n%s", resp, err, logs)
	}
	resp.Body.Close()
	if cn := tlstest.PeerCN(t, adminAddr, ca.ClientConfig()); cn != "admin-1" {
		t.Fatalf("admin serves %q", cn)
	}
	if cn := tlstest.PeerCN(t, tcpAddr, ca.ClientConfig()); cn != "tcp-1" {
		t.Fatalf("tcp serves %q", cn)
	}

	// Renew both pairs in place, as a certificate manager would.
	for _, p := range []struct{ cn, cert, key string }{{"admin-2", adminCert, adminKey}, {"tcp-2", tcpCert, tcpKey}} {
		c, k := ca.WriteServer(t, t.TempDir(), p.cn)
		for _, mv := range [][2]string{{c, p.cert}, {k, p.key}} {
			data, err := os.ReadFile(mv[0])
			if err != nil {
				t.Fatal(err)
			}
			tlstest.WriteFile(t, mv[1], data)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both listeners to serve the new certificates", func() bool {
		return tlstest.PeerCN(t, adminAddr, ca.ClientConfig()) == "admin-2" &&
			tlstest.PeerCN(t, tcpAddr, ca.ClientConfig()) == "tcp-2"
	}, logs)
	select {
	case err := <-exited:
		t.Fatalf("the daemon exited after SIGHUP: %v\n%s", err, logs)
	default:
	}
	// A broken renewal keeps the certificate that works.
	tlstest.WriteFile(t, adminCert, []byte("not a certificate"))
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, "the failed reload to be logged", func() bool {
		return strings.Contains(logs.String(), "the previous one keeps serving")
	}, logs)
	if cn := tlstest.PeerCN(t, adminAddr, ca.ClientConfig()); cn != "admin-2" {
		t.Fatalf("after a bad renewal the admin API serves %q", cn)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs)
		}
	case <-time.After(hang):
		t.Fatal("daemon did not stop")
	}
}

// TestDocsSelfSignedExample runs the openssl commands of docs/security.md
// as written and serves the admin API with the certificate they make: the
// documented example works, and a client trusting only its CA connects.
func TestDocsSelfSignedExample(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("openssl is not installed; the docs' TLS example needs it in CI")
		}
		t.Skip("openssl is not installed")
	}
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "### A self-signed example")
	if !ok {
		t.Fatal("docs/security.md has no self-signed example")
	}
	_, rest, _ = strings.Cut(rest, "```sh\n")
	script, _, _ := strings.Cut(rest, "```")
	dir := t.TempDir()
	sh := exec.Command("bash", "-e", "-c", script)
	sh.Dir = dir
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("the documented commands failed: %v\n%s", err, out)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	conf := fmt.Sprintf("admin_addr: 127.0.0.1:0\nadmin_token: a-long-random-string\nadmin_tls_cert: %s\nadmin_tls_key: %s\n"+
		"max_local_cpu_size: 0.01\ndata_dir: %s\n", filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key"), dir)
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, stop := startTLSDaemon(t, path)
	defer stop()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("GET", "https://"+addr+"/api/v1/stats", nil)
	req.Header.Set("Authorization", "Bearer a-long-random-string")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stats over the documented TLS setup = %d", resp.StatusCode)
	}
}

// startTLSDaemon runs `kvtier serve --config path` and returns the admin
// address it logs and a function that stops it.
func startTLSDaemon(t *testing.T, path string) (string, func()) {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "serve", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir, "KVTIER_SOCKET_PATH="+filepath.Join(dir, "s.sock"))
	logs := &servetest.Log{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	var addr string
	waitFor(t, "the daemon to listen", func() bool {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, logs)
	return addr, func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
}
