package chaos

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/internal/servetest"
	"kvtier/wire"
)

// The workload: one-chunk prompts of chunkTokens tokens, each with a
// chunkBytes payload that names itself (run and index in its first 16
// bytes) and is otherwise pseudo-random, so a damaged or misplaced chunk
// can never pass for a right one, and a record found in a disk segment
// says which chunk it holds.
const (
	chunkTokens = 16
	chunkBytes  = 64 << 10
	hang        = 30 * time.Second // a liveness bound, not a measurement
)

var scope = chunk.Scope{Model: "chaos-model", WorldSize: 1, Format: "bfloat16/KV_2LTD"}

// baseConf is the configuration every fault's daemon starts from.
const baseConf = "chunk_size: 16\nlog_level: info\n"

// payload is chunk i of run.
func payload(run uint64, i int) []byte {
	b := make([]byte, chunkBytes)
	binary.LittleEndian.PutUint64(b, run)
	binary.LittleEndian.PutUint64(b[8:], uint64(i))
	r := rand.New(rand.NewPCG(run, uint64(i)))
	for j := 16; j < len(b); j += 8 {
		binary.LittleEndian.PutUint64(b[j:], r.Uint64())
	}
	return b
}

// idOf reads which chunk a payload says it is.
func idOf(b []byte) (run uint64, i int) {
	return binary.LittleEndian.Uint64(b), int(binary.LittleEndian.Uint64(b[8:]))
}

// tokens is the prompt of chunk i of run: a chunk no other prompt shares.
func tokens(run uint64, i int) []uint32 {
	t := make([]uint32, chunkTokens)
	t[0], t[1], t[2] = uint32(run), uint32(run>>32), uint32(i)
	for j := 3; j < len(t); j++ {
		t[j] = uint32(j)
	}
	return t
}

// conn is a client with the workload's scope registered.
type conn struct {
	c   *client.Client
	h   uint32
	run uint64
}

// dialTCP connects to a daemon's TCP protocol.
func dialTCP(t testing.TB, addr string, run uint64) *conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	c, err := client.DialTCP(ctx, addr, client.Options{Name: "chaos"})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return withScope(t, c, run)
}

// dialUnix connects to a daemon's local socket.
func dialUnix(t testing.TB, sock string, run uint64) *conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "chaos"})
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	t.Cleanup(func() { c.Close() })
	return withScope(t, c, run)
}

func withScope(t testing.TB, c *client.Client, run uint64) *conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	h, err := c.Scope(ctx, scope)
	if err != nil {
		t.Fatalf("scope: %v", err)
	}
	return &conn{c: c, h: h, run: run}
}

func (c *conn) keys(i int) wire.Keys { return client.Tokens(c.h, tokens(c.run, i), 0) }

// put stores chunk i and reports whether the daemon acknowledged it.
func (c *conn) put(i int) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	n, err := c.c.Store(ctx, c.keys(i), [][]byte{payload(c.run, i)})
	return err == nil && n == 1, err
}

// get reads chunk i back: found is whether the daemon returned it, wrong
// how many of its bytes differ from what was stored.
func (c *conn) get(i int) (found bool, wrong int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	dst := [][]byte{make([]byte, chunkBytes)}
	n, _, err := c.c.Retrieve(ctx, c.keys(i), dst)
	if err != nil || n == 0 {
		return false, 0, err
	}
	return true, diffBytes(dst[0], payload(c.run, i)), nil
}

// flush asks for every acknowledged chunk to reach every tier below RAM
// and reports whether the reply says they did.
func (c *conn) flush() (bool, wire.FlushReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := c.c.Flush(ctx)
	return err == nil && rep.Durable(), rep, err
}

func diffBytes(a, b []byte) int {
	if bytes.Equal(a, b) {
		return 0
	}
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n + max(len(a), len(b)) - min(len(a), len(b))
}

// verify reads back chunks ids and adds to r: Verified and WrongBytes for
// every chunk, Lost for a durable chunk that did not come back, Dropped for
// any other that did not. A read that fails with an error fails the fault:
// a missing chunk must be a miss. It is for faults of the daemon's own
// tiers (RAM, disk): a durable chunk that misses once is lost, since
// nothing the daemon waits on can bring it back later; one that missed
// right after a restart and showed up later would be a fault of its own.
func verify(t testing.TB, c *conn, ids []int, durable func(int) bool, r *Report) {
	t.Helper()
	readBack(t, c, ids, durable, r, 0)
}

