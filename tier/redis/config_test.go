package redis

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"kvtier/tier/remote"
)

func TestParseURL(t *testing.T) {
	cases := []struct {
		raw  string
		want config
	}{
		{"redis://cache", config{topology: Standalone, addrs: []string{"cache:6379"}}},
		{"redis://u:p%40ss@cache:7000/3?prefix=a/b/&pool=8&ttl=24h&cache=0",
			config{topology: Standalone, addrs: []string{"cache:7000"}, db: 3, user: "u", pass: "p@ss",
				prefix: "a/b/", pool: 8, ttl: 24 * time.Hour, cacheSlots: -1}},
		{"redis://:secret@[::1]:7000/", config{topology: Standalone, addrs: []string{"[::1]:7000"}, pass: "secret"}},
		{"REDIS+CLUSTER://h1,h2:7001,h3:7002", config{topology: Cluster, addrs: []string{"h1:6379", "h2:7001", "h3:7002"}}},
		{"valkey+cluster://h1:7000", config{topology: Cluster, addrs: []string{"h1:7000"}}},
		{"redis+sentinel://s1,s2:5000/mymaster/2", config{topology: Sentinel, addrs: []string{"s1:26379", "s2:5000"}, master: "mymaster", db: 2}},
	}
	for _, c := range cases {
		got, err := parseURL(mustParse(t, c.raw))
		if err != nil {
			t.Errorf("%s: %v", c.raw, err)
			continue
		}
		if c.want.prefix == "" {
			c.want.prefix = DefaultPrefix
		}
		if c.want.cacheSlots == -1 { // the one case that turns the cache off
			c.want.cacheSlots = 0
		} else {
			c.want.cacheSlots = DefaultCacheSlots
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.raw, got, c.want)
		}
	}
}

func TestParseURLTLS(t *testing.T) {
	got, err := parseURL(mustParse(t, "rediss+cluster://h1:7000,h2:7000"))
	if err != nil {
		t.Fatal(err)
	}
	if got.tls == nil || got.tls.RootCAs != nil || len(got.tls.Certificates) != 0 {
		t.Fatalf("rediss+cluster: tls %+v, want system roots and no client certificate", got.tls)
	}
	if plain, _ := parseURL(mustParse(t, "redis://h")); plain.tls != nil {
		t.Fatal("redis:// has a TLS config")
	}
}

func TestParseBadURLs(t *testing.T) {
	bad := []string{
		"http://cache:6379",
		"redis://",
		"redis:cache",
		"redis://h1,h2",
		"redis://h:0",
		"redis://h:99999",
		"redis+cluster://h1,,h2",
		"redis://h/x",
		"redis://h/-1",
		"redis://h/1/2",
		"redis+cluster://h/1",
		"redis+sentinel://s1",
		"redis+sentinel://s1/m/x",
		"redis://h?pool=0",
		"redis://h?pool=x",
		"redis://h?ttl=soon",
		"redis://h?ttl=0s",
		"redis://h?cache=-1",
		"redis://h?poool=3",
		"redis://h?ca=/etc/hosts",
		"redis://h?%zz",
		"rediss://h?ca=/nonexistent.pem",
		"rediss://h?ca=/etc/hostname",
		"rediss://h?cert=/a.pem",
		"rediss://h?cert=/nonexistent.pem&key=/nonexistent.pem",
	}
	for _, raw := range bad {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s does not even parse as a URL: %v", raw, err)
		}
		if _, err := parseURL(u); !errors.Is(err, remote.ErrBadURL) {
			t.Errorf("%s: %v, want ErrBadURL", raw, err)
		}
	}
}

func TestBadURLHidesPassword(t *testing.T) {
	_, err := parseURL(mustParse(t, "redis://u:hunter2@h?nope=1"))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v shows the password", err)
	}
}

// FuzzParseURL feeds arbitrary text through the URL reader: it must return
// a config or an error, never panic, and a config it returns must be one
// the client can use.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"redis://u:p@h:1/2?prefix=x&pool=3&ttl=1h&cache=5",
		"rediss+cluster://a:1,b:2",
		"redis+sentinel://s:1/m/0",
		"valkey://h?ttl=1ms",
		"redis://h,/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		c, err := parseURL(u)
		if err != nil {
			return
		}
		if len(c.addrs) == 0 || c.db < 0 || c.pool < 0 || c.ttl < 0 || c.cacheSlots < 0 {
			t.Fatalf("%q gave unusable config %+v", raw, c)
		}
		if c.topology == Sentinel && c.master == "" {
			t.Fatalf("%q: sentinel config without master", raw)
		}
	})
}
