package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/wire"
)

// dialRaw opens a TCP connection to p and completes HELLO by hand, so the
// test can then send frames no client library would.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	hello := wire.Hello{Version: wire.Version, Name: "raw"}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(frame(wire.OpHello, 0, 0, hello.Append(nil))); err != nil {
		t.Fatal(err)
	}
	h, _, err := wire.NewReader(conn).Next()
	if err != nil || h.Status != wire.StatusOK {
		t.Fatalf("HELLO: %+v %v", h, err)
	}
	conn.SetDeadline(time.Time{})
	return conn
}

// stallHeader is a PING header announcing an 8 MiB body, followed by a
// few of its bytes: what a stalled or malicious client sends.
func stallHeader() []byte {
	b := make([]byte, wire.HeaderSize+100)
	wire.Header{Len: wire.MaxMetaBody, Op: wire.OpPing}.Put(b)
	return b
}

// checkServes runs a round of requests on a fresh client: PING, STORE and
// RETRIEVE of a few chunks with their bytes compared.
func checkServes(t *testing.T, addr string, salt uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.DialTCP(ctx, addr, client.Options{Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := c.Scope(ctx, pScope)
	if err != nil {
		t.Fatal(err)
	}
	keys := client.Tokens(h, prompt(4*c.ChunkTokens(), salt), 0)
	chunks := make([][]byte, 4)
	for j := range chunks {
		chunks[j] = chunkData(j, salt, 64<<10)
	}
	if n, err := c.Store(ctx, keys, chunks); err != nil || n != 4 {
		t.Fatalf("store: %d %v", n, err)
	}
	dst := make([][]byte, 4)
	for j := range dst {
		dst[j] = make([]byte, 64<<10)
	}
	n, _, err := c.Retrieve(ctx, keys, dst)
	if err != nil || n != 4 {
		t.Fatalf("retrieve: %d %v", n, err)
	}
	for j := range dst {
		if !bytes.Equal(dst[j], chunks[j]) {
			t.Fatalf("chunk %d came back different", j)
		}
	}
}

// TestStalledClientsHoldLittleMemory connects 256 clients that each send
// a header announcing an 8 MiB body and then stall. The daemon may hold
// no more than 64 MiB more for all of them together, must keep serving
// others meanwhile, and must give the memory back once they are gone.
func TestStalledClientsHoldLittleMemory(t *testing.T) {
	const stalled = 256
	p := startProc(t, t.TempDir(), "chunk_size: 16\nmax_local_cpu_size: 0.0625\nmax_connections: 300\nframe_timeout: 2m\n")
	checkServes(t, p.TCP, 1)
	waitFor(t, "the first client to go", func() bool { return p.metric(t, "kvtier_client_connections") == 0 })
	before := p.rss(t)

	conns := make([]net.Conn, 0, stalled)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range stalled {
		c := dialRaw(t, p.TCP)
		conns = append(conns, c)
		if _, err := c.Write(stallHeader()); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every stalled client to be served", func() bool {
		return p.metric(t, "kvtier_client_connections") == stalled
	})
	checkServes(t, p.TCP, 2) // answered while they stall
	during := p.rss(t)

	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	waitFor(t, "the stalled clients to go", func() bool { return p.metric(t, "kvtier_client_connections") == 0 })
	checkServes(t, p.TCP, 3)
	after := p.rss(t)
	t.Logf("daemon VmRSS: before %.1f MiB, with %d stalled clients %.1f MiB, after they left %.1f MiB",
		mib(before), stalled, mib(during), mib(after))
	if during > before+64<<20 {
		t.Errorf("%d stalled clients grew the daemon's RSS by %.1f MiB, more than 64 MiB", stalled, mib(during-before))
	}
	if after > before+64<<20 {
		t.Errorf("after the stalled clients left the daemon's RSS is %.1f MiB above where it started", mib(after-before))
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestConnectionCap fills max_connections and checks that one more client
// is told why it is refused, and gets in once a slot is free.
func TestConnectionCap(t *testing.T) {
	p := startProc(t, t.TempDir(), "chunk_size: 16\nmax_local_cpu_size: 0.0625\nmax_connections: 4\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var open []*client.Client
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range 4 {
		c, err := client.DialTCP(ctx, p.TCP, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	_, err := client.DialTCP(ctx, p.TCP, client.Options{})
	if !client.IsStatus(err, wire.StatusNoSpace) || !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("a fifth connection: %v, want NO_SPACE naming max_connections", err)
	}
	if _, err := client.DialUnix(ctx, p.Sock, client.Options{}); !client.IsStatus(err, wire.StatusNoSpace) {
		t.Fatalf("a fifth connection on the local socket: %v, want NO_SPACE", err)
	}
	if got := p.metric(t, "kvtier_connections_refused_total"); got != 2 {
		t.Errorf("kvtier_connections_refused_total = %v, want 2", got)
	}
	for _, c := range open[:4] {
		if err := c.Ping(ctx); err != nil {
			t.Fatalf("a client within the cap: %v", err)
		}
	}
	open[0].Close()
	open = open[1:]
	waitFor(t, "a connection to close", func() bool { return p.metric(t, "kvtier_client_connections") == 3 })
	c, err := client.DialTCP(ctx, p.TCP, client.Options{})
	if err != nil {
		t.Fatalf("after one left: %v", err)
	}
	open = append(open, c)
}

// TestFrameTimeout stalls in the middle of a frame, of a metadata body and
// of a STORE's chunk bytes: each gets an error reply naming frame_timeout
// and loses its connection, and what the STORE reserved is freed.
func TestFrameTimeout(t *testing.T) {
	p := startProc(t, t.TempDir(), "chunk_size: 16\nmax_local_cpu_size: 0.0625\nframe_timeout: 500ms\n")
	usedBefore := arenaUsed(t, p)

	half := make([]byte, wire.HeaderSize+10)
	wire.Header{Len: 1000, Op: wire.OpPing, ID: 7}.Put(half)

	store := wire.Store{Keys: wire.Keys{Kind: wire.KindRaw, Raw: []chunk.Key{{Scope: 1, Hash: chunk.Hash{1}}}}, Sizes: []uint32{1 << 20}}
	var partStore []byte
	partStore = append(partStore, frame(wire.OpStore, wire.FlagMore, 8, store.Append(nil))...)
	dataHdr := make([]byte, wire.HeaderSize)
	wire.Header{Len: 1 << 20, Op: wire.OpStore, ID: 8}.Put(dataHdr)
	partStore = append(partStore, dataHdr...)
	partStore = append(partStore, make([]byte, 4096)...)

	for name, send := range map[string][]byte{"metadata body": half, "chunk bytes": partStore} {
		t.Run(name, func(t *testing.T) {
			c := dialRaw(t, p.TCP)
			defer c.Close()
			if _, err := c.Write(send); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(30 * time.Second)) // generous: the daemon's is 500ms
			rd := wire.NewReader(c)
			h, body, err := rd.Next()
			if err != nil {
				t.Fatalf("no reply to a stalled frame: %v", err)
			}
			if h.Status == wire.StatusOK || !strings.Contains(string(body), "frame_timeout") {
				t.Fatalf("reply %s %q, want an error naming frame_timeout", h.Status, body)
			}
			if _, err := rd.Header(); !errors.Is(err, io.EOF) {
				t.Errorf("the connection stayed open after a frame timed out: %v", err)
			}
		})
	}
	waitFor(t, "the stalled STORE's reservation to be freed", func() bool { return arenaUsed(t, p) == usedBefore })
	checkServes(t, p.TCP, 4)
}

func arenaUsed(t *testing.T, p *proc) int64 {
	t.Helper()
	resp, err := http.Get(p.Admin + "/api/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st engine.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Arena.UsedBytes
}