// verifyRereading is verify for faults of remote stores and peers. There
// a miss is not proof of a loss: a read the daemon could not complete (a
// remote store past its deadline on a loaded machine, a breaker not yet
// closed again, a peer still restarting) is a miss too, by design. So a
// durable chunk that misses is read again, every 50 ms for up to reread,
// and counts as lost only if no read brings it back; one that comes back
// counts in Reread, and a note says which and how late. Reads alone
// cannot bring back a chunk that is gone from every tier, so this never
// hides a loss; it only costs reread when there is one.
func verifyRereading(t testing.TB, c *conn, ids []int, durable func(int) bool, r *Report) {
	t.Helper()
	readBack(t, c, ids, durable, r, reread)
}

// readBack is verify, reading a durable chunk that missed again for up to
// window.
func readBack(t testing.TB, c *conn, ids []int, durable func(int) bool, r *Report, window time.Duration) {
	t.Helper()
	var missed []int
	for _, i := range ids {
		found, ok := check(t, c, i, r)
		switch {
		case !ok:
		case found:
			r.Verified++
		case durable(i):
			missed = append(missed, i)
		default:
			r.Dropped++
		}
	}
	if len(missed) == 0 {
		return
	}
	start := time.Now()
	var back []int
	var slowest time.Duration
	for len(missed) > 0 && time.Since(start) < window {
		time.Sleep(50 * time.Millisecond)
		left := missed[:0]
		for _, i := range missed {
			found, ok := check(t, c, i, r)
			switch {
			case !ok:
			case found:
				r.Verified++
				r.Reread++
				back = append(back, i)
				slowest = time.Since(start)
			default:
				left = append(left, i)
			}
		}
		missed = left
	}
	if len(back) > 0 {
		r.Note("re-read: durable chunks %v missed a read and came back on a later one, the last %v after the first pass",
			back, slowest.Round(time.Millisecond))
	}
	for _, i := range missed {
		r.Lost++
		hit, err := c.c.Lookup(context.Background(), c.keys(i), 0)
		t.Errorf("acknowledged-durable chunk %d did not come back: every read for %v missed (lookup: %d chunks, by tier %v, %v)",
			i, time.Since(start).Round(time.Millisecond), hit.Chunks, hit.ByTier, err)
	}
}

// reread is how long verify keeps reading a durable chunk that missed: a
// liveness bound, many times a remote deadline and a breaker's rejoin.
const reread = 10 * time.Second

// check reads chunk i once and adds its wrong bytes to r. ok is false when
// the read failed with an error, which fails the fault.
func check(t testing.TB, c *conn, i int, r *Report) (found, ok bool) {
	t.Helper()
	found, wrong, err := c.get(i)
	if err != nil {
		t.Errorf("RETRIEVE of chunk %d: %v (a missing chunk must be a miss)", i, err)
		return false, false
	}
	r.WrongBytes += wrong
	if wrong > 0 {
		t.Errorf("chunk %d came back with %d wrong bytes", i, wrong)
	}
	return found, true
}

// stats reads a daemon's /api/v1/stats.
func stats(t testing.TB, d *servetest.Daemon) engine.Stats {
	t.Helper()
	resp, err := http.Get(d.Admin + "/api/v1/stats")
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	defer resp.Body.Close()
	var s engine.Stats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("stats: %v", err)
	}
	return s
}

// tierStats returns the named tier's entry of a daemon's stats.
func tierStats(t testing.TB, d *servetest.Daemon, name string) engine.TierStats {
	t.Helper()
	for _, s := range stats(t, d).Tiers {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("the daemon has no %s tier", name)
	return engine.TierStats{}
}

// waitUntil polls ok every 20 ms and returns how long it took to hold,
// failing the fault after hang.
func waitUntil(t testing.TB, what string, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > hang {
			t.Fatalf("gave up after %v waiting for %s", hang, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// newRun returns a run number no earlier run of the suite used.
func newRun() uint64 { return uint64(time.Now().UnixNano()) }
