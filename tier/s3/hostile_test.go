package s3

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kvtier/tier"
)

// TestMisbehavingServer points the tier at an HTTP server that answers
// object GETs the way no S3 server should: every answer must become an
// error, never a panic or a silently short object.
func TestMisbehavingServer(t *testing.T) {
	var mode atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead || !strings.Contains(strings.TrimPrefix(r.URL.Path, "/"), "/") {
			return // bucket checks succeed
		}
		switch mode.Load() {
		case "chunked": // no Content-Length
			w.Write([]byte("part"))
			w.(http.Flusher).Flush()
			w.Write([]byte("rest"))
		case "short": // promises 100 bytes, sends 10
			w.Header().Set("Content-Length", "100")
			w.Write([]byte("0123456789"))
		case "huge":
			w.Header().Set("Content-Length", "1099511627776")
		case "garbage-error":
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte("<Error><Code>\x00\xff"))
		}
	}))
	defer srv.Close()
	tr, err := New(context.Background(), Config{
		Bucket: "bkt", Endpoint: strings.TrimPrefix(srv.URL, "http://"), PathStyle: true,
		Region: "us-east-1", AccessKey: "a", SecretKey: "s", Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, m := range []string{"chunked", "short", "huge", "garbage-error"} {
		mode.Store(m)
		n, err := tr.Get(context.Background(), testKey(1), make([]byte, 200))
		if err == nil || errors.Is(err, tier.ErrNotFound) {
			t.Errorf("%s: Get = %d, %v; want an error other than ErrNotFound", m, n, err)
		}
	}
}
