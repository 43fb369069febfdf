package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kvtier/config"
	"kvtier/internal/citest"
	"kvtier/internal/servetest"
)

// unit is a parsed systemd unit file: section -> key -> values in order
// (a key may repeat).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(mustRead(t, path)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q is neither a section nor key=value", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) last(key string) string {
	v := u["Service"][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// hardening is what both units must set, key by value.
var hardening = map[string]string{
	"NoNewPrivileges":         "yes",
	"ProtectSystem":           "strict",
	"ProtectHome":             "yes",
	"PrivateTmp":              "yes",
	"PrivateDevices":          "yes",
	"MemoryDenyWriteExecute":  "yes",
	"RestrictNamespaces":      "yes",
	"RestrictSUIDSGID":        "yes",
	"LockPersonality":         "yes",
	"CapabilityBoundingSet":   "",
	"ProtectKernelTunables":   "yes",
	"ProtectControlGroups":    "yes",
	"SystemCallArchitectures": "native",
}

// TestSystemdUnits parses both units and checks: the hardening options;
// a non-root user; AF_UNIX among the address families; an ExecStart whose
// subcommand and flags the real binary accepts; for the daemon, that its
// Environment= and the example env file (with its commented settings
// turned on too) form a configuration the daemon accepts, with the socket
// and data directory in directories systemd makes writable. Then, where
// systemd-analyze is installed, `verify` must print nothing and
// `security --offline` must rate each unit's exposure at most 2.0.
func TestSystemdUnits(t *testing.T) {
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kvtier.service", "kvtier-controller.service"} {
		u := parseUnit(t, filepath.Join("systemd", name))
		for k, want := range hardening {
			if got := u["Service"][k]; len(got) == 0 || got[len(got)-1] != want {
				t.Errorf("%s: %s=%v, want %q", name, k, got, want)
			}
		}
		if user := u.last("User"); user == "" || user == "root" || user == "0" {
			t.Errorf("%s: User=%q, want a non-root user", name, user)
		}
		if fams := strings.Fields(u.last("RestrictAddressFamilies")); !slices.Contains(fams, "AF_UNIX") {
			t.Errorf("%s: RestrictAddressFamilies=%v lacks AF_UNIX", name, fams)
		}
		argv := strings.Fields(u.last("ExecStart"))
		if len(argv) < 2 || argv[0] != "/usr/local/bin/kvtier" {
			t.Fatalf("%s: ExecStart=%v", name, argv)
		}
		help, err := exec.Command(bin, argv[1], "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: kvtier %s --help: %v\n%s", name, argv[1], err, help)
		}
		for _, a := range argv[2:] {
			if strings.HasPrefix(a, "--") && !strings.Contains(string(help), "  "+a+" ") {
				t.Errorf("%s: flag %s is not in kvtier %s --help", name, a, argv[1])
			}
		}
		if name == "kvtier.service" {
			checkDaemonUnitEnv(t, u)
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		citest.Missing(t, "systemd-analyze not installed (Debian's systemd)")
	}
	analyzeUnits(t, analyze, bin)
}

// checkDaemonUnitEnv loads the daemon's configuration from the unit's
// Environment= lines and kvtier.env, as the daemon would under systemd.
func checkDaemonUnitEnv(t *testing.T, u unit) {
	t.Helper()
	environ := append([]string{}, u["Service"]["Environment"]...)
	var commented []string
	for line := range strings.Lines(string(mustRead(t, "systemd/kvtier.env"))) {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "#"); ok && strings.HasPrefix(rest, "KVTIER_") {
			commented = append(commented, rest)
		} else if line != "" && line[0] != '#' {
			environ = append(environ, line)
		}
	}
	if len(commented) == 0 {
		t.Fatal("kvtier.env: no commented settings")
	}
	for _, env := range [][]string{environ, append(slices.Clone(environ), commented...)} {
		cfg, err := config.FromEnv(env)
		if err != nil {
			t.Fatalf("the daemon refuses the unit's environment %v: %v", env, err)
		}
		if filepath.Dir(cfg.SocketPath) != "/run/"+u.last("RuntimeDirectory") {
			t.Errorf("socket_path %s is not in RuntimeDirectory=%s", cfg.SocketPath, u.last("RuntimeDirectory"))
		}
		if cfg.DataDir != "/var/lib/"+u.last("StateDirectory") {
			t.Errorf("data_dir %s is not StateDirectory=%s", cfg.DataDir, u.last("StateDirectory"))
		}
		// The daemon refuses to start on these (docs/security.md).
		if !loopbackAddr(cfg.AdminAddr) && cfg.AdminToken == "" {
			t.Errorf("admin_addr %s beyond loopback without admin_token", cfg.AdminAddr)
		}
		if cfg.TCPAddr != "" && !loopbackAddr(cfg.TCPAddr) && cfg.TCPToken == "" {
			t.Errorf("tcp_addr %s beyond loopback without tcp_token", cfg.TCPAddr)
		}
	}
}

// analyzeUnits runs systemd-analyze on copies of the units whose ExecStart
// names the test's binary (verify checks that the program exists).
func analyzeUnits(t *testing.T, analyze, bin string) {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"kvtier.service", "kvtier-controller.service"} {
		text := strings.ReplaceAll(string(mustRead(t, filepath.Join("systemd", name))), "/usr/local/bin/kvtier", bin)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, p := range paths {
		// --threshold is the exposure times ten: fail above 2.0.
		out, err := exec.Command(analyze, "security", "--offline=yes", "--threshold=20", "--no-pager", p).CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		t.Logf("%s", lines[len(lines)-1])
		if err != nil {
			t.Errorf("systemd-analyze security %s: %v\n%s", filepath.Base(p), err, out)
		}
	}
}
