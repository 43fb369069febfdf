package redis

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/tier/remote"
)

// This file starts real redis-server processes for the tests: single
// servers, a TLS server, a three-node cluster and a sentinel.

// startupLimit bounds how long a server may take to answer after start.
// It is a liveness bound, not a measurement: no test passes or fails on
// how fast anything is.
const startupLimit = 20 * time.Second

// needBinary skips the test when name is not installed, except in CI where
// its absence is an error.
func needBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (CI must install apt packages redis-server redis-tools): %v", name, err)
		}
		t.Skipf("%s not installed: %v", name, err)
	}
	return path
}

// server is one redis-server process.
type server struct {
	t    testing.TB
	tls  *tls.Config // client side, for servers that speak only TLS
	args []string
	dir  string
	port int
	cmd  *exec.Cmd
	logs *os.File
}

// freePort returns a loopback TCP port nothing listens on, and, when
// withBus is set, whose cluster bus port (port+10000) is free as well.
func freePort(t testing.TB, withBus bool) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !withBus {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err == nil {
			bus.Close()
			return port
		}
	}
	t.Fatal("no free port pair for a cluster node")
	return 0
}

// startServer runs redis-server on a free port with persistence off and
// stops it when the test ends. extra are more command-line options.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	bin := needBinary(t, "redis-server")
	s := &server{t: t, dir: t.TempDir()}
	cluster := false
	for _, a := range extra {
		cluster = cluster || a == "--cluster-enabled"
	}
	s.port = freePort(t, cluster)
	s.args = []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir}
	for _, a := range extra { // "{port}" lets a TLS server take the port
		s.args = append(s.args, strings.ReplaceAll(a, "{port}", strconv.Itoa(s.port)))
	}
	s.start(bin)
	t.Cleanup(s.stop)
	return s
}

func (s *server) start(bin string) {
	s.t.Helper()
	var err error
	s.logs, err = os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
}

// stop ends the server with SIGTERM and waits for it.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
	s.cmd = nil
	s.logs.Close()
}

// restart starts the stopped server again on the same port and waits
// until it answers.
func (s *server) restart() {
	s.t.Helper()
	s.start(needBinary(s.t, "redis-server"))
	s.waitReady()
}

func (s *server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// url is the tier URL of this server with query appended.
func (s *server) url(query string) string {
	u := "redis://" + s.addr()
	if query != "" {
		u += "?" + query
	}
	return u
}

// waitReady polls PING until the server answers.
func (s *server) waitReady() {
	s.t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: s.addr(), MaxRetries: -1, DisableIdentity: true, TLSConfig: s.tls})
	defer c.Close()
	waitFor(s.t, "redis-server at "+s.addr()+" (log "+s.dir+"/server.log)", func() error {
		return c.Ping(context.Background()).Err()
	})
}

// waitFor polls check until it returns nil, failing the test after
// startupLimit.
func waitFor(t testing.TB, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(startupLimit)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rawClient is a plain go-redis client on s, for writing what the tier
// would not and for checking what it wrote.
func (s *server) rawClient() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: s.addr(), DisableIdentity: true, TLSConfig: s.tls})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// openTier opens rawURL through the remote registry, as kvtier does, with
// a generous deadline: these tests check what the tier does, not how fast,
// and the race detector slows transfers far below remote.DefaultBandwidth.
func openTier(t testing.TB, rawURL string) *Tier {
	t.Helper()
	tr, err := remote.Open(context.Background(), rawURL, remote.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open %s: %v", rawURL, err)
	}
	rt, ok := tr.(*Tier)
	if !ok {
		t.Fatalf("open %s gave a %T", rawURL, tr)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// shared is one standalone server for the tests that need nothing special.
var shared struct {
	once sync.Once
	srv  *server
	err  string
}

// sharedServer starts the package's standalone server on first use. It
// lives until the test binary exits (TestMain stops it).
func sharedServer(t testing.TB) *server {
	t.Helper()
	needBinary(t, "redis-server")
	shared.once.Do(func() {
		shared.srv, shared.err = startDetached(nil)
	})
	if shared.err != "" {
		t.Fatal(shared.err)
	}
	return shared.srv
}

// cluster is three redis-server processes joined into one Redis Cluster.
type cluster struct {
	nodes []*server
}

var sharedCluster struct {
	once sync.Once
	c    *cluster
	err  string
}

// clusterNodes starts the package's three-node cluster on first use.
func clusterNodes(t testing.TB) *cluster {
	t.Helper()
	needBinary(t, "redis-server")
	needBinary(t, "redis-cli")
	sharedCluster.once.Do(func() {
		sharedCluster.c, sharedCluster.err = startCluster()
	})
	if sharedCluster.err != "" {
		t.Fatal(sharedCluster.err)
	}
	return sharedCluster.c
}

func (c *cluster) url(query string) string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr()
	}
	u := "redis+cluster://" + strings.Join(addrs, ",")
	if query != "" {
		u += "?" + query
	}
	return u
}

