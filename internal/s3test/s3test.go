// Package s3test starts real S3 servers (versitygw over a posix directory)
// for tests outside tier/s3, on free loopback ports. A test that needs one
// skips when versitygw is not installed, except under CI
// (internal/citest), where the missing binary is a failure.
package s3test

import (
	"fmt"
	"go/build"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/citest"
)

// Credentials of the server's root account.
const (
	Access = "kvtier-test"
	Secret = "kvtier-test-secret"
)

// Server is one running versitygw.
type Server struct {
	Addr string // 127.0.0.1:port
	Root string // directory whose subdirectories are the buckets
	cmd  *exec.Cmd
}

// Binary finds versitygw: $VERSITYGW if set, else $PATH, else the bin
// directory of GOPATH, where `go install` (and so .ci/run) puts it.
func Binary() (string, bool) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		return p, true
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, true
	}
	for _, dir := range filepath.SplitList(build.Default.GOPATH) {
		p := filepath.Join(dir, "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// Need returns versitygw's path; without it the test skips, or fails
// under CI, which installs it.
func Need(t testing.TB) string {
	t.Helper()
	bin, ok := Binary()
	if !ok {
		citest.Missing(t, "versitygw not found (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0, as .ci/run does)")
	}
	return bin
}

// Start runs versitygw until the test ends (or Kill).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Need(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := &Server{Addr: addr, Root: t.TempDir()}
	s.cmd = exec.Command(bin, "--access", Access, "--secret", Secret, "--port", addr, "--quiet", "--keep-alive", "posix", s.Root)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(s.Kill)
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw did not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// URL returns the s3:// tier URL of bucket (created on first use) under
// prefix.
func (s *Server) URL(bucket, prefix string) string {
	u := url.URL{Scheme: "s3", User: url.UserPassword(Access, Secret), Host: bucket, Path: "/" + prefix,
		RawQuery: "endpoint=" + s.Addr + "&secure=false&path_style=true&create=true"}
	return u.String()
}

// ObjectPath returns the file holding an object, for damaging it behind
// the server's back.
func (s *Server) ObjectPath(bucket, name string) string {
	return filepath.Join(s.Root, bucket, filepath.FromSlash(name))
}

// Kill stops the server with SIGKILL and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

// String names the server in messages.
func (s *Server) String() string { return fmt.Sprintf("versitygw on %s", s.Addr) }
