package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"kvtier/client"
	"kvtier/internal/redistest"
)

// redisSaveConf is a daemon with RAM and a Redis tier, no disk, for the
// layered scope.
func redisSaveConf(url string) string {
	return "chunk_size: 16\nmax_local_cpu_size: 0.0625\nremote_url: " + url + "?timeout=5s\ntcp_token: " + testToken
}

// redisQueue is the Redis tier's write queue in STATS.
type redisQueue struct {
	LayerSaved uint64 `json:"layer_saved"`
	LayerBytes uint64 `json:"layer_bytes"`
}

func redisQueueStats(t *testing.T, c *client.Client) redisQueue {
	t.Helper()
	raw, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Queues []struct {
			Tier string `json:"tier"`
			redisQueue
		} `json:"queues"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	for _, q := range st.Queues {
		if q.Tier == "redis" {
			return q.redisQueue
		}
	}
	t.Fatalf("no redis queue in STATS: %s", raw)
	return redisQueue{}
}

// redisKeys returns the object keys and the staging keys in the server.
func redisKeys(t *testing.T, c *goredis.Client) (objects, staging []string) {
	t.Helper()
	keys, err := c.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, "}:stage:") {
			staging = append(staging, k)
		} else {
			objects = append(objects, k)
		}
	}
	return objects, staging
}

// TestStoreLayerRedisKilledProcess saves through a real daemon whose only
// lower tier is a real redis-server. A prompt saved layer by layer and
// committed is published in Redis from its range writes (STATS) and reads
// back byte-exact from Redis after a restart. A second prompt is killed
// (SIGKILL) after six of eight layers reached Redis and before its
// commit: the restarted daemon serves none of it, Redis holds no object
// for it, and the staging keys the killed daemon left expire on their own.
func TestStoreLayerRedisKilledProcess(t *testing.T) {
	srv := redistest.Start(t)
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr, DisableIdentity: true})
	defer raw.Close()
	dir := t.TempDir()
	p := startProc(t, dir, redisSaveConf(srv.URL()))
	c := mustDial(t, p, true, testToken)
	ctx := context.Background()
	h, err := c.Scope(ctx, layerScope)
	if err != nil {
		t.Fatal(err)
	}
	kept := prompt(2*pChunkTokens, 51)
	slots, keptData := prepareLayered(t, c, h, kept, 3)
	fillAndNotice(t, c, slots, keptData, 0, layerCount)
	if n, err := c.CommitStore(ctx, slots.Lease, 2); err != nil || n != 2 {
		t.Fatalf("commit: %d %v", n, err)
	}
	if rep, err := c.Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("FLUSH: %+v %v", rep, err)
	}
	if q := redisQueueStats(t, c); q.LayerSaved != 2 || q.LayerBytes != 2*layerCount*2*layerSpan {
		t.Fatalf("Redis queue %+v: want 2 objects saved by layers, every layer's bytes", q)
	}
	before, staged := redisKeys(t, raw)
	if len(before) != 2 || len(staged) != 0 {
		t.Fatalf("after the committed save Redis holds %v and staging keys %v", before, staged)
	}

	tokens := prompt(4*pChunkTokens, 52)
	slots, data := prepareLayered(t, c, h, tokens, 4)
	fillAndNotice(t, c, slots, data, 0, 6)
	for deadline := time.Now().Add(10 * time.Second); redisQueueStats(t, c).LayerBytes < (2*layerCount+4*6)*2*layerSpan; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("six layers of four chunks not in Redis: %+v", redisQueueStats(t, c))
		}
	}
	if objects, staging := redisKeys(t, raw); len(objects) != 2 || len(staging) != 4 {
		t.Fatalf("mid-save Redis holds objects %v, staging keys %v; want the 2 committed, 4 staging", objects, staging)
	}
	p.kill()

	p = startProc(t, dir, redisSaveConf(srv.URL()))
	c = mustDial(t, p, true, testToken)
	if h, err = c.Scope(ctx, layerScope); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Lookup(ctx, client.Tokens(h, tokens, 0), 0); err != nil || r.Chunks != 0 {
		t.Fatalf("after the kill the uncommitted prompt looks up as %+v, %v; want no chunk", r, err)
	}
	if got, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 0); err != nil || len(got.Slots) != 0 {
		t.Fatalf("after the kill the uncommitted prompt retrieves %d chunks, %v", len(got.Slots), err)
	}
	objects, staging := redisKeys(t, raw)
	if len(objects) != 2 || len(staging) != 4 {
		t.Fatalf("after the kill Redis holds objects %v, staging keys %v", objects, staging)
	}
	for _, k := range staging {
		if ttl, err := raw.PTTL(ctx, k).Result(); err != nil || ttl <= 0 || ttl > time.Minute {
			t.Fatalf("staging key %s: TTL %v, %v; want it to expire within a minute", k, ttl, err)
		}
	}
	got, err := c.PrepareRetrieve(ctx, client.Tokens(h, kept, 0), 60_000)
	if err != nil || len(got.Slots) != 2 {
		t.Fatalf("the committed prompt from Redis: %+v %v", got, err)
	}
	for j, s := range got.Slots {
		if b, _ := c.Slot(s); !bytes.Equal(b, keptData[j]) {
			t.Fatalf("committed chunk %d: wrong bytes from Redis", j)
		}
	}
	c.Release(ctx, got.Lease)
}
