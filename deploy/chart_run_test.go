package deploy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	corev1 "k8s.io/api/core/v1"

	"kvtier/internal/redistest"
	"kvtier/internal/servetest"
)

// TestChartRunsHere runs what the chart renders with every option on: a
// real controller on its controller.yaml and a real daemon on its
// kvtier.yaml and environment, with the tokens of the chart's Secret and a
// real Redis standing in for the release's. Only what a Kubernetes node
// would provide differently is replaced: addresses (loopback, free ports;
// the daemon's admin API binds the rendered 0.0.0.0 on a free port),
// paths (temporary directories) and sizes (a small RAM tier, no huge
// pages). The daemon must register with the controller under the node's
// name, with the cluster token, and serve its Redis remote tier.
func TestChartRunsHere(t *testing.T) {
	helmBin(t)
	out, err := helm(t, append([]string{"template", "kv", chartDir}, renders["all"]...)...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	secret := m.secrets["kv-kvtier-tokens"]
	if secret == nil {
		t.Fatal("no tokens Secret rendered")
	}
	rdb := redistest.Start(t)
	dir := t.TempDir()

	// The controller, on its rendered file.
	ctrlYAML := m.configMaps["kv-kvtier-controller"].Data["controller.yaml"]
	listen := freeAddr(t)
	ctrlConf := rewrite(t, ctrlYAML, map[string]any{
		"listen": listen, "grpc_listen": freeAddr(t),
		"index_redis": strings.Replace(mustKey(t, ctrlYAML, "index_redis"), "kv-kvtier-redis:6379", rdb.Addr, 1),
		"pods":        nil, // vLLM pods do not run here
	})
	ctrlFile := filepath.Join(dir, "controller.yaml")
	if err := os.WriteFile(ctrlFile, []byte(ctrlConf), 0o600); err != nil {
		t.Fatal(err)
	}
	d := m.deployments["kv-kvtier-controller"].Spec.Template.Spec.Containers[0]
	token := secret.StringData["cluster-token"]
	args := append([]string{"controller", "--config", ctrlFile}, d.Args[3:]...)
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctrl := exec.Command(bin, args...)
	// The token as the Deployment passes it: a variable from the Secret.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVTIER_") {
			ctrl.Env = append(ctrl.Env, kv)
		}
	}
	for _, e := range d.Env {
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
			ctrl.Env = append(ctrl.Env, e.Name+"="+secret.StringData[r.SecretKeyRef.Key])
		}
	}
	ctrlLog := &servetest.Log{}
	ctrl.Stderr = ctrlLog
	if err := ctrl.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ctrl.Process.Kill(); ctrl.Wait() }()
	waitHTTP(t, "http://"+listen+"/healthz", "", ctrlLog)

	// The daemon: its file and its container's environment, the admin API
	// on the rendered 0.0.0.0 with the admin token from the Secret.
	dm := startChartDaemon(t, m, dir, map[string]any{
		"max_local_disk_size": 0.0625, "local_disk": filepath.Join(dir, "disk"), "controller_url": "http://" + listen,
		"cluster_events_endpoint": "tcp://127.0.0.1:0",
	}, func(e corev1.EnvVar) (string, bool) {
		switch e.Name {
		case "KVTIER_TCP_ADDR":
			return "127.0.0.1:0", true
		case "KVTIER_REMOTE_URL":
			return strings.Replace(e.Value, "kv-kvtier-redis:6379", rdb.Addr, 1), true
		case "KVTIER_INSTANCE_ID":
			return "gpu-node-7", true
		}
		return "", false
	})

	// Registered under the node's name, behind the cluster token.
	waitHTTP(t, "http://"+listen+"/v1/cluster/instances", token, ctrlLog, dm.log, "gpu-node-7")
	resp, err := http.Get("http://" + listen + "/v1/cluster/instances")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("registry without the token: %s, want 401", resp.Status)
	}
	if got := dm.metric(t, secret.StringData["admin-token"], `kvtier_remote_circuit_state{tier="redis"}`); got != "0" {
		t.Errorf("the Redis remote tier's circuit: %q, want 0 (closed)", got)
	}
}

// rewrite decodes a YAML mapping, sets (or, for nil, deletes) keys, and
// encodes it again.
func rewrite(t *testing.T, doc string, set map[string]any) string {
	t.Helper()
	var kv map[string]any
	if err := yaml.Unmarshal([]byte(doc), &kv); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		if v == nil {
			delete(kv, k)
		} else {
			kv[k] = v
		}
	}
	b, err := yaml.Marshal(kv)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustKey(t *testing.T, doc, key string) string {
	t.Helper()
	var kv map[string]any
	if err := yaml.Unmarshal([]byte(doc), &kv); err != nil {
		t.Fatal(err)
	}
	v, ok := kv[key].(string)
	if !ok {
		t.Fatalf("no %s in\n%s", key, doc)
	}
	return v
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitHTTP polls url (with a bearer token when one is given) until it
// answers 200 with a body containing want, for at most 30 s.
func waitHTTP(t *testing.T, url, token string, logs ...any) {
	t.Helper()
	var want string
	var ls []*servetest.Log
	for _, l := range logs {
		switch v := l.(type) {
		case *servetest.Log:
			ls = append(ls, v)
		case string:
			want = v
		}
	}
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = fmt.Sprintf("%s %s", resp.Status, body)
		if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
			return
		}
	}
	for _, l := range ls {
		t.Log(l.String())
	}
	t.Fatalf("%s: gave up waiting for %q; last answer: %s", url, want, last)
}
