package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	k8sjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"kvtier/config"
	"kvtier/controller"
	"kvtier/internal/citest"
)

const chartDir = "helm/kvtier"

// renders are the values files the chart is checked with: the defaults,
// every option on, and the external-Redis/existing-Secret branches.
var renders = map[string][]string{
	"default":  nil,
	"all":      {"-f", chartDir + "/ci/all-values.yaml"},
	"external": {"-f", chartDir + "/ci/external-values.yaml"},
	// Each part alone, and the branches the files above do not take.
	"no-daemon":      {"--set", "daemon.enabled=false"},
	"no-controller":  {"--set", "controller.enabled=false"},
	"policies":       {"--set", "networkPolicy.enabled=true"},
	"external-plain": {"--set", "redis.externalURL=redis://redis.example:6379,controller.replicas=2,daemon.redisRemoteTier.enabled=true"},
	"admin-tls": {"--set", "daemon.admin.tlsSecret=kvtier-admin-tls,daemon.admin.readOpen=true,daemon.metrics.podMonitor.enabled=true," +
		"daemon.metrics.podMonitor.tlsConfig.ca.secret.name=kvtier-admin-tls,daemon.metrics.podMonitor.tlsConfig.ca.secret.key=ca.crt"},
	"controller-tls": controllerTLSRender,
}

// helmBin finds helm (installed by .ci/run from the Go module proxy).
func helmBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("helm")
	if err != nil {
		citest.Missing(t, "helm not on PATH (go install helm.sh/helm/v3/cmd/helm@v3.22.0)")
	}
	return bin
}

// helm runs helm with args and returns its standard output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	// A private home: nothing of the user's helm configuration counts.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// manifests is a rendered chart, decoded.
type manifests struct {
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	services    []*corev1.Service
	deployments map[string]*appsv1.Deployment
	daemonSets  map[string]*appsv1.DaemonSet
	policies    []*netv1.NetworkPolicy
	monitors    []*podMonitor
}

// decodeAll splits a multi-document YAML stream and decodes each document
// strictly into its Kubernetes type: a field the type does not have (a
// typo, a field at the wrong level) or a value of the wrong type is an
// error, as a kind the chart is not expected to render is.
func decodeAll(stream string) (*manifests, error) {
	m := &manifests{configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		deployments: map[string]*appsv1.Deployment{}, daemonSets: map[string]*appsv1.DaemonSet{}}
	var errs []error
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(stream, -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal([]byte(doc), &head); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i, err))
			continue
		}
		if head.Kind == "" {
			continue // only comments
		}
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1 Secret":
			obj = &corev1.Secret{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "apps/v1 Deployment":
			obj = &appsv1.Deployment{}
		case "apps/v1 DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "networking.k8s.io/v1 NetworkPolicy":
			obj = &netv1.NetworkPolicy{}
		case "monitoring.coreos.com/v1 PodMonitor":
			obj = &podMonitor{}
		default:
			errs = append(errs, fmt.Errorf("document %d: unexpected %s %s", i, head.APIVersion, head.Kind))
			continue
		}
		if err := strictDecode(doc, obj); err != nil {
			errs = append(errs, fmt.Errorf("document %d (%s): %w", i, head.Kind, err))
			continue
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			m.configMaps[o.Name] = o
		case *corev1.Secret:
			m.secrets[o.Name] = o
		case *corev1.Service:
			m.services = append(m.services, o)
		case *appsv1.Deployment:
			m.deployments[o.Name] = o
		case *appsv1.DaemonSet:
			m.daemonSets[o.Name] = o
		case *netv1.NetworkPolicy:
			m.policies = append(m.policies, o)
		case *podMonitor:
			m.monitors = append(m.monitors, o)
		}
	}
	return m, errors.Join(errs...)
}

