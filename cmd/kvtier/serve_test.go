package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvtier/config"
	"kvtier/engine"
	"kvtier/internal/servetest"
)

// hang bounds every wait on the daemon. It only catches a daemon that
// hangs; no test asserts how fast anything is.
const hang = 30 * time.Second

func TestMemTotal(t *testing.T) {
	const meminfo = "MemTotal:       24591260 kB\nMemFree:         1000 kB\n"
	if got, err := memTotal(strings.NewReader(meminfo)); err != nil || got != 24591260<<10 {
		t.Errorf("memTotal = %d, %v", got, err)
	}
	for _, bad := range []string{"", "MemFree: 1 kB\n", "MemTotal: 12\n", "MemTotal: x kB\n", "MemTotal: -5 kB\n"} {
		if got, err := memTotal(strings.NewReader(bad)); err == nil {
			t.Errorf("memTotal(%q) = %d, want an error", bad, got)
		}
	}
}

func TestCgroupLimit(t *testing.T) {
	if v, ok := cgroupLimit([]byte("1073741824\n")); !ok || v != 1<<30 {
		t.Errorf("cgroupLimit = %d, %v", v, ok)
	}
	for _, s := range []string{"max\n", "", "0", "-1"} {
		if v, ok := cgroupLimit([]byte(s)); ok {
			t.Errorf("cgroupLimit(%q) = %d, want no limit", s, v)
		}
	}
}

func TestDefaultRAMGiB(t *testing.T) {
	for _, tc := range []struct {
		mem  int64
		want float64
	}{
		{24 * int64(config.GiB), 5}, // a quarter is 6 GiB: the 5 GiB default wins
		{8 * int64(config.GiB), 2},
		{1 * int64(config.GiB), 0.25},
	} {
		if got := defaultRAMGiB(5, tc.mem); got != tc.want {
			t.Errorf("defaultRAMGiB(5, %d) = %v, want %v", tc.mem, got, tc.want)
		}
	}
}

func FuzzMemTotal(f *testing.F) {
	f.Add([]byte("MemTotal:       24591260 kB\n"))
	f.Add([]byte("MemTotal: 99999999999999999999 kB\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if v, err := memTotal(bytes.NewReader(data)); err == nil && v <= 0 {
			t.Fatalf("memTotal accepted %q as %d", data, v)
		}
	})
}

func TestServeRefusesBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvtier.yaml")
	if err := os.WriteFile(path, []byte("chunk_size: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := runServe(context.Background(), func() {}, path, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "chunk_size") {
		t.Errorf("runServe with chunk_size 0 = %v, want an error naming the key", err)
	}
}

// TestMain removes the kvtier binary the process tests built, if any
// (package servetest builds it once, on first use).
func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// daemon is a running `kvtier serve`.
type daemon struct {
	cmd    *exec.Cmd
	stderr *servetest.Log
	url    string
	exited chan error
}

var listening = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)

// startDaemon runs `kvtier serve args...` with a clean KVTIER_ environment
// plus env, and waits until it logs its admin address and reports ready.
func startDaemon(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVTIER_") && !strings.HasPrefix(kv, "LMCACHE_") && !strings.HasPrefix(kv, "HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+t.TempDir())
	// A socket of its own, so the test never meets a daemon already running.
	cmd.Env = append(cmd.Env, "KVTIER_SOCKET_PATH="+filepath.Join(t.TempDir(), "kvtier.sock"))
	cmd.Env = append(cmd.Env, env...)
	d := &daemon{cmd: cmd, stderr: &servetest.Log{}, exited: make(chan error, 1)}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	deadline := time.Now().Add(hang)
	for d.url == "" {
		if m := listening.FindStringSubmatch(d.stderr.String()); m != nil {
			d.url = "http://" + m[1]
			break
		}
		select {
		case err := <-d.exited:
			t.Fatalf("daemon exited before listening: %v\n%s", err, d.stderr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not log its address within %v:\n%s", hang, d.stderr)
		}
	}
	if resp, err := http.Get(d.url + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz: %v %v\n%s", resp, err, d.stderr)
	}
	return d
}

// stop sends SIGTERM and checks for a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.exited:
		if err != nil {
			t.Errorf("daemon exited with %v after SIGTERM:\n%s", err, d.stderr)
		}
	case <-time.After(hang):
		t.Fatalf("daemon still running %v after SIGTERM:\n%s", hang, d.stderr)
	}
	log := d.stderr.String()
	if !strings.Contains(log, `msg="shutting down"`) || !strings.Contains(log, "msg=stopped") {
		t.Errorf("shutdown was not logged:\n%s", log)
	}
}

func (d *daemon) stats(t *testing.T) engine.Stats {
	t.Helper()
	resp, err := http.Get(d.url + "/api/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s engine.Stats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestServeWithConfigFile runs the daemon with RAM and disk tiers from a
// file, checks the admin API reflects that file, and stops it with SIGTERM.
func TestServeWithConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvtier.yaml")
	conf := fmt.Sprintf("max_local_cpu_size: 0.0625\nlocal_disk: %s\nmax_local_disk_size: 0.0625\n"+
		"disk_segment_size: 4MiB\nadmin_addr: 127.0.0.1:0\ndata_dir: %s\nlog_level: debug\n", filepath.Join(dir, "disk"), dir)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, nil, "--config", path)

	s := d.stats(t)
	if len(s.Tiers) != 2 || s.Tiers[0].Name != "mem" || s.Tiers[0].CapacityBytes != 64<<20 ||
		s.Tiers[1].Name != "disk" || s.Tiers[1].CapacityBytes != 64<<20 {
		t.Errorf("tiers do not match the file: %+v", s.Tiers)
	}
	resp, err := http.Get(d.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `kvtier_tier_capacity_bytes{tier="mem"} 6.7108864e+07`) {
		t.Errorf("/metrics lacks the RAM tier's capacity:\n%.2000s", body)
	}
	d.stop(t)
}

// TestServeWithoutConfig runs the daemon on embedded defaults alone: RAM
// sized from the machine, no disk tier.
func TestServeWithoutConfig(t *testing.T) {
	d := startDaemon(t, []string{"KVTIER_ADMIN_ADDR=127.0.0.1:0"})
	mem, ok := machineMemory()
	if !ok {
		t.Skip("cannot read this machine's memory size")
	}
	want := config.Config{MaxLocalCPUSize: defaultRAMGiB(config.Default().MaxLocalCPUSize, mem)}.LocalCPUBytes()
	s := d.stats(t)
	if len(s.Tiers) != 1 || s.Tiers[0].Name != "mem" || s.Tiers[0].CapacityBytes != int64(want) {
		t.Errorf("default tiers = %+v, want RAM only with %d bytes", s.Tiers, want)
	}
	d.stop(t)
}
