package deploy

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kvtier/internal/servetest"
	"kvtier/internal/tlstest"
)

// chartDaemon is a `kvtier serve` started on a rendered ConfigMap and
// container environment.
type chartDaemon struct {
	log    *servetest.Log
	admin  string // http://127.0.0.1:<port>: the port the daemon bound
	port   string
	client *http.Client
}

var adminListening = regexp.MustCompile(`msg="admin listening" addr=\S*:(\d+)`)

// startChartDaemon runs the daemon of m's DaemonSet as the kubelet would:
// the rendered kvtier.yaml with the keys in over replaced (nil deletes),
// and the container's KVTIER_ variables in its environment, with each
// Secret reference read from the rendered Secret. env rewrites the values
// a node would provide differently (the pod IP, the node's name). The
// admin_addr is the rendered one with port 0: the daemon binds all
// interfaces, as in the pod, and the test connects to 127.0.0.1 only.
func startChartDaemon(t *testing.T, m *manifests, dir string, over map[string]any, env func(corev1.EnvVar) (string, bool)) *chartDaemon {
	t.Helper()
	secret := m.secrets["kv-kvtier-tokens"]
	ds := m.daemonSets["kv-kvtier-daemon"].Spec.Template.Spec.Containers[0]
	doc := m.configMaps["kv-kvtier-daemon"].Data["kvtier.yaml"]
	host, _, ok := strings.Cut(mustKey(t, doc, "admin_addr"), ":")
	if !ok || host != "0.0.0.0" {
		t.Fatalf("rendered admin_addr %q: the test expects the pod-wide 0.0.0.0:<port>", mustKey(t, doc, "admin_addr"))
	}
	set := map[string]any{"admin_addr": host + ":0", "socket_path": filepath.Join(dir, "kvtier.sock"), "data_dir": dir,
		"max_local_cpu_size": 0.0625, "hugepages": false}
	for k, v := range over {
		set[k] = v
	}
	conf := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(conf, []byte(rewrite(t, doc, set)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, ds.Args...)
	cmd.Args[len(cmd.Args)-1] = conf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVTIER_") && !strings.HasPrefix(kv, "LMCACHE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, e := range ds.Env {
		if !strings.HasPrefix(e.Name, "KVTIER_") {
			continue
		}
		v, ok := env(e)
		switch {
		case ok:
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			v, ok = secret.StringData[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				t.Fatalf("env %s: key %s not in the rendered Secret", e.Name, e.ValueFrom.SecretKeyRef.Key)
			}
		default:
			t.Fatalf("daemon env %s: not handled here", e.Name)
		}
		cmd.Env = append(cmd.Env, e.Name+"="+v)
	}
	d := &chartDaemon{log: &servetest.Log{}, client: http.DefaultClient}
	cmd.Stderr = d.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	for deadline := time.Now().Add(30 * time.Second); d.port == ""; {
		if m := adminListening.FindStringSubmatch(d.log.String()); m != nil {
			d.port = m[1]
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("kvtier serve exited: %v\n%s", err, d.log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvtier serve did not listen:\n%s", d.log)
		}
	}
	d.admin = "http://127.0.0.1:" + d.port
	return d
}

// get sends GET path to the daemon on 127.0.0.1 with the Host header host
// and, when token is not empty, the bearer token; it returns the status,
// the WWW-Authenticate header and the body.
func (d *chartDaemon) get(t *testing.T, path, host, token string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, d.admin+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(body)
}

// metric returns one sample's value from /metrics read with token.
func (d *chartDaemon) metric(t *testing.T, token, sample string) string {
	t.Helper()
	code, _, body := d.get(t, "/metrics", "127.0.0.1:"+d.port, token)
	if code != http.StatusOK {
		t.Fatalf("/metrics with the admin token: %d %s", code, body)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestChartDaemonAdminRunsHere starts the daemon of the default render
// (and of renders with daemon.admin.readOpen and daemon.admin.tlsSecret)
// on its rendered admin address, 0.0.0.0, with the admin token of the
// rendered Secret in KVTIER_ADMIN_TOKEN, as in the pod. The kubelet's
// probes carry the pod IP as Host and no token: they must pass, over
// HTTPS with TLS. /metrics answers Prometheus with the token; without it,
// 401 unless readOpen.
func TestChartDaemonAdminRunsHere(t *testing.T) {
	helmBin(t)
	for _, c := range []struct {
		name      string
		set       string
		readOpen  bool
		tlsSecret bool
	}{
		{name: "default"},
		{name: "readOpen", set: "daemon.admin.readOpen=true", readOpen: true},
		{name: "tls", set: "daemon.admin.tlsSecret=kvtier-admin-tls", tlsSecret: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"template", "kv", chartDir}
			if c.set != "" {
				args = append(args, "--set", c.set)
			}
			out, err := helm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decodeAll(out)
			if err != nil {
				t.Fatal(err)
			}
			token := m.secrets["kv-kvtier-tokens"].StringData["admin-token"]
			if len(token) < 32 {
				t.Fatalf("generated admin token %q: want 32 characters or more", token)
			}
			dir := t.TempDir()
			over := map[string]any{}
			var ca *tlstest.CA
			if c.tlsSecret {
				// The Secret's files, issued here for 127.0.0.1.
				doc := m.configMaps["kv-kvtier-daemon"].Data["kvtier.yaml"]
				if mustKey(t, doc, "admin_tls_cert") != "/etc/kvtier-tls/admin/tls.crt" {
					t.Fatalf("admin_tls_cert not the mounted Secret's tls.crt:\n%s", doc)
				}
				ca = tlstest.NewCA(t, "kvtier test CA")
				cert, key := ca.WriteServer(t, dir, "daemon")
				over["admin_tls_cert"], over["admin_tls_key"] = cert, key
			}
			d := startChartDaemon(t, m, dir, over, func(e corev1.EnvVar) (string, bool) {
				if e.Name == "KVTIER_INSTANCE_ID" {
					return "gpu-node-7", true
				}
				return "", false
			})
			probe := m.daemonSets["kv-kvtier-daemon"].Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet
			if c.tlsSecret {
				if probe.Scheme != corev1.URISchemeHTTPS {
					t.Errorf("probes over %s with admin TLS, want HTTPS", probe.Scheme)
				}
				d.admin = "https://127.0.0.1:" + d.port
				d.client = &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}}
			} else if probe.Scheme != corev1.URISchemeHTTP {
				t.Errorf("probes over %s without admin TLS, want HTTP", probe.Scheme)
			}
			podHost := "10.1.2.3:" + d.port // what the kubelet sends: the pod IP
			for _, path := range []string{"/healthz", "/readyz"} {
				if code, _, body := d.get(t, path, podHost, ""); code != http.StatusOK {
					t.Errorf("probe %s with Host %s: %d %s\n%s", path, podHost, code, body, d.log)
				}
			}
			if code, _, body := d.get(t, "/metrics", podHost, token); code != http.StatusOK || !strings.Contains(body, "kvtier_") {
				t.Errorf("/metrics with the Secret's token, Host %s: %d %.200s", podHost, code, body)
			}
			if code, _, _ := d.get(t, "/metrics", podHost, token+"x"); !c.readOpen && code != http.StatusUnauthorized {
				t.Errorf("/metrics with a wrong token: %d, want 401", code)
			}
			code, auth, body := d.get(t, "/metrics", podHost, "")
			if c.readOpen {
				if code != http.StatusOK || !strings.Contains(body, "kvtier_") {
					t.Errorf("/metrics without a token, readOpen: %d %.200s, want 200", code, body)
				}
			} else if code != http.StatusUnauthorized || !strings.HasPrefix(auth, "Bearer") {
				t.Errorf("/metrics without a token: %d %q, want 401 with WWW-Authenticate: Bearer", code, auth)
			}
			// Mutations need the token whatever readOpen says.
			req, _ := http.NewRequest(http.MethodPost, d.admin+"/api/v1/flush", nil)
			req.Host = podHost
			resp, err := d.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("POST /api/v1/flush without a token: %s, want 401", resp.Status)
			}
			if strings.Contains(d.log.String(), token) {
				t.Errorf("the admin token is in the daemon's log")
			}
		})
	}
}