// TestChart lints and renders the chart with each values file, decodes
// every manifest strictly, checks that references between them hold and
// that the workloads are hardened, and loads the rendered daemon and
// controller configurations with kvtier's own loaders.
func TestChart(t *testing.T) {
	helmBin(t)
	for name, args := range renders {
		t.Run(name, func(t *testing.T) {
			if _, err := helm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
				t.Fatal(err)
			}
			out, err := helm(t, append([]string{"template", "kv", chartDir, "--namespace", "llm"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decodeAll(out)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.daemonSets) > 1 || len(m.daemonSets)+len(m.deployments) == 0 {
				t.Fatalf("rendered %d DaemonSets, %d Deployments", len(m.daemonSets), len(m.deployments))
			}
			checkWorkloads(t, m)
			checkDaemonConfig(t, m)
			checkControllerConfig(t, m)
			checkPodMonitors(t, m)
		})
	}
}

// TestChartRefusals checks the chart refuses the combinations that cannot
// work, at render time rather than in a crash-looping pod.
func TestChartRefusals(t *testing.T) {
	helmBin(t)
	for set, want := range map[string]string{
		"controller.replicas=2":                                           "needs a shared index",
		"daemon.tcp.enabled=true":                                         "needs a token",
		"daemon.joinController=true":                                      "needs daemon.tcp.enabled",
		"daemon.disk.enabled=true,daemon.disk.volume=nfs":                 "want hostPath or ephemeral",
		"daemon.admin.tlsSecret=t,daemon.metrics.podMonitor.enabled=true": "needs daemon.metrics.podMonitor.tlsConfig",
		"controller.tls.grpc=true":                                        "needs controller.tls.secret",
	} {
		_, err := helm(t, "template", "kv", chartDir, "--set", set)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: got %v, want an error with %q", set, err, want)
		}
	}
}

// TestDecodeCatchesTypos checks the strict decoding this file relies on
// fails on a misspelt field, a field at the wrong level and a bad quantity.
func TestDecodeCatchesTypos(t *testing.T) {
	helmBin(t)
	out, err := helm(t, "template", "kv", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{"containerPort:", "containerPorts:"},
		{"readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"},
		{"memory: 10Gi", "memory: 10 gigs"},
		{"periodSeconds: 5", "periodSeconds: \"5\""},
		{"    spec:\n", "    spec:\n      hostNetwork: true\n      hostNetwork: false\n"},
	} {
		if !strings.Contains(out, c.from) {
			t.Fatalf("rendered chart has no %q", c.from)
		}
		if _, err := decodeAll(strings.Replace(out, c.from, c.to, 1)); err == nil {
			t.Errorf("%q for %q decoded without error", c.to, c.from)
		}
	}
}

// strictDecode decodes one YAML document as the API server's strict field
// validation does: field names are case-sensitive, and unknown or
// duplicated fields are errors.
func strictDecode(doc string, obj any) error {
	js, err := sigsyaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return err
	}
	strict, err := k8sjson.UnmarshalStrict(js, obj)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// podSpecs returns every workload's pod template by name.
func podSpecs(m *manifests) map[string]*corev1.PodTemplateSpec {
	pods := map[string]*corev1.PodTemplateSpec{}
	for n, d := range m.deployments {
		pods[n] = &d.Spec.Template
	}
	for n, d := range m.daemonSets {
		pods[n] = &d.Spec.Template
	}
	return pods
}

