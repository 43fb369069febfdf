package admin

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/config"
)

// fixtureKeys lists the fixture's chunk keys, as "scope/hash" JSON strings.
func fixtureKeys(t *testing.T, f *fixture) []string {
	t.Helper()
	seen := map[chunk.Key]bool{}
	var out []string
	f.eng.ListChunks([]uint64{0}, func(_ string, k chunk.Key, _ int) bool {
		if !seen[k] {
			seen[k] = true
			out = append(out, `"`+k.String()+`"`)
		}
		return true
	})
	if len(out) != numChunks {
		t.Fatalf("fixture holds %d chunks, want %d", len(out), numChunks)
	}
	return out
}

// opCall posts body to a cluster operation and returns the status and
// the reply's counts (or its error).
func opCall(t *testing.T, f *fixture, path, body string) (int, map[string]int, string) {
	t.Helper()
	resp, text := do(t, "POST", f.url+path, body)
	var rep struct {
		cluster.DaemonReply
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(text), &rep); err != nil {
		t.Fatalf("%s: %d %q: %v", path, resp.StatusCode, text, err)
	}
	return resp.StatusCode, rep.Counts, rep.Error
}

func TestClusterOpsPinUnpin(t *testing.T) {
	f := newFixture(t, config.Default())
	keys := fixtureKeys(t, f)
	st, counts, msg := opCall(t, f, cluster.DaemonPinPath, `{"keys":[`+keys[0]+`,"9/000102030405060708090a0b0c0d0e0f"],"ttl_ms":60000}`)
	if st != 200 || counts["pinned"] != 1 || counts["pinned_mem"] != 1 || counts["pinned_disk"] != 1 || counts["missing"] != 1 || counts["ttl_ms"] != 60000 {
		t.Fatalf("pin: %d %v %s", st, counts, msg)
	}
	if f.eng.Stats().Arena.Leases != 1 {
		t.Fatalf("a pin in RAM holds %d leases, want 1", f.eng.Stats().Arena.Leases)
	}
	st, counts, _ = opCall(t, f, cluster.DaemonUnpinPath, `{"keys":[`+keys[0]+`]}`)
	if st != 200 || counts["unpinned"] != 1 || f.eng.Stats().Arena.Leases != 0 {
		t.Fatalf("unpin: %d %v, leases %d", st, counts, f.eng.Stats().Arena.Leases)
	}
	if _, counts, _ = opCall(t, f, cluster.DaemonUnpinPath, `{"keys":[`+keys[0]+`]}`); counts["not_pinned"] != 1 {
		t.Fatalf("unpin again: %v", counts)
	}
}

func TestClusterOpsErrors(t *testing.T) {
	f := newFixture(t, config.Default())
	keys := fixtureKeys(t, f)
	many := strings.TrimSuffix(strings.Repeat(keys[0]+",", cluster.MaxOpKeys+1), ",")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nobody listens there now
	for _, c := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{cluster.DaemonPinPath, `{"keys":[` + keys[0] + `]}`, 400, "ttl_ms"},
		{cluster.DaemonPinPath, `{"keys":[` + keys[0] + `],"ttl_ms":1,"x":1}`, 400, "unknown field"},
		{cluster.DaemonUnpinPath, `{"keys":["nope"]}`, 400, "chunk key"},
		{cluster.DaemonUnpinPath, `{"keys":[` + many + `]}`, 413, "at most"},
		{cluster.DaemonDropPath, `{"keys":[` + keys[0] + `]} {}`, 400, "after"},
		{cluster.DaemonClearPath, `{"tier":"s3"}`, 400, "not a local tier"},
		{cluster.DaemonClearPath, `{"scope":"1","model":"m"}`, 400, "not both"},
		{cluster.DaemonCopyPath, `{"keys":[` + keys[0] + `],"tier":"p2p"}`, 400, "not a local tier"},
		{cluster.DaemonPullPath, `{"keys":[` + keys[0] + `]}`, 400, "from"},
		{cluster.DaemonPullPath, `{"from":"` + dead + `","keys":[` + keys[0] + `]}`, 502, "refused"},
		{cluster.DaemonPullPath, `{"from":"` + strings.Repeat("x", cluster.MaxOpBodyBytes) + `"}`, 413, "too large"},
	} {
		st, _, msg := opCall(t, f, c.path, c.body)
		if st != c.status || !strings.Contains(msg, c.msg) {
			t.Errorf("%s %.80s: %d %q, want %d and %q", c.path, c.body, st, msg, c.status, c.msg)
		}
	}
	if resp, _ := do(t, "GET", f.url+cluster.DaemonPinPath, ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET pin: %d", resp.StatusCode)
	}
}

func TestClusterOpsClearAndDrop(t *testing.T) {
	f := newFixture(t, config.Default())
	keys := fixtureKeys(t, f)
	scope, _, _ := strings.Cut(strings.Trim(keys[0], `"`), "/")
	st, counts, msg := opCall(t, f, cluster.DaemonClearPath, `{"tier":"disk","scope":"ffff"}`)
	if st != 200 || counts["removed_disk"] != 0 {
		t.Fatalf("clear disk of another scope: %d %v %s", st, counts, msg)
	}
	st, counts, msg = opCall(t, f, cluster.DaemonClearPath, `{"tier":"disk","scope":"`+scope+`"}`)
	if st != 200 || counts["removed_disk"] != numChunks || len(counts) != 1 {
		t.Fatalf("clear disk of the scope: %d %v %s", st, counts, msg)
	}
	st, counts, _ = opCall(t, f, cluster.DaemonDropPath, fmt.Sprintf(`{"keys":[%s]}`, strings.Join(keys, ",")))
	if st != 200 || counts["dropped"] != numChunks || f.eng.Stats().Tiers[0].Objects != 0 {
		t.Fatalf("drop: %d %v, RAM holds %d", st, counts, f.eng.Stats().Tiers[0].Objects)
	}
	st, counts, _ = opCall(t, f, cluster.DaemonClearPath, `{"model":"unknown"}`)
	if st != 200 || len(counts) != 0 {
		t.Fatalf("clear of a model never seen: %d %v", st, counts)
	}
}
