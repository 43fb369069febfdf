package chaos

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/procstop"
	"kvtier/internal/s3test"
)

// s3Server is a real S3 server: versitygw over a posix directory, which
// writes each object to a file before it answers the PUT.
type s3Server struct {
	bin, root, addr string
	cmd             *exec.Cmd
}

const (
	s3Access = "chaos-access"
	s3Secret = "chaos-secret"
)

func startS3(t testing.TB) *s3Server {
	t.Helper()
	bin := s3test.Need(t)
	s := &s3Server{bin: bin, root: filepath.Join(t.TempDir(), "data"), addr: freeAddr(t)}
	if err := os.Mkdir(s.root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	s.start(t)
	return s
}

// start runs the server on its address and directory and waits until it
// accepts connections.
func (s *s3Server) start(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command(s.bin, "--access", s3Access, "--secret", s3Secret, "--port", s.addr, "--quiet", "posix", s.root)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "versitygw to listen", func() bool {
		c, err := net.DialTimeout("tcp", s.addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// kill ends the server with SIGKILL (resuming it first if it is hung).
func (s *s3Server) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Wait()
	s.cmd = nil
}

func (s *s3Server) url(bucket string) string {
	u := url.URL{Scheme: "s3", User: url.UserPassword(s3Access, s3Secret), Host: bucket, Path: "/chaos",
		RawQuery: "endpoint=" + s.addr + "&secure=false&path_style=true&create=true"}
	return u.String()
}

// s3HungKilled hangs the S3 server, resumes it, then kills it and starts
// it again on the same directory.
func s3HungKilled(t testing.TB, o Options, r *Report) {
	r.Checked = "with the S3 server hung (SIGSTOP) and then killed (SIGKILL) chunks held only there read as misses, never errors, stores are still acknowledged, and once it is back every chunk it acknowledged reads back"
	s := startS3(t)
	d, c := remoteRig(t, s.url(fmt.Sprintf("chaos-%d", newRun()%1_000_000)))
	r.Stored, r.Durable = remoteTargets+remoteFillers, remoteTargets+remoteFillers

	if err := procstop.Stop(s.cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	sickReads(t, c, "hung", r)
	storesWhileSick(t, c, 1000, 8, r)
	time.Sleep(o.load())
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	hung := recovered(t, c)
	verifyRemote(t, d, c, "s3", r)

	// Reading back promoted the targets into RAM; push them out again,
	// so the reads below go to the store, then kill it.
	pushOut(t, c, 2000, 1000, 8, r)
	s.kill()
	sickReads(t, c, "dead", r)
	storesWhileSick(t, c, 3000, 8, r)
	s.start(t)
	killed := recovered(t, c)
	r.Note("recovery after SIGCONT %v, after the restart %v", hung.Round(time.Millisecond), killed.Round(time.Millisecond))
	r.Recovery = max(hung, killed)
	verifyRemote(t, d, c, "s3", r)
}
