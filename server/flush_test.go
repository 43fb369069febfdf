package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"kvtier/admin"
	"kvtier/client"
)

// TestFlushThenKill stores chunks on a daemon with a disk tier whose write
// queue is tiny and never waited for, so most disk writes are dropped at
// first; FLUSH must still leave every chunk on disk. The daemon is then
// killed with SIGKILL and restarted on the same directory: every chunk
// must come back with its bytes.
func TestFlushThenKill(t *testing.T) {
	const n = 64
	dir := t.TempDir()
	conf := "chunk_size: 16\nmax_local_cpu_size: 0.0625\nlocal_disk: " + filepath.Join(dir, "disk") +
		"\nmax_local_disk_size: 0.125\ndisk_segment_size: 4MiB\nwrite_queue_depth: 1\nwrite_wait: 0\n"
	p := startProc(t, dir, conf)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	c, err := client.DialTCP(ctx, p.TCP, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	keys := client.Tokens(h, prompt(n*c.ChunkTokens(), 9), 0)
	chunks := make([][]byte, n)
	for j := range chunks {
		chunks[j] = chunkData(j, 9, 64<<10)
	}
	if got, err := c.Store(ctx, keys, chunks); err != nil || got != n {
		t.Fatalf("store: %d %v", got, err)
	}
	rep, err := c.Flush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Tiers) != 1 || rep.Tiers[0].Name != "disk" || !rep.Durable() {
		t.Fatalf("FLUSH reply %+v: want the disk tier, durable", rep)
	}
	t.Logf("FLUSH: %+v", rep.Tiers[0])
	if res := adminFlush(t, p); !res.Durable || len(res.Tiers) != 1 || res.Tiers[0].Tier != "disk" {
		t.Fatalf("POST /api/v1/flush: %+v", res)
	}
	c.Close()
	p.kill()

	p = startProc(t, dir, conf)
	c, err = client.DialTCP(ctx, p.TCP, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err = c.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([][]byte, n)
	for j := range dst {
		dst[j] = make([]byte, 64<<10)
	}
	got, _, err := c.Retrieve(ctx, client.Tokens(h, prompt(n*c.ChunkTokens(), 9), 0), dst)
	if err != nil || got != n {
		t.Fatalf("after SIGKILL and restart %d of %d flushed chunks came back (%v)", got, n, err)
	}
	for j := range dst {
		if !bytes.Equal(dst[j], chunks[j]) {
			t.Fatalf("chunk %d came back with other bytes", j)
		}
	}
}

func adminFlush(t *testing.T, p *proc) admin.FlushResult {
	t.Helper()
	resp, err := http.Post(p.Admin+"/api/v1/flush?timeout=30s", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res admin.FlushResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatal(err)
	}
	if (resp.StatusCode == http.StatusOK) != res.Durable {
		t.Errorf("status %d for durable %v", resp.StatusCode, res.Durable)
	}
	return res
}
