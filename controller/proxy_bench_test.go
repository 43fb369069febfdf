package controller

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkProxy measures what the proxy adds to a request, against the
// fake engines (fakeEngine; vLLM cannot run here) on loopback:
//
//   - direct-decode: the client posts the decode request to the decode
//     engine itself, one round trip (the floor for any answer);
//   - direct-two-stage: the client runs both stages itself, prefill then
//     decode, as a proxy-less deployment would;
//   - proxy: the client posts once to the proxy, which runs both.
//
// BenchmarkProxyRatio times the three interleaved in one loop and reports
// proxy time over each baseline, so machine load cancels out.
func BenchmarkProxy(b *testing.B) {
	rig, direct := benchRig(b)
	b.Run("direct-decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchPost(b, direct.decodeURL, direct.decodeBody)
		}
	})
	b.Run("direct-two-stage", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchPost(b, direct.prefillURL, direct.prefillBody)
			benchPost(b, direct.decodeURL, direct.decodeBody)
		}
	})
	b.Run("proxy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchPost(b, rig.srv.URL+"/v1/completions", direct.clientBody)
		}
	})
}

func BenchmarkProxyRatio(b *testing.B) {
	rig, direct := benchRig(b)
	var one, two, via time.Duration
	for b.Loop() {
		t0 := time.Now()
		benchPost(b, direct.decodeURL, direct.decodeBody)
		t1 := time.Now()
		benchPost(b, direct.prefillURL, direct.prefillBody)
		benchPost(b, direct.decodeURL, direct.decodeBody)
		t2 := time.Now()
		benchPost(b, rig.srv.URL+"/v1/completions", direct.clientBody)
		t3 := time.Now()
		one, two, via = one+t1.Sub(t0), two+t2.Sub(t1), via+t3.Sub(t2)
	}
	b.ReportMetric(float64(via)/float64(one), "proxy/direct-decode")
	b.ReportMetric(float64(via)/float64(two), "proxy/direct-two-stage")
	b.ReportMetric(float64(via-two)/float64(b.N)/1e3, "added-µs/op")
}

// benchBodies are the requests of the three ways to get an answer.
type benchBodies struct {
	prefillURL, decodeURL               string
	clientBody, prefillBody, decodeBody []byte
}

func benchRig(b *testing.B) (*pdRig, benchBodies) {
	rig := newRig(b, 1, 1, nil)
	client := []byte(`{"model":"m","prompt":"Summarize the following text in one sentence: the quick brown fox jumps over the lazy dog.","max_tokens":16,"temperature":0}`)
	req, err := parseCompletion(client)
	if err != nil {
		b.Fatal(err)
	}
	pre, _ := req.prefillBody(newTransferID(), "127.0.0.1:"+daemonPort("d1"))
	dec, _ := req.decodeBody([]byte(`{"do_remote_prefill":true,"do_remote_decode":false,"kvtier_transfer_id":"00","remote_block_ids":[4,5,6]}`))
	return rig, benchBodies{
		prefillURL: rig.pre[0].srv.URL + "/v1/completions", decodeURL: rig.dec[0].srv.URL + "/v1/completions",
		clientBody: client, prefillBody: pre, decodeBody: dec,
	}
}

func benchPost(b *testing.B, url string, body []byte) {
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s: status %d", url, resp.StatusCode)
	}
}
