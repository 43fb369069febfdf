package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"kvtier/config"
	"kvtier/controller"
)

// controllerTLSRender turns on the controller's TLS, on its HTTP and gRPC
// ports, with daemons that join it.
var controllerTLSRender = []string{"--set", "controller.tls.secret=kvtier-controller-tls,controller.tls.grpc=true," +
	"controller.grpcPort=9002,daemon.tcp.enabled=true,daemon.joinController=true,tokens.tcpToken=tcp-secret-for-tests"}

// TestChartControllerTLS renders the chart with the controller's TLS and
// checks what TestChart's generic checks do not: the controller serves
// both ports from the mounted Secret's pair, its probes are HTTPS, and
// the daemons reach it at https:// trusting the Secret's CA item alone.
func TestChartControllerTLS(t *testing.T) {
	helmBin(t)
	out, err := helm(t, append([]string{"template", "kv", chartDir, "--namespace", "llm"}, controllerTLSRender...)...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	var ctrlSeen, daemonSeen bool
	for name, d := range m.deployments {
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		if c.Args[0] != "controller" {
			continue
		}
		ctrlSeen = true
		cfg := controller.Default()
		cm := m.configMaps[spec.Volumes[0].ConfigMap.Name]
		if err := cfg.Decode([]byte(cm.Data["controller.yaml"]), cm.Name); err != nil {
			t.Fatal(err)
		}
		const dir = "/etc/kvtier-tls/controller/"
		if cfg.TLSCert != dir+"tls.crt" || cfg.TLSKey != dir+"tls.key" || cfg.GRPCTLSCert != cfg.TLSCert || cfg.GRPCTLSKey != cfg.TLSKey {
			t.Errorf("%s: TLS files %q %q, gRPC %q %q", name, cfg.TLSCert, cfg.TLSKey, cfg.GRPCTLSCert, cfg.GRPCTLSKey)
		}
		if !mounted(c, strings.TrimSuffix(dir, "/")) || secretVolume(spec.Volumes, "kvtier-controller-tls") == "" {
			t.Errorf("%s: the Secret is not mounted at %s", name, dir)
		}
		for _, p := range []string{string(c.LivenessProbe.HTTPGet.Scheme), string(c.ReadinessProbe.HTTPGet.Scheme)} {
			if p != "HTTPS" {
				t.Errorf("%s: probe scheme %s, want HTTPS", name, p)
			}
		}
	}
	for name, ds := range m.daemonSets {
		daemonSeen = true
		spec := ds.Spec.Template.Spec
		c := spec.Containers[0]
		cm := m.configMaps[spec.Volumes[0].ConfigMap.Name]
		file := filepath.Join(t.TempDir(), "kvtier.yaml")
		if err := os.WriteFile(file, []byte(cm.Data["kvtier.yaml"]), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.FromEnv(append(containerEnv(c), "KVTIER_CONFIG_FILE="+file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(cfg.ControllerURL, "https://kv-kvtier-controller:") {
			t.Errorf("%s: controller_url %q, want https://", name, cfg.ControllerURL)
		}
		env := map[string]string{}
		for _, kv := range containerEnv(c) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		if env["SSL_CERT_DIR"] != "/etc/kvtier-tls/controller-ca" || !mounted(c, env["SSL_CERT_DIR"]) {
			t.Errorf("%s: SSL_CERT_DIR %q, not the mounted CA", name, env["SSL_CERT_DIR"])
		}
		for _, v := range spec.Volumes {
			if v.Secret == nil || v.Secret.SecretName != "kvtier-controller-tls" {
				continue
			}
			if len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "ca.crt" {
				t.Errorf("%s: the daemons mount %+v of the controller's Secret, want its ca.crt alone", name, v.Secret.Items)
			}
		}
	}
	if !ctrlSeen || !daemonSeen {
		t.Fatalf("rendered controller %v, daemon %v", ctrlSeen, daemonSeen)
	}
}

// secretVolume returns the name of the volume of vols that is Secret
// secret, or "".
func secretVolume(vols []corev1.Volume, secret string) string {
	for _, v := range vols {
		if v.Secret != nil && v.Secret.SecretName == secret {
			return v.Name
		}
	}
	return ""
}
