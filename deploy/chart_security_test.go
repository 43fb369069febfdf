package deploy

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvtier/config"
)

// podMonitor is the part of the Prometheus Operator's PodMonitor the chart
// renders; strictDecode refuses any field not listed here.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			Scheme        string `json:"scheme"`
			Authorization struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization"`
			TLSConfig map[string]any `json:"tlsConfig,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// loopbackAddr reports whether a listen address stays on loopback: a
// loopback IP or localhost. An empty host, 0.0.0.0 and :: do not.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// adminOpen returns why the daemon of container c, configured as cfg,
// would refuse to start or would hold its admin token somewhere other
// than a Secret: admin_addr beyond loopback needs admin_token, and the
// chart must pass it as KVTIER_ADMIN_TOKEN from a Secret key.
func adminOpen(cfg config.Config, c corev1.Container) error {
	if loopbackAddr(cfg.AdminAddr) {
		return nil
	}
	if cfg.AdminToken == "" {
		return fmt.Errorf("admin_addr %s beyond loopback without admin_token: the daemon refuses to start", cfg.AdminAddr)
	}
	for _, e := range c.Env {
		if e.Name == "KVTIER_ADMIN_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return nil
		}
	}
	return errors.New("admin_token is not KVTIER_ADMIN_TOKEN from a Secret")
}

// TestChartAdminNeverOpen renders the chart with each values file and
// more combinations of the options that touch the daemon's admin API, and
// fails if any renders the admin API beyond loopback without the token
// from a Secret, or puts a token into the daemon's ConfigMap. It first
// shows that the check catches a chart that drops the token.
func TestChartAdminNeverOpen(t *testing.T) {
	helmBin(t)
	out, err := helm(t, "template", "kv", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	// The chart as it was before the admin token: the same manifests
	// without the variable.
	broken := strings.Replace(out, "- name: KVTIER_ADMIN_TOKEN\n", "- name: NOT_A_KVTIER_VARIABLE\n", 1)
	if broken == out {
		t.Fatal("the default render has no KVTIER_ADMIN_TOKEN")
	}
	if errs := adminProblems(t, broken); len(errs) == 0 {
		t.Fatal("a daemon on 0.0.0.0 without admin_token passed the check")
	}
	sets := [][]string{nil}
	for _, args := range renders {
		sets = append(sets, args)
	}
	for _, s := range []string{
		"tokens.adminToken=from-values", "tokens.existingSecret=mine", "daemon.admin.port=9000",
		"daemon.admin.readOpen=true", "daemon.admin.tlsSecret=t", "daemon.tcp.enabled=true,tokens.tcpToken=x",
	} {
		sets = append(sets, []string{"--set", s})
	}
	for _, args := range sets {
		out, err := helm(t, append([]string{"template", "kv", chartDir}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range adminProblems(t, out) {
			t.Errorf("%v: %v", args, e)
		}
	}
}

// adminProblems loads each rendered daemon's configuration as the daemon
// would and returns what adminOpen finds, and any token key written into
// its ConfigMap.
func adminProblems(t *testing.T, out string) []error {
	t.Helper()
	m, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for name, ds := range m.daemonSets {
		c := ds.Spec.Template.Spec.Containers[0]
		doc := m.configMaps[ds.Spec.Template.Spec.Volumes[0].ConfigMap.Name].Data["kvtier.yaml"]
		for _, key := range []string{"admin_token", "tcp_token", "controller_token"} {
			if strings.Contains(doc, "\n"+key+":") || strings.HasPrefix(doc, key+":") {
				errs = append(errs, fmt.Errorf("%s: %s written into the ConfigMap", name, key))
			}
		}
		cfg, err := config.FromEnv(append(containerEnv(c), "KVTIER_CONFIG_FILE="+writeTemp(t, doc)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", name, err))
			continue
		}
		if err := adminOpen(cfg, c); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", name, err))
		}
	}
	return errs
}

// checkPodMonitors checks each PodMonitor scrapes the daemons' admin port
// with the Secret key their KVTIER_ADMIN_TOKEN reads, over https exactly
// when the admin API serves TLS, and verifies the server when it does.
func checkPodMonitors(t *testing.T, m *manifests) {
	t.Helper()
	ds := m.daemonSets["kv-kvtier-daemon"]
	for _, pm := range m.monitors {
		if ds == nil {
			t.Fatalf("PodMonitor %s without a daemon", pm.Name)
		}
		if !selects(pm.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
			t.Errorf("PodMonitor %s selects no daemon pods", pm.Name)
		}
		c := ds.Spec.Template.Spec.Containers[0]
		var tokenRef *corev1.SecretKeySelector
		for _, e := range c.Env {
			if e.Name == "KVTIER_ADMIN_TOKEN" && e.ValueFrom != nil {
				tokenRef = e.ValueFrom.SecretKeyRef
			}
		}
		tls := strings.Contains(m.configMaps["kv-kvtier-daemon"].Data["kvtier.yaml"], "admin_tls_cert:")
		for _, ep := range pm.Spec.Endpoints {
			if !hasPort(&ds.Spec.Template, ep.Port) || ep.Path != "/metrics" {
				t.Errorf("PodMonitor %s: scrapes %s %s, not the admin port's /metrics", pm.Name, ep.Port, ep.Path)
			}
			cred := ep.Authorization.Credentials
			if ep.Authorization.Type != "Bearer" || tokenRef == nil || cred.Name != tokenRef.Name || cred.Key != tokenRef.Key {
				t.Errorf("PodMonitor %s: credentials %+v, want the daemon's admin token %+v", pm.Name, cred, tokenRef)
			}
			if want := map[bool]string{true: "https", false: "http"}[tls]; ep.Scheme != want {
				t.Errorf("PodMonitor %s: scheme %s, want %s", pm.Name, ep.Scheme, want)
			}
			if tls && len(ep.TLSConfig) == 0 {
				t.Errorf("PodMonitor %s: https without a tlsConfig sends the token to an unverified server", pm.Name)
			}
		}
	}
}

// writeTemp writes doc to a file of its own and returns its path.
func writeTemp(t *testing.T, doc string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "kvtier-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(doc); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
