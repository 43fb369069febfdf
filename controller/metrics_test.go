package controller

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestControllerMetrics runs a controller with a pod, a registered
// daemon and the proxy, makes a request of each API and reads /metrics:
// each request is counted under its API, route and status, and the
// index, pod, daemon, event and proxy series are there.
func TestControllerMetrics(t *testing.T) {
	p1, d1 := newFakeEngine(t, "p1", "prefill"), newFakeEngine(t, "d1", "decode")
	cfg := validConfig()
	cfg.PrefillInstances, cfg.DecodeInstances = []string{p1.spec()}, []string{d1.spec()}
	addr, logs := runController(t, cfg)
	base := "http://" + addr
	post := func(path, body string) int {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/v1/cluster/register", `{"instance":"daemon-a","addr":"127.0.0.1:1","events":"tcp://127.0.0.1:1","admin":"http://127.0.0.1:1"}`); code != 200 {
		t.Fatalf("register: %d\n%s", code, logs)
	}
	if code := post("/v1/cluster/heartbeat", `{"instance":"daemon-a","session":"wrong"}`); code != 404 {
		t.Fatalf("heartbeat with a wrong session: %d", code)
	}
	if code := post("/v1/score", `{"model":"m","tokens":[1,2,3]}`); code != 200 {
		t.Fatalf("score: %d", code)
	}
	if code := post("/v1/chat/completions", `{"model":"m","messages":[]}`); code != 200 {
		t.Fatalf("proxy: %d", code)
	}
	post("/no/such/path", `{}`)

	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, body)
	}
	for _, want := range []string{
		`kvtier_controller_requests_total{api="cluster",code="200",route="register"} 1`,
		`kvtier_controller_requests_total{api="cluster",code="404",route="heartbeat"} 1`,
		`kvtier_controller_requests_total{api="score",code="200",route="score"} 1`,
		`kvtier_controller_requests_total{api="proxy",code="200",route="chat_completions"} 1`,
		`kvtier_controller_requests_total{api="score",code="404",route="other"} 1`,
		`kvtier_controller_daemons 1`,
		`kvtier_controller_pods 2`, // the subscribed pod and the daemon
		`kvtier_controller_index_blocks 0`,
		`kvtier_controller_index_entries 0`,
		`kvtier_controller_event_messages_total{pod="p"} 0`,
		`kvtier_controller_event_lost_total{pod="p"} 0`,
		`kvtier_controller_proxy_inflight{instance="d1",role="decode"} 0`,
		`kvtier_controller_proxy_inflight{instance="p1",role="prefill"} 0`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// TestDocsListEveryControllerMetric keeps the table of docs/router.md
// true in both directions.
func TestDocsListEveryControllerMetric(t *testing.T) {
	data, err := os.ReadFile("../docs/router.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	ch := make(chan *prometheus.Desc, 64)
	c := &controller{}
	c.newMetrics().requests.Describe(ch)
	(&ctlCollector{c: c}).Describe(ch)
	close(ch)
	names := map[string]bool{}
	for d := range ch {
		name := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())[1]
		names[name] = true
		if !strings.Contains(doc, "| `"+name+"` |") {
			t.Errorf("%s is not in the metrics table of docs/router.md", name)
		}
	}
	for _, m := range regexp.MustCompile("`(kvtier_controller_[a-z_]+)`").FindAllStringSubmatch(doc, -1) {
		if !names[m[1]] {
			t.Errorf("docs/router.md documents %s, which is not exported", m[1])
		}
	}
}
