package server_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Tests in this file's family run the real daemon, `kvtier serve`, as a
// process of its own: what they measure (its RSS) or do to it (SIGKILL)
// must not be mixed up with the test binary.

// buildKvtier builds the binary once per test run, into binDir, which
// TestMain removes.
var buildKvtier = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kvtier-server-test-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "kvtier")
	// go test puts its own toolchain first on PATH.
	out, err := exec.Command("go", "build", "-o", bin, "kvtier/cmd/kvtier").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

var binDir string

// lockedBuffer collects a child's stderr while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a running `kvtier serve`.
type proc struct {
	cmd    *exec.Cmd
	log    *lockedBuffer
	exited chan error
	sock   string // local socket
	tcp    string // TCP protocol address
	admin  string // http://host:port of the admin API
}

var (
	adminAddrLine = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
	tcpAddrLine   = regexp.MustCompile(`msg="tcp protocol listening" addr=(\S+)`)
)

// startProc runs `kvtier serve` on a configuration file made of conf plus
// what makes the run private: its own socket, loopback ports picked by the
// kernel, its own data directory. It returns once the daemon is ready.
func startProc(t *testing.T, dir, conf string) *proc {
	t.Helper()
	bin, err := buildKvtier()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "kvtier.sock")
	conf += fmt.Sprintf("\nsocket_path: %s\ntcp_addr: 127.0.0.1:0\nadmin_addr: 127.0.0.1:0\ndata_dir: %s\n", sock, dir)
	path := filepath.Join(dir, "kvtier.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", path)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVTIER_") && !strings.HasPrefix(kv, "LMCACHE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	p := &proc{cmd: cmd, log: &lockedBuffer{}, exited: make(chan error, 1), sock: sock}
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() { p.kill() })
	deadline := time.Now().Add(30 * time.Second)
	for p.admin == "" || p.tcp == "" {
		log := p.log.String()
		if m := adminAddrLine.FindStringSubmatch(log); m != nil {
			p.admin = "http://" + m[1]
		}
		if m := tcpAddrLine.FindStringSubmatch(log); m != nil {
			p.tcp = m[1]
		}
		select {
		case err := <-p.exited:
			t.Fatalf("kvtier serve exited before listening: %v\n%s", err, log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvtier serve did not start listening:\n%s", log)
		}
	}
	if resp, err := http.Get(p.admin + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz: %v %v\n%s", resp, err, p.log)
	}
	return p
}

// kill ends the daemon with SIGKILL: nothing of its shutdown runs.
func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// rss returns the daemon's resident set size (VmRSS) in bytes.
func (p *proc) rss(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

// metric returns the value of one unlabelled metric from /metrics.
func (p *proc) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	for line := range strings.SplitSeq(body.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}
