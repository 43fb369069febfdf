package server_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// diskDaemon serves an engine with a disk tier over loopback TCP.
func diskDaemon(t *testing.T) (*engine.Engine, string) {
	t.Helper()
	eng, err := engine.Open(engine.Options{ChunkSize: 16, RAMBytes: 64 << 20, Policy: "LRU",
		DiskDir: t.TempDir(), DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: testToken})
	ln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
		<-served
		eng.Close()
	})
	return eng, ln.Addr().String()
}

// putOnDisk stores data under k and leaves it on the disk tier only.
func putOnDisk(t *testing.T, eng *engine.Engine, c *client.Client, k chunk.Key, data []byte) {
	t.Helper()
	ctx := context.Background()
	if n, err := c.Store(ctx, client.Raw([]chunk.Key{k}), [][]byte{data}); n != 1 || err != nil {
		t.Fatalf("store: %d, %v", n, err)
	}
	if err := eng.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	eng.Manager().RAM().Remove(k)
	if eng.InRAM(k) {
		t.Fatal("the chunk is still in RAM")
	}
}

// TestRangesPipelinedFromDisk: three chunks on disk only, asked for in
// three RETRIEVE_RANGES sent back to back on one connection before any
// reply is read, each request naming ranges of every chunk. Every reply
// answers its own request with the stored bytes, and no chunk was
// promoted: every disk-only chunk of a request is served by ranges.
func TestRangesPipelinedFromDisk(t *testing.T) {
	eng, addr := diskDaemon(t)
	c := dialTCP(t, addr)
	const size = 1 << 20
	keys := make([]chunk.Key, 3)
	data := make([][]byte, 3)
	for i := range keys {
		keys[i] = rangeKey(100 + i)
		data[i] = rangePayload(100+i, size)
		putOnDisk(t, eng, c, keys[i], data[i])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reqs := make([][]wire.ByteRange, 3)
	ids := make([]uint32, 3)
	for r := range reqs {
		for j := range keys { // a "layer" of every chunk: one span in each half
			from := uint32(r * size / 8)
			reqs[r] = append(reqs[r], wire.ByteRange{Key: uint32(j), From: from, To: from + size/8},
				wire.ByteRange{Key: uint32(j), From: size/2 + from, To: size/2 + from + size/8})
		}
		id, err := c.SendRetrieveRanges(ctx, client.Raw(keys), reqs[r])
		if err != nil {
			t.Fatalf("send %d: %v", r, err)
		}
		ids[r] = id
	}
	for r := range reqs {
		dst := [][]byte{make([]byte, size), make([]byte, size), make([]byte, size)}
		sizes, read, err := c.RecvRetrieveRanges(ctx, ids[r], reqs[r], dst)
		if err != nil || read != len(reqs[r]) || len(sizes) != 3 {
			t.Fatalf("reply %d: %d ranges of %d chunks, %v", r, read, len(sizes), err)
		}
		for _, br := range reqs[r] {
			if !bytes.Equal(dst[br.Key][br.From:br.To], data[br.Key][br.From:br.To]) {
				t.Fatalf("reply %d: wrong bytes in chunk %d [%d, %d)", r, br.Key, br.From, br.To)
			}
		}
	}
	for i, k := range keys {
		if eng.InRAM(k) {
			t.Fatalf("chunk %d was promoted: not served by ranges", i)
		}
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("the connection after pipelined requests: %v", err)
	}
	if got := eng.RangeScratchInUse(); got != 0 {
		t.Fatalf("%d bytes of scratch memory still held", got)
	}
}

// TestRangesRewrittenBetweenRequests: a range of a disk-only chunk is
// read (its record's header then cached), the chunk is removed and
// written again under the same key with other bytes — the same size,
// then another — and the next request's ranges hold the new bytes: a
// header kept from the old record is never used for the new one.
func TestRangesRewrittenBetweenRequests(t *testing.T) {
	eng, addr := diskDaemon(t)
	c := dialTCP(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := rangeKey(7)
	read := func(size int, want []byte) {
		t.Helper()
		ranges := []wire.ByteRange{{Key: 0, From: uint32(size / 2), To: uint32(size/2 + 5000)}, {Key: 0, From: 4096, To: 8192}}
		dst := [][]byte{make([]byte, size)}
		sizes, n, err := c.RetrieveRanges(ctx, client.Raw([]chunk.Key{k}), ranges, dst)
		if err != nil || n != 2 || sizes[0] != uint32(len(want)) {
			t.Fatalf("ranges: %d read, sizes %v, %v", n, sizes, err)
		}
		for _, br := range ranges {
			if !bytes.Equal(dst[0][br.From:br.To], want[br.From:br.To]) {
				t.Fatalf("wrong bytes in [%d, %d)", br.From, br.To)
			}
		}
	}
	size := 1 << 20
	data := rangePayload(1, size)
	putOnDisk(t, eng, c, k, data)
	read(size, data)
	read(size, data) // with the cached header
	for round, newSize := range []int{size, size + 3*4096 + 5} {
		eng.Manager().Remove(k)
		data = rangePayload(50+round, newSize)
		putOnDisk(t, eng, c, k, data)
		read(newSize, data)
		read(newSize, data)
		if eng.InRAM(k) {
			t.Fatalf("round %d: the chunk was promoted", round)
		}
	}
}
