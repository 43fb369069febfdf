package remote

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"kvtier/tier"
)

// The registry is process-global, so each test registers schemes of its own
// through register, which removes them again at cleanup (for -count=N).
func register(t *testing.T, scheme string, open OpenFunc) {
	Register(scheme, open)
	t.Cleanup(func() {
		registry.Lock()
		delete(registry.open, scheme)
		registry.Unlock()
	})
}

func TestOpenPicksBackendByScheme(t *testing.T) {
	var got *url.URL
	var gotOpts Options
	f := newFake()
	register(t, "test-pick", func(ctx context.Context, u *url.URL, o Options) (tier.Tier, error) {
		got, gotOpts = u, o
		return f, nil
	})
	tr, err := Open(context.Background(), "TEST-PICK://host:1/db?x=1", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if tr != f || got.Host != "host:1" || got.Query().Get("x") != "1" {
		t.Fatalf("backend got %v and returned %v", got, tr)
	}
	if gotOpts.Timeout != DefaultTimeout || gotOpts.Logger == nil {
		t.Fatalf("defaults not applied: %+v", gotOpts)
	}
	if s := Names(); !contains(s, "test-pick") {
		t.Fatalf("Names() = %v", s)
	}
}

func TestOpenErrors(t *testing.T) {
	register(t, "test-err", func(ctx context.Context, u *url.URL, o Options) (tier.Tier, error) {
		return nil, fmt.Errorf("dial %s as %s: %w", u.Host, u.String(), tier.ErrBusy)
	})
	for _, tc := range []struct {
		url  string
		want error
		has  []string
	}{
		{"nosuch://u:hunter2@h/", ErrUnknownScheme, []string{`"nosuch"`, "test-err", "u:xxxxx@h"}},
		{"host:6379", ErrUnknownScheme, []string{`"host"`}},
		{"/just/a/path", ErrBadURL, []string{"no scheme", "test-err"}},
		{"test-err://u:hunter2@h:99%zz/", ErrBadURL, []string{"u:xxxxx@h"}},
		{"test-err://u:hunter2@h:1/", tier.ErrBusy, []string{"dial h:1", "xxxxx"}},
		{"test-err://u:hun%20ter2@h:1/", tier.ErrBusy, []string{"dial h:1", "xxxxx"}},
	} {
		_, err := Open(context.Background(), tc.url, Options{})
		if !errors.Is(err, tc.want) {
			t.Errorf("Open(%q) = %v, want %v", tc.url, err, tc.want)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "hunter2") || strings.Contains(msg, "ter2") {
			t.Errorf("Open(%q) leaks the password: %s", tc.url, msg)
		}
		for _, h := range tc.has {
			if !strings.Contains(msg, h) {
				t.Errorf("Open(%q) error %q lacks %q", tc.url, msg, h)
			}
		}
	}
}

func TestRegisterPanics(t *testing.T) {
	open := func(context.Context, *url.URL, Options) (tier.Tier, error) { return nil, nil }
	register(t, "test-dup", open)
	for name, fn := range map[string]func(){
		"duplicate":    func() { Register("Test-Dup", open) },
		"nil open":     func() { Register("test-nil", nil) },
		"empty scheme": func() { Register("", open) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Register did not panic", name)
				}
			}()
			fn()
		}()
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:secret@h:6379/0":       "redis://:xxxxx@h:6379/0",
		"s3://AKIA:sk/x@bucket/p?q=1":    "s3://AKIA:sk/x@bucket/p?q=1", // "/" ends the authority: no user info
		"s3://AKIA:s%2Fk@bucket/p":       "s3://AKIA:xxxxx@bucket/p",
		"redis://user@h":                 "redis://user@h",
		"redis://u:p@ss@h/":              "redis://u:xxxxx@h/",
		"fs:///data/kv":                  "fs:///data/kv",
		"not a url":                      "not a url",
		"redis://u:pw@h?x=a@b#frag@more": "redis://u:xxxxx@h?x=a@b#frag@more",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzRedact checks that Redact never panics and, whenever net/url finds a
// password, removes it the same way url.URL.Redacted does.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{"redis://:pw@h/0", "s3://a:b@c?d#e", "x://@", "://:@", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		red := Redact(raw)
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		if _, has := u.User.Password(); !has {
			return
		}
		r, err := url.Parse(red)
		if err != nil {
			t.Fatalf("Redact(%q) = %q does not parse: %v", raw, red, err)
		}
		if pw, _ := r.User.Password(); pw != "xxxxx" || r.Host != u.Host {
			t.Fatalf("Redact(%q) = %q: password %q host %q, want xxxxx and %q", raw, red, pw, r.Host, u.Host)
		}
	})
}

func TestHealthStateNames(t *testing.T) {
	for s, want := range map[State]string{StateClosed: "closed", StateOpen: "open", StateHalfOpen: "half-open", 9: "State(9)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), want)
		}
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