// checkWorkloads checks, for each pod template: its selector matches it,
// every mount names a volume, every named probe port is a container port,
// every ConfigMap it mounts is rendered, every Secret it reads is rendered
// or one the values name as existing, and its containers run non-root on a
// read-only root without privilege escalation (the chown init container
// alone runs as root, with CAP_CHOWN only). Each Service must select pods
// and name ports they have.
func checkWorkloads(t *testing.T, m *manifests) {
	t.Helper()
	external := map[string]bool{"kvtier-tokens": true, "kvtier-redis": true} // ci/external-values.yaml
	pods := podSpecs(m)
	for name, p := range pods {
		volumes := map[string]corev1.Volume{}
		for _, v := range p.Spec.Volumes {
			volumes[v.Name] = v
			if v.ConfigMap != nil && m.configMaps[v.ConfigMap.Name] == nil {
				t.Errorf("%s: volume %s mounts ConfigMap %s, not rendered", name, v.Name, v.ConfigMap.Name)
			}
		}
		if p.Spec.SecurityContext == nil || p.Spec.SecurityContext.RunAsNonRoot == nil || !*p.Spec.SecurityContext.RunAsNonRoot {
			t.Errorf("%s: pod not runAsNonRoot", name)
		}
		all := append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
		for _, c := range all {
			where := name + "/" + c.Name
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: want readOnlyRootFilesystem and no privilege escalation: %+v", where, sc)
			}
			if sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 &&
				(c.Name != "chown" || sc.Capabilities == nil || len(sc.Capabilities.Add) != 1 || sc.Capabilities.Add[0] != "CHOWN") {
				t.Errorf("%s: runs as root", where)
			}
			for _, vm := range c.VolumeMounts {
				if _, ok := volumes[vm.Name]; !ok {
					t.Errorf("%s: mount %s names no volume", where, vm.Name)
				}
			}
			ports := map[string]bool{}
			for _, cp := range c.Ports {
				ports[cp.Name] = true
			}
			for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				if pr == nil {
					continue
				}
				var port string
				if pr.HTTPGet != nil {
					port = pr.HTTPGet.Port.String()
				} else if pr.TCPSocket != nil {
					port = pr.TCPSocket.Port.String()
				}
				if !ports[port] {
					t.Errorf("%s: probe port %q is not a container port", where, port)
				}
			}
			for _, e := range c.Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
					s := m.secrets[r.SecretKeyRef.Name]
					if s == nil && !external[r.SecretKeyRef.Name] {
						t.Errorf("%s: env %s reads Secret %s, neither rendered nor external", where, e.Name, r.SecretKeyRef.Name)
					}
					if s == nil {
						continue
					}
					if _, ok := s.StringData[r.SecretKeyRef.Key]; !ok {
						t.Errorf("%s: env %s reads key %s, not in Secret %s", where, e.Name, r.SecretKeyRef.Key, s.Name)
					}
				}
			}
			if len(c.Args) == 0 && c.Name != "chown" {
				t.Errorf("%s: no args", where)
			}
		}
		if len(p.Spec.Containers) > 0 && p.Spec.Containers[0].Name != "redis" {
			c := p.Spec.Containers[0]
			if c.LivenessProbe == nil || c.ReadinessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("%s: want /healthz liveness and a readiness probe", name)
			}
		}
	}
	for n, d := range m.deployments {
		checkSelector(t, n, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	for n, d := range m.daemonSets {
		checkSelector(t, n, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	for _, np := range m.policies {
		var target *corev1.PodTemplateSpec
		for _, p := range pods {
			if selects(np.Spec.PodSelector.MatchLabels, p.Labels) {
				target = p
			}
		}
		if target == nil {
			t.Errorf("network policy %s selects no pods", np.Name)
			continue
		}
		for _, in := range np.Spec.Ingress {
			for _, pp := range in.Ports {
				if !hasPort(target, pp.Port.String()) {
					t.Errorf("network policy %s: port %s is no container port", np.Name, pp.Port.String())
				}
			}
		}
	}
	for _, s := range m.services {
		var target *corev1.PodTemplateSpec
		for _, p := range pods {
			if selects(s.Spec.Selector, p.Labels) {
				target = p
			}
		}
		if target == nil {
			t.Errorf("service %s selects no pods", s.Name)
			continue
		}
		for _, sp := range s.Spec.Ports {
			if !hasPort(target, sp.TargetPort.String()) {
				t.Errorf("service %s: targetPort %s is no container port", s.Name, sp.TargetPort.String())
			}
		}
	}
}

// hasPort reports whether a container of p has a port of that name.
func hasPort(p *corev1.PodTemplateSpec, name string) bool {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return true
			}
		}
	}
	return false
}

