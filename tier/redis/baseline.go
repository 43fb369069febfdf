package redis

import (
	"context"
	"fmt"
	"net/url"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Baseline is how long plain go-redis took to SET and to GET one value n
// times: the figure a benchmark of this tier is measured against.
type Baseline struct {
	Bytes    int // size of the value
	N        int // SETs and GETs each
	Set, Get time.Duration
}

// RawBaseline times n SETs and then n GETs of data under one scratch key
// with a go-redis client configured as the tier's would be for u, but
// without the tier: GET returns a freshly allocated value, as a plain
// go-redis user gets it. The scratch key is deleted afterwards.
func RawBaseline(ctx context.Context, u *url.URL, data []byte, n int) (Baseline, error) {
	cfg, err := parseURL(u)
	if err != nil {
		return Baseline{}, err
	}
	c := goredis.NewUniversalClient(clientOptions(cfg, time.Minute))
	defer c.Close()
	key := cfg.prefix + "baseline-scratch"
	defer c.Del(context.WithoutCancel(ctx), key)
	b := Baseline{Bytes: len(data), N: n}
	start := time.Now()
	for range n {
		if err := c.Set(ctx, key, data, 0).Err(); err != nil {
			return b, fmt.Errorf("redis baseline: set: %w", err)
		}
	}
	b.Set = time.Since(start)
	start = time.Now()
	for range n {
		got, err := c.Get(ctx, key).Bytes()
		if err != nil || len(got) != len(data) {
			return b, fmt.Errorf("redis baseline: get %d of %d bytes: %w", len(got), len(data), err)
		}
	}
	b.Get = time.Since(start)
	return b, nil
}
