package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/wire"
)

func rangeKey(i int) chunk.Key { return chunk.Key{Scope: 0xfeed, Hash: chunk.Hash{byte(i), 7}} }

func rangePayload(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*13 + j*7 + j>>8)
	}
	return b
}

func dialRanges(t *testing.T, addr string, peer bool) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.DialTCP(ctx, addr, client.Options{Token: testToken, Name: "ranges", Timeout: 10 * time.Second, Peer: peer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRetrieveRangesProcess reads ranges of chunks from a real daemon over
// loopback, from RAM and (PEER) after they were evicted to disk: every
// range holds the stored bytes and nothing outside the ranges is written;
// ranges of chunks past the cached prefix are not sent; a range past the
// end of its chunk is refused without breaking the connection.
func TestRetrieveRangesProcess(t *testing.T) {
	const size = 256 << 10
	// 4 MiB of RAM: 40 chunks of 256 KiB push the first ones to disk.
	d := startProc(t, t.TempDir(), "chunk_size: 16\nmax_local_cpu_size: 0.00390625\nmax_local_disk_size: 0.0625\nlocal_disk: "+t.TempDir()+"\ntcp_token: "+testToken)
	ctx := context.Background()
	w := dialRanges(t, d.TCP, false)
	for i := range 40 {
		// Flushing after each store keeps RAM from filling with chunks
		// still on their way to disk, which would refuse the next store.
		if n, err := w.Store(ctx, client.Raw([]chunk.Key{rangeKey(i)}), [][]byte{rangePayload(i, size)}); err != nil || n != 1 {
			t.Fatalf("store %d: %d, %v", i, n, err)
		}
		if _, err := w.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c := dialRanges(t, d.TCP, true)
	for _, first := range []int{0, 38} { // 0 on disk only, 38 in RAM
		keys := []chunk.Key{rangeKey(first), rangeKey(first + 1), rangeKey(1000)}
		ranges := []wire.ByteRange{{Key: 0, From: 0, To: 4096}, {Key: 0, From: 100_000, To: 150_001},
			{Key: 1, From: size - 1, To: size}, {Key: 2, From: 0, To: 10}}
		dst := [][]byte{bytes.Repeat([]byte{0xAA}, size), bytes.Repeat([]byte{0xAA}, size), make([]byte, 10)}
		sizes, read, err := c.RetrieveRanges(ctx, client.Raw(keys), ranges, dst)
		if err != nil {
			t.Fatalf("chunks %d..: %v", first, err)
		}
		if len(sizes) != 2 || sizes[0] != size || sizes[1] != size || read != 3 {
			t.Fatalf("chunks %d..: sizes %v, %d ranges read; want 2 chunks, 3 ranges", first, sizes, read)
		}
		for j := range 2 {
			want := bytes.Repeat([]byte{0xAA}, size)
			for _, r := range ranges[:read] {
				if int(r.Key) == j {
					copy(want[r.From:r.To], rangePayload(first+j, size)[r.From:r.To])
				}
			}
			if !bytes.Equal(dst[j], want) {
				t.Fatalf("chunk %d: wrong bytes in or around its ranges", first+j)
			}
		}
	}
	_, _, err := c.RetrieveRanges(ctx, client.Raw([]chunk.Key{rangeKey(39)}), []wire.ByteRange{{Key: 0, From: 0, To: size + 1}}, [][]byte{make([]byte, size+1)})
	if !client.IsStatus(err, wire.StatusBadRequest) {
		t.Fatalf("a range past the chunk's end: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("the connection did not survive a refused range: %v", err)
	}
	// Overlapping ranges are allowed up to the chunk's own size, not past
	// it: one small frame may not ask for the same bytes over and over.
	whole := []wire.ByteRange{{Key: 0, From: 0, To: size / 2}, {Key: 0, From: 0, To: size / 2}}
	if _, read, err := c.RetrieveRanges(ctx, client.Raw([]chunk.Key{rangeKey(39)}), whole, [][]byte{make([]byte, size)}); err != nil || read != 2 {
		t.Fatalf("two overlapping halves of a chunk: %d read, %v", read, err)
	}
	again := append(whole, wire.ByteRange{Key: 0, From: 0, To: 1})
	_, _, err = c.RetrieveRanges(ctx, client.Raw([]chunk.Key{rangeKey(39)}), again, [][]byte{make([]byte, size)})
	if !client.IsStatus(err, wire.StatusBadRequest) {
		t.Fatalf("ranges adding up to more than the chunk: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("the connection did not survive refused ranges: %v", err)
	}
}

// proxy relays one connection to addr; from the daemon's side it flips
// the byte at offset flip (if ≥ 0) and cuts the connection after cut bytes
// (if ≥ 0), as damage on the path or a peer dying mid-stream would.
func proxy(t *testing.T, addr string, flip, cut int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", addr)
		if err != nil {
			in.Close()
			return
		}
		go func() { io.Copy(out, in); out.Close() }()
		var n int64
		buf := make([]byte, 32<<10)
		for {
			k, err := out.Read(buf)
			if k > 0 {
				b := buf[:k]
				if flip >= n && flip < n+int64(k) {
					b[flip-n] ^= 0x40
				}
				if cut >= 0 && n+int64(k) > cut {
					b = b[:cut-n]
				}
				n += int64(k)
				in.Write(b)
				if cut >= 0 && n >= cut {
					break
				}
			}
			if err != nil {
				break
			}
		}
		in.Close()
		out.Close()
	}()
	return ln.Addr().String()
}

// TestRetrieveRangesDamageAndCut: a byte changed on the way in the second
// range is caught by that range's checksum (ErrChecksum, the first range
// read, the connection closed), and a connection cut in the middle of a
// range is an error, never a short read taken as whole.
func TestRetrieveRangesDamageAndCut(t *testing.T) {
	const size = 64 << 10
	d := startProc(t, t.TempDir(), "chunk_size: 16\ntcp_token: "+testToken)
	ctx := context.Background()
	w := dialRanges(t, d.TCP, false)
	if n, err := w.Store(ctx, client.Raw([]chunk.Key{rangeKey(1)}), [][]byte{rangePayload(1, size)}); err != nil || n != 1 {
		t.Fatalf("store: %d, %v", n, err)
	}
	ranges := []wire.ByteRange{{Key: 0, From: 0, To: 8192}, {Key: 0, From: 8192, To: 16384}}
	// The HELLO reply is 24 bytes of body, then the metadata frame
	// (4 + 4 + 4 + 4 + 2×8 bytes of body), then the data frames.
	const hello, meta = wire.HeaderSize + 24, wire.HeaderSize + 32
	secondRange := int64(hello + meta + wire.HeaderSize + 8192 + wire.HeaderSize)
	c := dialRanges(t, proxy(t, d.TCP, secondRange+100, -1), true)
	dst := [][]byte{make([]byte, size)}
	_, read, err := c.RetrieveRanges(ctx, client.Raw([]chunk.Key{rangeKey(1)}), ranges, dst)
	if !errors.Is(err, client.ErrChecksum) || read != 1 {
		t.Fatalf("damaged second range: %d read, %v; want 1 and ErrChecksum", read, err)
	}
	if !bytes.Equal(dst[0][:8192], rangePayload(1, size)[:8192]) {
		t.Fatal("the first range is wrong")
	}
	if err := c.Ping(ctx); err == nil {
		t.Fatal("the connection stayed open after a checksum mismatch")
	}

	c = dialRanges(t, proxy(t, d.TCP, -1, secondRange+4000), true)
	_, read, err = c.RetrieveRanges(ctx, client.Raw([]chunk.Key{rangeKey(1)}), ranges, [][]byte{make([]byte, size)})
	if err == nil || read != 1 {
		t.Fatalf("cut in the second range: %d read, %v; want 1 and an error", read, err)
	}

	// Undamaged, through the same kind of relay, it reads both.
	c = dialRanges(t, proxy(t, d.TCP, -1, -1), true)
	dst = [][]byte{make([]byte, size)}
	if _, read, err = c.RetrieveRanges(ctx, client.Raw([]chunk.Key{rangeKey(1)}), ranges, dst); err != nil || read != 2 ||
		!bytes.Equal(dst[0][:16384], rangePayload(1, size)[:16384]) {
		t.Fatalf("through the relay: %d read, %v", read, err)
	}
}
