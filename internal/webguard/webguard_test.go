package webguard

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"
)

func TestToken(t *testing.T) {
	tok := NewToken("s3cret")
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"Bearer s3cret", true},
		{"", false},
		{"Bearer s3cre", false},
		{"Bearer s3cret ", false},
		{"bearer s3cret", false},
		{"Basic s3cret", false},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got := tok.Match(r); got != tc.want {
			t.Errorf("Authorization %q: match %v, want %v", tc.header, got, tc.want)
		}
	}
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("Authorization", "Bearer ")
	if NewToken("").Set() || NewToken("").Match(r) {
		t.Error("the empty token is set or matches")
	}
}

func TestCrossSite(t *testing.T) {
	for _, tc := range []struct {
		name, host, origin, site string
		tls                      bool
		cross                    bool
	}{
		{"curl", "127.0.0.1:7480", "", "", false, false},
		{"own origin", "127.0.0.1:7480", "http://127.0.0.1:7480", "same-origin", false, false},
		{"typed in the address bar", "127.0.0.1:7480", "", "none", false, false},
		{"foreign page", "127.0.0.1:7480", "http://evil.example", "cross-site", false, true},
		{"foreign origin only", "127.0.0.1:7480", "http://evil.example", "", false, true},
		{"same site other port", "127.0.0.1:7480", "http://127.0.0.1:8000", "same-site", false, true},
		{"other port, no fetch metadata", "127.0.0.1:7480", "http://127.0.0.1:8000", "", false, true},
		{"scheme differs", "node:7480", "http://node:7480", "", true, true},
		{"https own origin", "node:7480", "https://node:7480", "", true, false},
		{"null origin", "127.0.0.1:7480", "null", "", false, true},
		{"fetch metadata wins", "127.0.0.1:7480", "http://127.0.0.1:7480", "cross-site", false, true},
	} {
		r := httptest.NewRequest("POST", "/api/v1/clear", nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.site != "" {
			r.Header.Set("Sec-Fetch-Site", tc.site)
		}
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		} else {
			r.TLS = nil
		}
		if why := CrossSite(r); (why != "") != tc.cross {
			t.Errorf("%s: CrossSite = %q, want cross %v", tc.name, why, tc.cross)
		}
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1:7480": true, "localhost:7480": true, "LOCALHOST": true, "[::1]:7480": true,
		"127.1.2.3": true, "localhost.:80": true,
		"evil.example:7480": false, "10.0.0.1:7480": false, "": false, "[::]:7480": false,
		"localhost.evil.example": false,
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		if got := LoopbackHost(r); got != want {
			t.Errorf("Host %q: loopback %v, want %v", host, got, want)
		}
	}
}