// detachedT lets the shared servers use the server helpers outside any one
// test: failures become an error string, cleanups run at exit.
type detachedT struct {
	testing.TB
	mu       sync.Mutex
	failed   string
	cleanups []func()
	dir      string
}

func (d *detachedT) Helper() {}
func (d *detachedT) Fatalf(format string, args ...any) {
	d.failed = fmt.Sprintf(format, args...)
	panic(d)
}
func (d *detachedT) Fatal(args ...any) { d.Fatalf("%s", fmt.Sprint(args...)) }
func (d *detachedT) Skipf(format string, args ...any) {
	d.Fatalf(format, args...)
}
func (d *detachedT) Cleanup(f func()) {
	d.mu.Lock()
	d.cleanups = append(d.cleanups, f)
	d.mu.Unlock()
}
func (d *detachedT) TempDir() string {
	dir, err := os.MkdirTemp(d.dir, "srv")
	if err != nil {
		d.Fatal(err)
	}
	return dir
}

var detached = &detachedT{}

// runDetached runs f with detached as its testing.TB and turns a Fatal
// into an error string.
func runDetached(f func(t testing.TB)) (failure string) {
	defer func() {
		if r := recover(); r != nil {
			if r != detached {
				panic(r)
			}
			failure = detached.failed
		}
	}()
	f(detached)
	return ""
}

func startDetached(extra []string) (srv *server, failure string) {
	failure = runDetached(func(t testing.TB) {
		srv = startServer(t, extra...)
		srv.waitReady()
	})
	return srv, failure
}

func startCluster() (c *cluster, failure string) {
	failure = runDetached(func(t testing.TB) {
		c = &cluster{}
		for range 3 {
			n := startServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "5000")
			c.nodes = append(c.nodes, n)
		}
		args := []string{"--cluster", "create"}
		for _, n := range c.nodes {
			n.waitReady()
			args = append(args, n.addr())
		}
		args = append(args, "--cluster-replicas", "0", "--cluster-yes")
		out, err := exec.Command(needBinary(t, "redis-cli"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
		}
		for _, n := range c.nodes {
			c := goredis.NewClient(&goredis.Options{Addr: n.addr(), DisableIdentity: true})
			waitFor(t, "cluster_state:ok on "+n.addr(), func() error {
				info, err := c.ClusterInfo(context.Background()).Result()
				if err != nil {
					return err
				}
				if !strings.Contains(info, "cluster_state:ok") {
					return fmt.Errorf("%s", firstLine(info))
				}
				return nil
			})
			c.Close()
		}
	})
	return c, failure
}

func firstLine(s string) string {
	line, _, _ := bufio.NewReader(strings.NewReader(s)).ReadLine()
	return string(line)
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvtier-redis-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	detached.dir = dir
	code := m.Run()
	for i := len(detached.cleanups) - 1; i >= 0; i-- {
		detached.cleanups[i]()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// mustParse is url.Parse for literals in tests.
func mustParse(t testing.TB, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
