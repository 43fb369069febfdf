package p2p_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/internal/servetest"
)

// The tests in this file run real `kvtier serve` processes on loopback,
// each with its own socket, ports and directory, so that what crosses
// between daemons is exactly what would between hosts.

func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}

// proc is a running `kvtier serve` (package servetest).
type proc struct{ *servetest.Daemon }

// startProc runs `kvtier serve` on conf plus a private socket, loopback
// ports picked by the kernel (unless conf names tcp_addr), data dir and
// the tests' TCP token.
func startProc(t *testing.T, conf string) *proc {
	t.Helper()
	return &proc{servetest.Start(t, t.TempDir(), conf+"\ntcp_token: "+token+"\n")}
}

// kill ends the daemon with SIGKILL: nothing of its shutdown runs, as
// when a node dies.
func (p *proc) kill() { p.Kill() }

func dial(t *testing.T, addr string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.DialTCP(ctx, addr, client.Options{Token: token, Name: "p2p-test", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// peerCircuit reads the state of the P2P tier's breaker for peer from the
// admin API.
func peerCircuit(t *testing.T, p *proc, peer string) string {
	t.Helper()
	resp, err := http.Get(p.Admin + "/api/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Tiers []struct {
			Name  string            `json:"name"`
			Peers map[string]string `json:"peers"`
		} `json:"tiers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, tr := range st.Tiers {
		if tr.Name == "p2p" {
			return tr.Peers[peer]
		}
	}
	t.Fatal("daemon 2 has no p2p tier")
	return ""
}

// metric returns the value of one sample of daemon p's /metrics.
func metric(t *testing.T, p *proc, sample string) string { return p.Metric(t, sample) }

// TestProcessesPullAcrossDaemons is the proof with real processes:
// daemon 1 stores chunks, daemon 2 (p2p_peers: daemon 1) retrieves them
// byte-exact from its RAM, then from its disk once they were evicted
// from RAM, and misses cleanly, in bounded time, once daemon 1 is killed,
// with the peer's circuit open.
func TestProcessesPullAcrossDaemons(t *testing.T) {
	const size = 256 << 10
	// 4 MiB of RAM: 40 chunks of 256 KiB push the first ones to disk.
	d1 := startProc(t, "chunk_size: 16\nmax_local_cpu_size: 0.00390625\nmax_local_disk_size: 0.0625\nlocal_disk: "+t.TempDir())
	d2 := startProc(t, "chunk_size: 16\nmax_local_cpu_size: 0.0625\np2p_peers: ["+d1.TCP+"]")
	c1, c2 := dial(t, d1.TCP), dial(t, d2.TCP)
	ctx := context.Background()

	put := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if n, err := c1.Store(ctx, client.Raw([]chunk.Key{key(i)}), [][]byte{payload(i, size)}); err != nil || n != 1 {
				t.Fatalf("store chunk %d on daemon 1: %d, %v", i, n, err)
			}
			if _, err := c1.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	get := func(c *client.Client, i int) (bool, error) {
		dst := [][]byte{make([]byte, size)}
		n, _, err := c.Retrieve(ctx, client.Raw([]chunk.Key{key(i)}), dst)
		if err != nil || n == 0 {
			return false, err
		}
		if !bytes.Equal(dst[0], payload(i, size)) {
			t.Fatalf("chunk %d came back different", i)
		}
		return true, nil
	}

	// From daemon 1's RAM.
	put(0, 4)
	for i := range 4 {
		if ok, err := get(c2, i); !ok || err != nil {
			t.Fatalf("chunk %d in daemon 1's RAM, from daemon 2: %v, %v", i, ok, err)
		}
	}

	// From daemon 1's disk: chunks 10..11 are pushed out of its RAM by
	// those stored after them.
	put(10, 50)
	sizes, err := dial(t, d1.TCP).Sizes(ctx, client.Raw([]chunk.Key{key(10)}))
	if err != nil || len(sizes) != 1 {
		t.Fatalf("chunk 10 is gone from daemon 1: %v, %v", sizes, err)
	}
	hit, err := c1.Lookup(ctx, client.Raw([]chunk.Key{key(10), key(11)}), 0)
	if err != nil || hit.Chunks != 2 || hit.ByTier[0] != 0 {
		t.Fatalf("chunks 10, 11 on daemon 1: %+v, %v; want both on disk, none in RAM", hit, err)
	}
	for _, i := range []int{10, 11} {
		if ok, err := get(c2, i); !ok || err != nil {
			t.Fatalf("chunk %d on daemon 1's disk, from daemon 2: %v, %v", i, ok, err)
		}
	}

	// Daemon 1 dies: misses, no errors, bounded time, then an open circuit.
	d1.kill()
	deadline := time.Now().Add(10 * time.Second)
	for i := 20; ; i++ {
		start := time.Now()
		ok, err := get(c2, i)
		if ok || err != nil {
			t.Fatalf("chunk %d after daemon 1 died: hit %v, err %v; want a clean miss", i, ok, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("a miss on a dead peer took %v", el)
		}
		if peerCircuit(t, d2, d1.TCP) == "open" {
			if m := metric(t, d2, `kvtier_p2p_peer_circuit_state{peer="`+d1.TCP+`"}`); m != "1" {
				t.Fatalf("kvtier_p2p_peer_circuit_state = %q, want 1 (open)", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon 1's circuit never opened on daemon 2")
		}
	}
	// Chunks pulled before still serve from daemon 2's own RAM.
	if ok, err := get(c2, 0); !ok || err != nil {
		t.Fatalf("chunk 0, promoted on daemon 2 before daemon 1 died: %v, %v", ok, err)
	}
}
