package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/client"
	"kvtier/wire"
)

// saveConf is a daemon with RAM and a disk tier in disk, for the layered
// scope (8 layers, 64 KiB chunks).
func saveConf(disk string) string {
	return "chunk_size: 16\nmax_local_cpu_size: 0.0625\nmax_local_disk_size: 0.0625\nlocal_disk: " + disk + "\ntcp_token: " + testToken
}

// segmentBytes sums the blocks the disk tier's segment files occupy.
func segmentBytes(t *testing.T, dir string) int64 {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	var n int64
	for _, p := range paths {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// prepareLayered prepares a store of the chunks of tokens in the layered
// scope and returns the lease, the slots and random contents for them.
func prepareLayered(t *testing.T, c *client.Client, h uint32, tokens []uint32, seed uint64) (wire.Slots, [][]byte) {
	t.Helper()
	n := len(tokens) / pChunkTokens
	slots, err := c.PrepareStore(context.Background(), client.Tokens(h, tokens, 0), sizesOf(n, pChunkBytes), 60_000)
	if err != nil || len(slots.Slots) != n {
		t.Fatalf("prepare store: %+v %v", slots, err)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	data := make([][]byte, n)
	for j := range data {
		data[j] = make([]byte, pChunkBytes)
		for i := range data[j] {
			data[j][i] = byte(r.Uint32())
		}
	}
	return slots, data
}

// fillAndNotice copies layers [from, to) of every chunk into its slot and
// sends STORE_LAYER after each.
func fillAndNotice(t *testing.T, c *client.Client, slots wire.Slots, data [][]byte, from, to int) {
	t.Helper()
	for layer := from; layer < to; layer++ {
		for j, s := range slots.Slots {
			dst, err := c.Slot(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, part := range []int{layer, layerCount + layer} {
				copy(dst[part*layerSpan:(part+1)*layerSpan], data[j][part*layerSpan:(part+1)*layerSpan])
			}
		}
		if err := c.StoreLayer(context.Background(), slots.Lease, layer, 0, 0); err != nil {
			t.Fatalf("STORE_LAYER %d: %v", layer, err)
		}
	}
}

// waitSegments waits up to ten seconds for the segment files to occupy at
// least (or, when atLeast is false, at most) n bytes.
func waitSegments(t *testing.T, dir string, n int64, atLeast bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := segmentBytes(t, dir)
		if atLeast && got >= n || !atLeast && got <= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("segment files occupy %d bytes; want %s %d", got, map[bool]string{true: "at least", false: "at most"}[atLeast], n)
		}
	}
}

// TestStoreLayerProcess saves four chunks layer by layer through a real
// daemon: the layers noticed are on disk before the commit, and after a
// restart (RAM empty) the chunks read back byte-exact whole and layer by
// layer (range reads of the records the layers wrote).
func TestStoreLayerProcess(t *testing.T) {
	dir, disk := t.TempDir(), t.TempDir()
	p := startProc(t, dir, saveConf(disk))
	c := mustDial(t, p, true, testToken)
	ctx := context.Background()
	h, err := c.Scope(ctx, layerScope)
	if err != nil {
		t.Fatal(err)
	}
	tokens := prompt(4*pChunkTokens, 41)
	slots, data := prepareLayered(t, c, h, tokens, 1)
	fillAndNotice(t, c, slots, data, 0, 6)
	// Six of eight layers of four chunks: the pieces no later layer shares.
	waitSegments(t, disk, 4*6*2*layerSpan, true)
	fillAndNotice(t, c, slots, data, 6, layerCount)
	if n, err := c.CommitStore(ctx, slots.Lease, 4); err != nil || n != 4 {
		t.Fatalf("commit: %d %v", n, err)
	}
	if rep, err := c.Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("FLUSH: %+v %v", rep, err)
	}
	// The records were committed from their range writes, not rewritten
	// whole after the commit, and every noticed layer went through them.
	raw, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Queues []struct {
			Tier       string `json:"tier"`
			LayerSaved uint64 `json:"layer_saved"`
			LayerBytes uint64 `json:"layer_bytes"`
		} `json:"queues"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || len(st.Queues) != 1 || st.Queues[0].LayerSaved != 4 || st.Queues[0].LayerBytes != 4*layerCount*2*layerSpan {
		t.Fatalf("STATS queues: %+v %v; want 4 records saved by layers, every layer's bytes", st.Queues, err)
	}
	p.kill()
	p = startProc(t, dir, saveConf(disk))
	c = mustDial(t, p, true, testToken)
	if h, err = c.Scope(ctx, layerScope); err != nil {
		t.Fatal(err)
	}
	lay, err := c.PrepareRetrieveLayers(ctx, client.Tokens(h, tokens, 0), 0, 0, 60_000)
	if err != nil || len(lay.Slots) != 4 {
		t.Fatalf("prepare retrieve layers: %+v %v", lay, err)
	}
	if r, err := c.LayerWait(ctx, lay.Lease, layerCount-1); err != nil || r.Usable != 4 || r.Ready < layerCount {
		t.Fatalf("LAYER_WAIT: %+v %v", r, err)
	}
	for j, s := range lay.Slots {
		if b, _ := c.Slot(s); !bytes.Equal(b, data[j]) {
			t.Fatalf("chunk %d read layer by layer: wrong bytes", j)
		}
	}
	c.Release(ctx, lay.Lease)
	whole, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 60_000)
	if err != nil || len(whole.Slots) != 4 {
		t.Fatalf("prepare retrieve: %+v %v", whole, err)
	}
	for j, s := range whole.Slots {
		if b, _ := c.Slot(s); !bytes.Equal(b, data[j]) {
			t.Fatalf("chunk %d read whole: wrong bytes", j)
		}
	}
	c.Release(ctx, whole.Lease)
}

// TestStoreLayerKilledBeforeCommitProcess kills the daemon (SIGKILL)
// after six layers of a save were written and before COMMIT_STORE: the
// restarted daemon serves none of those chunks (no wrong bytes: nothing at
// all), and the space the layers took is reclaimed. Another prompt,
// committed before the kill, survives byte-exact.
func TestStoreLayerKilledBeforeCommitProcess(t *testing.T) {
	dir, disk := t.TempDir(), t.TempDir()
	p := startProc(t, dir, saveConf(disk))
	c := mustDial(t, p, true, testToken)
	ctx := context.Background()
	h, err := c.Scope(ctx, layerScope)
	if err != nil {
		t.Fatal(err)
	}
	kept := prompt(2*pChunkTokens, 42)
	keptData := storeRandom(t, c, h, kept)
	if rep, err := c.Flush(ctx); err != nil || !rep.Durable() {
		t.Fatalf("FLUSH: %+v %v", rep, err)
	}
	base := segmentBytes(t, disk)
	tokens := prompt(4*pChunkTokens, 43)
	slots, data := prepareLayered(t, c, h, tokens, 2)
	fillAndNotice(t, c, slots, data, 0, 6)
	waitSegments(t, disk, base+4*6*2*layerSpan, true)
	p.kill()

	p = startProc(t, dir, saveConf(disk))
	c = mustDial(t, p, true, testToken)
	if h, err = c.Scope(ctx, layerScope); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Lookup(ctx, client.Tokens(h, tokens, 0), 0); err != nil || r.Chunks != 0 {
		t.Fatalf("after the kill the uncommitted prompt looks up as %+v, %v; want no chunk", r, err)
	}
	if got, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens, 0), 0); err != nil || len(got.Slots) != 0 {
		t.Fatalf("after the kill the uncommitted prompt retrieves %d chunks, %v", len(got.Slots), err)
	}
	// The file system may keep a block of extent metadata for a file that
	// was sparse: allow four, against the 384 KiB the layers took.
	waitSegments(t, disk, base+4*4096, false)
	got, err := c.PrepareRetrieve(ctx, client.Tokens(h, kept, 0), 60_000)
	if err != nil || len(got.Slots) != 2 {
		t.Fatalf("the committed prompt: %+v %v", got, err)
	}
	for j, s := range got.Slots {
		if b, _ := c.Slot(s); !bytes.Equal(b, keptData[j]) {
			t.Fatalf("committed chunk %d: wrong bytes after the kill", j)
		}
	}
	c.Release(ctx, got.Lease)
}

// TestStoreLayerReleasedLeaseProcess: a store lease released after some
// layers, and one whose connection closes, give their extents back; a
// malformed STORE_LAYER closes the connection.
func TestStoreLayerReleasedLeaseProcess(t *testing.T) {
	disk := t.TempDir()
	p := startProc(t, t.TempDir(), saveConf(disk))
	ctx := context.Background()
	for _, closeConn := range []bool{false, true} {
		c := mustDial(t, p, true, testToken)
		h, err := c.Scope(ctx, layerScope)
		if err != nil {
			t.Fatal(err)
		}
		slots, data := prepareLayered(t, c, h, prompt(4*pChunkTokens, 44), 3)
		fillAndNotice(t, c, slots, data, 0, 4)
		waitSegments(t, disk, 4*4*2*layerSpan, true)
		if closeConn {
			c.Close()
		} else if err := c.Release(ctx, slots.Lease); err != nil {
			t.Fatal(err)
		}
		waitSegments(t, disk, 4*4096, false) // a few blocks of file system metadata at most
	}
	c := mustDial(t, p, true, testToken)
	// A well-formed notice for a lease the connection does not hold is
	// dropped without a reply: the next call's reply is its own.
	if err := c.StoreLayer(ctx, 12345, 0, 8, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after a notice for an unknown lease: %v", err)
	}
	if err := c.StoreLayer(ctx, 1, 9, 8, 2); err != nil { // layer 9 of 8: the write succeeds, the daemon hangs up
		t.Fatal(err)
	}
	// The daemon closes the connection without a reply: the ping finds it
	// closed, not answered with an error status.
	if err := c.Ping(ctx); !errors.Is(err, client.ErrClosed) || errors.As(err, new(*client.StatusError)) {
		t.Fatalf("ping after a malformed STORE_LAYER: %v; want the connection closed", err)
	}
	c2 := mustDial(t, p, true, testToken) // the daemon still serves others
	if err := c2.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}