func checkSelector(t *testing.T, name string, sel, labels map[string]string) {
	t.Helper()
	if len(sel) == 0 || !selects(sel, labels) {
		t.Errorf("%s: selector %v does not match its pods' labels %v", name, sel, labels)
	}
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// containerEnv turns a container's env into KEY=value entries as the
// kubelet would: $(VAR) references expanded, fields and Secrets replaced
// by stand-ins of the right shape.
func containerEnv(c corev1.Container) []string {
	vals := map[string]string{}
	var env []string
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		v := e.Value
		if r := e.ValueFrom; r != nil {
			switch {
			case r.FieldRef != nil && r.FieldRef.FieldPath == "status.podIP":
				v = "10.1.2.3"
			case r.FieldRef != nil && r.FieldRef.FieldPath == "spec.nodeName":
				v = "gpu-node-7"
			case r.SecretKeyRef != nil && strings.Contains(r.SecretKeyRef.Key, "url"):
				v = "redis://:pw@redis.example:6379"
			case r.SecretKeyRef != nil:
				v = "a-token-from-the-secret"
			}
		}
		v = ref.ReplaceAllStringFunc(v, func(s string) string { return vals[ref.FindStringSubmatch(s)[1]] })
		vals[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env
}

// checkDaemonConfig loads the daemon's rendered kvtier.yaml, with the
// container's environment on top, through config.FromEnv: what the
// daemon itself would do at start.
func checkDaemonConfig(t *testing.T, m *manifests) {
	t.Helper()
	for name, ds := range m.daemonSets {
		c := ds.Spec.Template.Spec.Containers[0]
		if len(c.Args) < 3 || c.Args[0] != "serve" || c.Args[1] != "--config" {
			t.Fatalf("%s: args %v", name, c.Args)
		}
		cm := m.configMaps[ds.Spec.Template.Spec.Volumes[0].ConfigMap.Name]
		file := filepath.Join(t.TempDir(), filepath.Base(c.Args[2]))
		if err := os.WriteFile(file, []byte(cm.Data[filepath.Base(c.Args[2])]), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.FromEnv(append(containerEnv(c), "KVTIER_CONFIG_FILE="+file))
		if err != nil {
			t.Fatalf("%s: the daemon refuses its configuration: %v\n%s", name, err, cm.Data["kvtier.yaml"])
		}
		if cfg.SocketPath != "/run/kvtier/kvtier.sock" || !mounted(c, "/run/kvtier") {
			t.Errorf("%s: socket %s not in the shared host directory", name, cfg.SocketPath)
		}
		if cfg.LocalDisk != "" && !mounted(c, cfg.LocalDisk) {
			t.Errorf("%s: local_disk %s is not a mounted volume", name, cfg.LocalDisk)
		}
		if !mounted(c, cfg.DataDir) {
			t.Errorf("%s: data_dir %s is not a mounted volume (the root is read-only)", name, cfg.DataDir)
		}
		if cfg.TCPAddr != "" && cfg.TCPToken == "" {
			t.Errorf("%s: tcp_addr %s without a token", name, cfg.TCPAddr)
		}
		if err := adminOpen(cfg, c); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func mounted(c corev1.Container, path string) bool {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == path {
			return true
		}
	}
	return false
}

// checkControllerConfig decodes the controller's rendered controller.yaml
// with controller.Config's Decode, applies the flags the Deployment adds,
// and validates the result as `kvtier controller` does.
func checkControllerConfig(t *testing.T, m *manifests) {
	t.Helper()
	for name, d := range m.deployments {
		c := d.Spec.Template.Spec.Containers[0]
		if c.Args[0] != "controller" {
			continue
		}
		cm := m.configMaps[d.Spec.Template.Spec.Volumes[0].ConfigMap.Name]
		cfg := controller.Default()
		if err := cfg.Decode([]byte(cm.Data["controller.yaml"]), cm.Name); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		env := map[string]string{}
		for _, kv := range containerEnv(c) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		expand := func(s string) string {
			return regexp.MustCompile(`\$\((\w+)\)`).ReplaceAllStringFunc(s, func(r string) string { return env[r[2:len(r)-1]] })
		}
		// As `kvtier controller` does: the variable over the file, the
		// flags over both.
		if v := env["KVTIER_CLUSTER_TOKEN"]; v != "" {
			cfg.ClusterToken = v
		}
		for _, a := range c.Args[3:] {
			if strings.Contains(a, "token") {
				t.Errorf("%s: a token on the command line (%q) shows in the process list", name, a)
			} else if v, ok := strings.CutPrefix(a, "--index-redis="); ok {
				cfg.IndexRedis = expand(v)
			} else {
				t.Errorf("%s: unexpected arg %q", name, a)
			}
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: the controller refuses its configuration: %v\n%s", name, err, cm.Data["controller.yaml"])
		}
		if !loopbackAddr(cfg.Listen) && cfg.ClusterToken == "" {
			t.Errorf("%s: listen %s beyond loopback without a cluster_token: the controller refuses to start", name, cfg.Listen)
		}
		if *d.Spec.Replicas > 1 && cfg.IndexRedis == "" {
			t.Errorf("%s: %d replicas without index_redis", name, *d.Spec.Replicas)
		}
	}
}
