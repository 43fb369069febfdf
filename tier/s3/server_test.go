package s3

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"kvtier/internal/s3test"
)

// Credentials of the root account of every test server.
const (
	testAccess = "kvtier-test"
	testSecret = "kvtier-test-secret/with+odd@chars"
)

// server is a real S3 server (versitygw over a posix directory) on a
// loopback port, owned by one test or benchmark.
type server struct {
	bin  string
	root string // directory whose subdirectories are the buckets
	addr string // 127.0.0.1:port
	cmd  *exec.Cmd
	logs *os.File
}

// startServer starts a server that is stopped when tb ends. Without the
// binary it skips, or fails when $CI is set, since CI installs it.
func startServer(tb testing.TB) *server {
	tb.Helper()
	s := newServer(tb)
	tb.Cleanup(s.stop)
	return s
}

func newServer(tb testing.TB) *server {
	tb.Helper()
	return newServerIn(tb, "")
}

// newServerIn starts a server keeping its files under parent ("" for the
// system's temporary directory).
func newServerIn(tb testing.TB, parent string) *server {
	tb.Helper()
	bin := s3test.Need(tb)
	dir, err := os.MkdirTemp(parent, "kvtier-s3-")
	if err != nil {
		tb.Fatal(err)
	}
	s := &server{bin: bin, root: filepath.Join(dir, "data"), addr: freeAddr(tb)}
	if err := os.Mkdir(s.root, 0o755); err != nil {
		tb.Fatal(err)
	}
	if s.logs, err = os.Create(filepath.Join(dir, "versitygw.log")); err != nil {
		tb.Fatal(err)
	}
	if err := s.start(); err != nil {
		tb.Fatal(err)
	}
	return s
}

func freeAddr(tb testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs the gateway and waits until it accepts connections.
func (s *server) start() error {
	s.cmd = exec.Command(s.bin, "--access", testAccess, "--secret", testSecret,
		"--port", s.addr, "--quiet", "--keep-alive", "posix", s.root)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", s.addr, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.kill()
	log, _ := os.ReadFile(s.logs.Name())
	return fmt.Errorf("versitygw did not listen on %s; its output:\n%s", s.addr, log)
}

// kill stops the gateway process and waits for it to exit.
func (s *server) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

func (s *server) stop() {
	s.kill()
	s.logs.Close()
	os.RemoveAll(filepath.Dir(s.root))
}

// url returns the tier URL of bucket on this server.
func (s *server) url(bucket, prefix string) string {
	u := url.URL{
		Scheme:   "s3",
		User:     url.UserPassword(testAccess, testSecret),
		Host:     bucket,
		Path:     "/" + prefix,
		RawQuery: "endpoint=" + s.addr + "&secure=false&path_style=true&create=true",
	}
	return u.String()
}

// config returns a Config for bucket on this server, creating the bucket.
func (s *server) config(bucket string) Config {
	return Config{
		Bucket:       bucket,
		Endpoint:     s.addr,
		PathStyle:    true,
		CreateBucket: true,
		AccessKey:    testAccess,
		SecretKey:    testSecret,
		Timeout:      10 * time.Second, // generous: the race detector slows everything
		Logger:       slog.New(slog.DiscardHandler),
	}
}

// open returns a tier on bucket, closed when tb ends.
func (s *server) open(tb testing.TB, bucket string) *Tier {
	tb.Helper()
	return s.openConfig(tb, s.config(bucket))
}

func (s *server) openConfig(tb testing.TB, cfg Config) *Tier {
	tb.Helper()
	t, err := New(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { t.Close() })
	return t
}

// rawClient is a plain minio-go client for writing and reading behind the
// tier's back.
func (s *server) rawClient(tb testing.TB) *minio.Client {
	tb.Helper()
	c, err := minio.New(s.addr, &minio.Options{
		Creds:        credentials.NewStaticV4(testAccess, testSecret, ""),
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// shared is one server for the tests that do not restart it; each test
// uses its own bucket.
var shared struct {
	once sync.Once
	srv  *server
}

func sharedServer(tb testing.TB) *server {
	tb.Helper()
	if _, ok := s3test.Binary(); !ok {
		startServer(tb) // skips or fails with the install hint
	}
	shared.once.Do(func() { shared.srv = newServer(tb) })
	if shared.srv == nil {
		tb.Fatal("shared server failed to start")
	}
	return shared.srv
}

// bucketName turns a test name into a valid, unique bucket name.
func bucketName(tb testing.TB) string {
	// One bucket per test run, the same for every call of that run: with
	// -count=N a test runs N times against the one shared server.
	if v, ok := bucketNames.Load(tb); ok {
		return v.(string)
	}
	name := strings.ToLower(tb.Name())
	name = strings.NewReplacer("/", "-", "_", "-", "#", "-").Replace(name)
	if len(name) > 50 {
		name = name[:50]
	}
	name = fmt.Sprintf("t-%s-%d", strings.Trim(name, "-"), bucketSeq.Add(1))
	bucketNames.Store(tb, name)
	return name
}

var (
	bucketNames sync.Map // testing.TB → bucket name
	bucketSeq   atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, s := range []*server{shared.srv, benchServer.srv} {
		if s != nil {
			s.stop()
		}
	}
	os.Exit(code)
}
