package layersave

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// redisServer is a redis-server the benchmark starts on loopback, without
// persistence, for the Redis target.
type redisServer struct {
	cmd    *exec.Cmd
	addr   string
	client *goredis.Client
}

// startRedis runs redis-server (found on PATH) on a free loopback port
// with its files in dir, and waits up to ten seconds for it to answer.
func startRedis(dir string) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("layersave: --redis needs redis-server on PATH: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	logs, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		return nil, err
	}
	defer logs.Close()
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	s.cmd.Stdout, s.cmd.Stderr = logs, logs
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("layersave: start redis-server: %w", err)
	}
	s.client = goredis.NewClient(&goredis.Options{Addr: s.addr, DisableIdentity: true})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if s.client.Ping(context.Background()).Err() == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("layersave: redis-server on %s did not answer (log %s)", s.addr, logs.Name())
		}
	}
}

// url is the tier URL of the server. The breaker's round-trip deadline is
// one second: on a loaded machine the default 100 ms would cut transfers
// off and measure the breaker, not the saves.
func (s *redisServer) url() string { return "redis://" + s.addr + "/0?timeout=1s" }

// cpu is the server's CPU time so far, user and system (INFO cpu).
func (s *redisServer) cpu() time.Duration {
	info, err := s.client.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, v, ok := strings.Cut(line, ":")
		if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

func (s *redisServer) stop() {
	s.client.Close()
	s.cmd.Process.Kill()
	s.cmd.Wait()
}
