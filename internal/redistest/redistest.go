// Package redistest starts real redis-server processes for tests, on free
// loopback ports. A test that needs one skips when redis-server is not
// installed, except under CI (internal/citest), where the missing binary
// is a failure: CI installs it.
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/citest"
	"kvtier/internal/procstop"
)

// Server is one running redis-server.
type Server struct {
	Addr string // host:port
	cmd  *exec.Cmd
}

// URL is the server's redis:// URL for database 0.
func (s *Server) URL() string { return "redis://" + s.Addr + "/0" }

// Start runs redis-server on a free port, without persistence, until the
// test ends (or Stop).
func Start(t testing.TB) *Server {
	t.Helper()
	return StartOn(t, freePort(t))
}

// freePort returns a loopback TCP port free at the moment of asking.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartOn runs redis-server on port, for restarting a server in place.
func StartOn(t testing.TB, port int) *Server {
	t.Helper()
	return start(t, port, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
}

// StartWith runs redis-server on a free port, without persistence, with
// more command-line options (e.g. "--rename-command", "EVAL", "").
func StartWith(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, freePort(t), append([]string{"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, extra...)...)
}

// StartDurable runs redis-server on port (0 for a free one) with its
// append-only file in dir, fsync'ed before every reply (appendfsync
// always): a write it acknowledged survives a SIGKILL, and a server
// started again on the same dir has it back.
func StartDurable(t testing.TB, port int, dir string) *Server {
	t.Helper()
	if port == 0 {
		port = freePort(t)
	}
	return start(t, port, "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", dir)
}

// StartPassword runs redis-server on a free port, without persistence,
// requiring password (requirepass): URL then lacks it, and a client must
// give it.
func StartPassword(t testing.TB, password string) *Server {
	t.Helper()
	return start(t, freePort(t), "--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--requirepass", password)
}

func start(t testing.TB, port int, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		citest.Missing(t, "redis-server not installed (apt-get install redis-server): %v", err)
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	s.cmd = exec.Command(bin, append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1"}, args...)...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	deadline := time.Now().Add(20 * time.Second) // a liveness bound, not a measurement
	for {
		if c, err := net.Dial("tcp", s.Addr); err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Port is the server's port.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.Addr)
	var n int
	fmt.Sscan(p, &n)
	return n
}

// Signal sends sig to the server process: SIGSTOP hangs it with its port
// still accepting connections (and returns once it is stopped), SIGCONT
// resumes it.
func (s *Server) Signal(sig os.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return os.ErrProcessDone
	}
	if sig == syscall.SIGSTOP {
		return procstop.Stop(s.cmd.Process.Pid, 10*time.Second)
	}
	return s.cmd.Process.Signal(sig)
}

// Stop kills the server; calling it again does nothing.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}
