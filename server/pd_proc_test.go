package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/wire"
)

// The transfer between two real daemons: a producer pushes chunks a
// client stored on it to a consumer whose receive budget is a quarter of
// the push, while a reader on the consumer takes them as they arrive.

const pdProcConf = "chunk_size: 16\nmax_local_cpu_size: 0.125\ntcp_token: pd-secret\n"

func (p *proc) dialPD(t *testing.T, token string) *client.Client {
	t.Helper()
	c, err := client.DialTCP(context.Background(), p.TCP, client.Options{Token: token, Name: t.Name(), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProcessesPushAcrossDaemons(t *testing.T) {
	const size = 256 << 10
	prod := startProc(t, t.TempDir(), pdProcConf)
	cons := startProc(t, t.TempDir(), pdProcConf+"pd_receive_bytes: 4MiB\n")
	pc, cc := prod.dialPD(t, "pd-secret"), cons.dialPD(t, "pd-secret")
	ctx := context.Background()
	keys := pdKeys(64, 11) // 16 MiB through a 4 MiB budget
	storeRaw(t, pc, keys, 12, size)
	rssBefore := cons.rss(t)
	if _, err := pc.Push(ctx, 100, cons.TCP, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	dst := make([][]byte, len(keys))
	for j := range dst {
		dst[j] = make([]byte, size)
	}
	read := 0
	for read < len(keys) {
		w, err := cc.Wait(ctx, client.Raw(keys[read:]), 1, 10000)
		if err != nil || w.Chunks == 0 {
			t.Fatalf("wait after %d chunks: %+v %v", read, w, err)
		}
		if held := cons.metric(t, "kvtier_pd_held_bytes"); held > 4<<20 {
			t.Fatalf("consumer holds %.0f bytes, over its 4 MiB budget", held)
		}
		n, _, err := cc.Retrieve(ctx, client.Raw(keys[read:read+int(w.Chunks)]), dst[read:])
		if err != nil || n != int(w.Chunks) {
			t.Fatalf("retrieve: %d of %d, %v", n, w.Chunks, err)
		}
		read += n
	}
	for j := range dst {
		if string(dst[j]) != string(chunkData(j, 12, size)) {
			t.Fatalf("chunk %d differs from what the producer stored", j)
		}
	}
	st := waitPushed(t, pc, 100)
	if st.State != wire.TransferDone || st.Pushed != 64 {
		t.Fatalf("status %+v", st)
	}
	t.Logf("consumer VmRSS %.1f MiB before the push, %.1f MiB after", mib(rssBefore), mib(cons.rss(t)))
	waitFor(t, "producer references dropped", func() bool { return arenaPinned(t, pc) == 0 })
	if v := prod.Metric(t, `kvtier_pd_pushes_total{outcome="done"}`); v != "1" {
		t.Fatalf("pushes done: %q", v)
	}
}

// TestProcessesPushToKilledConsumer: the consumer's budget is full and
// nobody reads; SIGKILL it mid-push. The transfer fails and the producer
// holds nothing for it any more.
func TestProcessesPushToKilledConsumer(t *testing.T) {
	const size = 256 << 10
	prod := startProc(t, t.TempDir(), pdProcConf)
	cons := startProc(t, t.TempDir(), pdProcConf+"pd_receive_bytes: 1MiB\n")
	pc := prod.dialPD(t, "pd-secret")
	ctx := context.Background()
	keys := pdKeys(32, 13)
	storeRaw(t, pc, keys, 14, size)
	if _, err := pc.Push(ctx, 200, cons.TCP, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer to fill its budget", func() bool {
		return cons.metric(t, "kvtier_pd_held_bytes") == 1<<20
	})
	if st, err := pc.PushStatus(ctx, 200); err != nil || st.State != wire.TransferPending {
		t.Fatalf("with the consumer full: %+v %v", st, err)
	}
	if arenaPinned(t, pc) == 0 {
		t.Fatal("the producer holds none of the chunks it has yet to push")
	}
	cons.kill()
	st := waitPushed(t, pc, 200)
	if st.State != wire.TransferFailed || st.Pushed >= 32 {
		t.Fatalf("after the consumer died: %+v", st)
	}
	t.Logf("failed transfer: %+v", st)
	waitFor(t, "producer references dropped", func() bool { return arenaPinned(t, pc) == 0 })
	waitFor(t, "no push active", func() bool { return prod.metric(t, "kvtier_pd_pushes_active") == 0 })
}

// TestProcessesPushNeedsTheToken: a consumer with another token refuses
// the producer's push, and a RECEIVE from a client with a wrong token
// never gets past HELLO.
func TestProcessesPushNeedsTheToken(t *testing.T) {
	prod := startProc(t, t.TempDir(), pdProcConf)
	cons := startProc(t, t.TempDir(), "chunk_size: 16\nmax_local_cpu_size: 0.0625\ntcp_token: other-secret\n")
	pc := prod.dialPD(t, "pd-secret")
	ctx := context.Background()
	keys := pdKeys(4, 15)
	storeRaw(t, pc, keys, 16, 4096)
	if _, err := pc.Push(ctx, 300, cons.TCP, client.Raw(keys), 0, true); err != nil {
		t.Fatal(err)
	}
	st := waitPushed(t, pc, 300)
	if st.State != wire.TransferFailed || !strings.Contains(st.Message, "unauthorized") {
		t.Fatalf("push with the wrong token: %+v", st)
	}
	if _, err := client.DialTCP(ctx, cons.TCP, client.Options{Token: "pd-secret"}); !client.IsStatus(err, wire.StatusUnauthorized) {
		t.Fatalf("dial with the wrong token: %v", err)
	}
	if n, err := cons.dialPD(t, "other-secret").Lookup(ctx, client.Raw(keys), 0); err != nil || n.Chunks != 0 {
		t.Fatalf("the consumer holds %d pushed chunks, %v", n.Chunks, err)
	}
}
