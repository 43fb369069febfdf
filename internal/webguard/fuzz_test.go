package webguard

import (
	"net/http/httptest"
	"regexp"
	"testing"
)

// plainHost is a host name or IPv4 address with an optional port.
var plainHost = regexp.MustCompile(`^[A-Za-z0-9.-]+(:[0-9]{1,5})?$`)

// FuzzHeaders: any Host, Origin and Sec-Fetch-Site give an answer, never
// a panic, and a request whose Origin is its own scheme and host is never
// called cross-site when it carries no fetch metadata.
func FuzzHeaders(f *testing.F) {
	f.Add("127.0.0.1:7480", "http://127.0.0.1:7480", "")
	f.Add("[::1]:7480", "null", "cross-site")
	f.Add("localhost", "http://[::1", "same-site")
	f.Add("%zz", "://", "none")
	f.Fuzz(func(t *testing.T, host, origin, site string) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Host = host
		r.Header.Set("Origin", origin)
		r.Header.Set("Sec-Fetch-Site", site)
		CrossSite(r)
		LoopbackHost(r)
		own := httptest.NewRequest("POST", "/", nil)
		own.Host = host
		own.Header.Set("Origin", "http://"+host)
		if plainHost.MatchString(host) && CrossSite(own) != "" {
			t.Errorf("own origin http://%s called cross-site: %s", host, CrossSite(own))
		}
	})
}
