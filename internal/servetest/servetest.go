// Package servetest runs real `kvtier serve` processes for tests: the
// binary is built once per test binary, and each daemon gets its own
// socket, loopback ports picked by the kernel and data directory, and is
// killed with SIGKILL when the test ends. Tests that measure a daemon (its
// RSS) or do something to it (kill it, partition it from a peer) need it
// in a process of its own, apart from the test binary.
package servetest

import (
	"bytes"
	"fmt"
	"io"
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

var binDir string

// buildOnce builds kvtier once per test binary, into binDir.
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kvtier-servetest-")
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

// usedBinary, when set by UseBinary, replaces the build.
var usedBinary string

// Binary returns the path of a kvtier binary built from this tree, or the
// one UseBinary named.
func Binary() (string, error) {
	if usedBinary != "" {
		return usedBinary, nil
	}
	return buildOnce()
}

// UseBinary makes Binary return bin instead of building one: `kvtier
// chaos` runs the helpers with its own executable, where no Go toolchain
// need exist. Call it before any Start.
func UseBinary(bin string) { usedBinary = bin }

// Cleanup removes the built binary; call it from TestMain after m.Run.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// Log collects a child's stderr while the test reads it.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Daemon is a running `kvtier serve`.
type Daemon struct {
	Cmd    *exec.Cmd
	Log    *Log
	Sock   string        // the local socket
	TCP    string        // the TCP protocol's address
	Admin  string        // http://host:port of the admin API
	exited chan struct{} // closed once the process has exited
	err    error         // Wait's result, set before exited is closed
}

var (
	adminLine = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
	tcpLine   = regexp.MustCompile(`msg="tcp protocol listening" addr=(\S+)`)
)

// Start runs `kvtier serve` on a configuration file made of conf plus
// what makes the run private: a socket and data directory in dir, the
// admin API and (unless conf names tcp_addr) the TCP protocol on loopback
// ports the kernel picks. KVTIER_ and LMCACHE_ variables of the test's
// environment are not passed on. It returns once the daemon is ready.
func Start(t testing.TB, dir, conf string) *Daemon {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "kvtier.sock")
	if !strings.Contains(conf, "tcp_addr:") {
		conf += "\ntcp_addr: 127.0.0.1:0"
	}
	conf += fmt.Sprintf("\nsocket_path: %s\nadmin_addr: 127.0.0.1:0\ndata_dir: %s\n", sock, dir)
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
	d := &Daemon{Cmd: cmd, Log: &Log{}, Sock: sock, exited: make(chan struct{})}
	cmd.Stderr = d.Log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = cmd.Wait(); close(d.exited) }()
	t.Cleanup(d.Kill)
	d.waitListening(t)
	if resp, err := http.Get(d.Admin + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz: %v %v\n%s", resp, err, d.Log)
	}
	return d
}

// waitListening reads the daemon's log until it names both listeners.
func (d *Daemon) waitListening(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for d.Admin == "" || d.TCP == "" {
		log := d.Log.String()
		if m := adminLine.FindStringSubmatch(log); m != nil {
			d.Admin = "http://" + m[1]
		}
		if m := tcpLine.FindStringSubmatch(log); m != nil {
			d.TCP = m[1]
		}
		select {
		case <-d.exited:
			t.Fatalf("kvtier serve exited before listening: %v\n%s", d.err, log)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvtier serve did not start listening:\n%s", log)
		}
	}
}

// Kill ends the daemon with SIGKILL: nothing of its shutdown runs, as
// when a node dies. Killing a daemon that has exited returns at once.
func (d *Daemon) Kill() {
	d.Cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
	}
}

// Metric returns the value of one sample of the daemon's /metrics (a
// name, with its labels if it has any), or "" when there is none.
func (d *Daemon) Metric(t testing.TB, sample string) string {
	t.Helper()
	resp, err := http.Get(d.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// RSS returns the daemon's resident set size (VmRSS) in bytes.
func (d *Daemon) RSS(t testing.TB) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Cmd.Process.Pid))
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
