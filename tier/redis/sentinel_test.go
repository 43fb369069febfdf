package redis

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// startSentinel runs redis-server in sentinel mode watching master under
// the name "mymaster" and returns its address.
func startSentinel(t *testing.T, master *server) string {
	t.Helper()
	bin := needBinary(t, "redis-server")
	dir := t.TempDir()
	port := freePort(t, false)
	conf := filepath.Join(dir, "sentinel.conf") // sentinel rewrites it: it must be writable
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\n", port, dir, master.port)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	logs, err := os.Create(filepath.Join(dir, "sentinel.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logs.Close()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := goredis.NewSentinelClient(&goredis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	waitFor(t, "sentinel at "+addr, func() error {
		return c.GetMasterAddrByName(context.Background(), "mymaster").Err()
	})
	return addr
}

func TestSentinel(t *testing.T) {
	master := startServer(t)
	master.waitReady()
	sentinel := startSentinel(t, master)
	tr := openTier(t, "redis+sentinel://"+sentinel+"/mymaster/2")
	if tr.topology != Sentinel {
		t.Fatalf("topology %v, want Sentinel", tr.topology)
	}
	ctx := context.Background()
	k := testKey(uniqueScope(), 0)
	data := payload(4<<20, 6)
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	// The value is on the master the sentinel named, in database 2.
	raw := goredis.NewClient(&goredis.Options{Addr: master.addr(), DB: 2, DisableIdentity: true})
	defer raw.Close()
	got, err := raw.Get(ctx, tr.keyName(k)).Bytes()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("value on master: %d bytes, %v", len(got), err)
	}
	dst := make([]byte, len(data))
	if n, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("sentinel round trip: %d, %v", n, err)
	}
}
