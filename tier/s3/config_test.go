package s3

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"kvtier/chunk"
)

func parse(t *testing.T, raw string) (Config, error) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("url.Parse(%q): %v", raw, err)
	}
	return ParseURL(u)
}

func TestParseURL(t *testing.T) {
	c, err := parse(t, "s3://AK:S%2FK+x@my-bucket/a/b?endpoint=localhost:9000&region=eu-west-1&secure=false&path_style=true&create=1")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Bucket: "my-bucket", Prefix: "a/b/", Endpoint: "localhost:9000", Region: "eu-west-1",
		PathStyle: true, CreateBucket: true, AccessKey: "AK", SecretKey: "S/K+x",
	}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
}

func TestParseURLDefaults(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "envkey")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	t.Setenv("AWS_SESSION_TOKEN", "envtoken")
	c, err := parse(t, "s3://bucket")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Secure || c.PathStyle || c.CreateBucket || c.Prefix != DefaultPrefix {
		t.Fatalf("defaults wrong: %+v", c)
	}
	if c.AccessKey != "envkey" || c.SecretKey != "envsecret" || c.SessionToken != "envtoken" {
		t.Fatalf("environment credentials not used: %+v", c)
	}
	if d := c.withDefaults(); d.Endpoint != defaultEndpoint || d.Timeout != DefaultTimeout {
		t.Fatalf("withDefaults: %+v", d)
	}
	// The URL's credentials win as a whole: no session token is borrowed
	// from the environment for them.
	c, err = parse(t, "s3://urlkey:urlsecret@bucket/")
	if err != nil {
		t.Fatal(err)
	}
	if c.AccessKey != "urlkey" || c.SecretKey != "urlsecret" || c.SessionToken != "" || c.Prefix != DefaultPrefix {
		t.Fatalf("URL credentials: %+v", c)
	}
}

func TestParseURLErrors(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	cases := []struct{ url, mention string }{
		{"redis://k:s@bucket", "scheme"},
		{"s3://k:s@/prefix", "no bucket"},
		{"s3://k:s@Bad_Bucket", "Bad_Bucket"},
		{"s3://k:s@bucket?endpiont=x:1", "unknown parameter"},
		{"s3://k:s@bucket?secure=maybe", "secure"},
		{"s3://k:s@bucket?path_style=2", "path_style"},
		{"s3://k:s@bucket?endpoint=http://x:9000", "no scheme"},
		{"s3://k@bucket", "access:secret@"},
		{"s3://:s@bucket", "access:secret@"},
		{"s3://bucket", "AWS_ACCESS_KEY_ID"},
	}
	for _, c := range cases {
		_, err := parse(t, c.url)
		if !errors.Is(err, ErrBadURL) || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: error %v, want ErrBadURL mentioning %q", c.url, err, c.mention)
		}
	}
}

func FuzzParseURL(f *testing.F) {
	f.Add("s3://k:s@bucket/prefix?endpoint=h:1&secure=false&path_style=true&create=true")
	f.Add("s3://bucket")
	f.Add("s3://k:s@a..b/%2F?region=")
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		c, err := ParseURL(u)
		if err != nil {
			if !errors.Is(err, ErrBadURL) {
				t.Fatalf("error %v does not wrap ErrBadURL", err)
			}
			return
		}
		if c.Bucket == "" || !strings.HasSuffix(c.Prefix, "/") || c.AccessKey == "" || c.SecretKey == "" {
			t.Fatalf("accepted %q as %+v", raw, c)
		}
	})
}

func TestPresenceEvictsOldest(t *testing.T) {
	p := newPresence(3)
	key := func(i int) chunk.Key { return chunk.Key{Scope: uint64(i)} }
	for i := range 5 {
		p.add(key(i), int64(i*10))
	}
	if p.len() != 3 {
		t.Fatalf("len = %d, want 3", p.len())
	}
	for i := range 5 {
		n, ok := p.size(key(i))
		if want := i >= 2; ok != want || (ok && n != int64(i*10)) {
			t.Errorf("key %d: size %d, %v; want present=%v", i, n, ok, want)
		}
	}
	p.forget(key(3))
	if _, ok := p.size(key(3)); ok {
		t.Fatal("forgotten key still present")
	}
	p.add(key(4), 99) // update in place, no eviction
	if n, _ := p.size(key(4)); n != 99 || p.len() != 2 {
		t.Fatalf("update: size %d, len %d", n, p.len())
	}
}

func TestPresenceAllocFree(t *testing.T) {
	p := newPresence(64)
	for i := range 64 {
		p.add(chunk.Key{Scope: uint64(i)}, 1)
	}
	i := 64
	allocs := testing.AllocsPerRun(1000, func() {
		p.add(chunk.Key{Scope: uint64(i)}, 1)
		p.size(chunk.Key{Scope: uint64(i - 3)})
		i++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per add+lookup once full", allocs)
	}
}
