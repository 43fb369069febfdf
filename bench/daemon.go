package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"kvtier/chunk"
	"kvtier/client"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/wire"
)

// DaemonReport holds the measurements through a daemon: the local protocol
// (shared arena) and the TCP protocol, each against a same-run baseline.
type DaemonReport struct {
	LocalStoreGBps     float64 `json:"local_store_gbps"`
	LocalRetrieveGBps  float64 `json:"local_retrieve_gbps"`
	LocalStoreRatio    float64 `json:"local_store_ratio"`
	LocalRetrieveRatio float64 `json:"local_retrieve_ratio"`

	External        bool    `json:"external_daemon,omitempty"` // --socket: only LOOKUPs were measured
	LookupClients   int     `json:"lookup_clients"`
	LookupPrompt    int     `json:"lookup_prompt_tokens"`
	LookupsPerSec   float64 `json:"lookups_per_sec"`
	LookupP50Micros float64 `json:"lookup_p50_us"`
	LookupP99Micros float64 `json:"lookup_p99_us"`

	TCPStreamGBps    float64 `json:"tcp_stream_gbps"`
	TCPStoreGBps     float64 `json:"tcp_store_gbps"`
	TCPRetrieveGBps  float64 `json:"tcp_retrieve_gbps"`
	TCPStoreRatio    float64 `json:"tcp_store_ratio"`
	TCPRetrieveRatio float64 `json:"tcp_retrieve_ratio"`

	// P2P: a second daemon pulling the chunks through its P2P tier, and
	// the plain loopback TCP stream measured in the same rounds.
	P2PStreamGBps    float64 `json:"p2p_stream_gbps"`
	P2PRetrieveGBps  float64 `json:"p2p_retrieve_gbps"`
	P2PRetrieveRatio float64 `json:"p2p_retrieve_ratio"`

	// PD: the daemon pushing the chunks to a second daemon (PUSH until
	// the consumer's WAIT returns), and the plain loopback TCP stream
	// measured in the same rounds.
	PDStreamGBps float64 `json:"pd_stream_gbps"`
	PDPushGBps   float64 `json:"pd_push_gbps"`
	PDPushRatio  float64 `json:"pd_push_ratio"`
}

const benchToken = "bench-token"

// benchDaemon serves an engine in this process on a Unix socket and a
// loopback TCP port, and measures it through the Go client.
func benchDaemon(ctx context.Context, f Options, r *Report, src, dst [][]byte, progress io.Writer) error {
	if f.Socket != "" {
		d := &DaemonReport{External: true}
		r.Daemon = d
		fmt.Fprintf(progress, "daemon at %s: lookups from concurrent clients ...\n", f.Socket)
		return benchLookups(ctx, f, d, f.Socket)
	}
	total := int64(f.Chunks * r.ChunkBytes)
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 2*total + int64(r.ChunkBytes), Policy: "LRU", Prefault: true})
	if err != nil {
		return err
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{Token: benchToken})
	dir, err := os.MkdirTemp("", "kvtier-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "kvtier.sock")
	uln, err := server.ListenUnix(sock, 0)
	if err != nil {
		return err
	}
	tln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	go svc.Serve(uln)
	go svc.Serve(tln)
	defer svc.Shutdown(context.Background())

	d := &DaemonReport{}
	r.Daemon = d
	fmt.Fprintln(progress, "daemon: local protocol ...")
	if err := benchLocal(ctx, f, r, d, sock, src, dst); err != nil {
		return fmt.Errorf("local protocol: %w", err)
	}
	fmt.Fprintln(progress, "daemon: lookups from concurrent clients ...")
	if err := benchLookups(ctx, f, d, sock); err != nil {
		return fmt.Errorf("lookups: %w", err)
	}
	fmt.Fprintln(progress, "daemon: TCP protocol and a plain TCP stream ...")
	if err := benchTCP(ctx, f, r, d, tln.Addr().String(), src, dst); err != nil {
		return fmt.Errorf("tcp protocol: %w", err)
	}
	fmt.Fprintln(progress, "daemon: P2P pull by a second daemon and a plain TCP stream ...")
	if err := benchP2P(ctx, f, r, d, eng, tln.Addr().String(), src, dst); err != nil {
		return fmt.Errorf("p2p: %w", err)
	}
	fmt.Fprintln(progress, "daemon: PD push to a second daemon and a plain TCP stream ...")
	if err := benchPD(ctx, f, r, d, eng, sock, src, dst); err != nil {
		return fmt.Errorf("pd push: %w", err)
	}
	return nil
}

var benchScope = chunk.Scope{Model: "bench", WorldSize: 1, Format: "bench"}

// benchLocal times store (PREPARE_STORE, one copy into the shared arena,
// COMMIT_STORE) and retrieve (PREPARE_RETRIEVE, one copy out, RELEASE)
// next to a memcpy of the same buffers in each round.
func benchLocal(ctx context.Context, f Options, r *Report, d *DaemonReport, sock string, src, dst [][]byte) error {
	// Populate: a connector maps the arena once for its lifetime, so the
	// page faults of a fresh mapping are not part of a store.
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "bench", Populate: true})
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := c.Scope(ctx, benchScope)
	if err != nil {
		return err
	}
	total := int64(f.Chunks * r.ChunkBytes)
	sizes := make([]uint32, f.Chunks)
	for i := range sizes {
		sizes[i] = uint32(r.ChunkBytes)
	}
	var memcpyBest float64
	for round := range f.Rounds + 1 {
		memcpy := bestOf(1, total, func() error {
			for i := range src {
				copy(dst[i], src[i])
			}
			return nil
		})
		keys := client.Tokens(h, benchTokens(f.Chunks*f.Tokens, uint32(1000+round)), 0)
		var opErr error
		store := bestOf(1, total, func() error {
			opErr = localStore(ctx, c, keys, sizes, src)
			return opErr
		})
		if opErr != nil {
			return opErr
		}
		clearChunks(dst)
		retrieve := bestOf(1, total, func() error {
			opErr = localRetrieve(ctx, c, keys, dst)
			return opErr
		})
		if opErr != nil {
			return opErr
		}
		if round > 0 {
			memcpyBest = max(memcpyBest, memcpy)
			d.LocalStoreGBps = max(d.LocalStoreGBps, store)
			d.LocalRetrieveGBps = max(d.LocalRetrieveGBps, retrieve)
		}
	}
	if err := sameChunks("local protocol bench", src, dst); err != nil {
		return err
	}
	d.LocalStoreRatio = d.LocalStoreGBps / memcpyBest
	d.LocalRetrieveRatio = d.LocalRetrieveGBps / memcpyBest
	return nil
}

func localStore(ctx context.Context, c *client.Client, keys wire.Keys, sizes []uint32, src [][]byte) error {
	slots, err := c.PrepareStore(ctx, keys, sizes, 0)
	if err != nil {
		return err
	}
	if len(slots.Slots) != len(src) {
		return fmt.Errorf("%d of %d slots", len(slots.Slots), len(src))
	}
	for j, s := range slots.Slots {
		if s.State == wire.SlotWrite {
			b, err := c.Slot(s)
			if err != nil {
				return err
			}
			copy(b, src[j])
		}
	}
	n, err := c.CommitStore(ctx, slots.Lease, len(slots.Slots))
	if err == nil && n != len(src) {
		err = fmt.Errorf("committed %d of %d", n, len(src))
	}
	return err
}

func localRetrieve(ctx context.Context, c *client.Client, keys wire.Keys, dst [][]byte) error {
	slots, err := c.PrepareRetrieve(ctx, keys, 0)
	if err != nil {
		return err
	}
	if len(slots.Slots) != len(dst) {
		return fmt.Errorf("%d of %d chunks cached", len(slots.Slots), len(dst))
	}
	for j, s := range slots.Slots {
		b, err := c.Slot(s)
		if err != nil {
			return err
		}
		copy(dst[j], b)
	}
	return c.Release(ctx, slots.Lease)
}

// benchLookups runs LOOKUPs of a cached 4,096-token prompt from several
// clients at once for a fixed time and reports the rate and latencies.
func benchLookups(ctx context.Context, f Options, d *DaemonReport, sock string) error {
	const clients, promptTokens, duration = 4, 4096, time.Second
	d.LookupClients, d.LookupPrompt = clients, promptTokens
	tokens := benchTokens(promptTokens, 77)
	// Store the prompt's chunks (small ones: only the lookup is measured).
	setup, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		return err
	}
	h, err := setup.Scope(ctx, benchScope)
	if err != nil {
		setup.Close()
		return err
	}
	n := (promptTokens + f.Tokens - 1) / f.Tokens
	small := make([][]byte, n)
	for i := range small {
		small[i] = make([]byte, 4096)
	}
	_, err = setup.Store(ctx, client.Tokens(h, tokens, 0), small)
	setup.Close()
	if err != nil {
		return err
	}

	lat := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = lookupLoop(ctx, sock, tokens, n, start.Add(duration), &lat[i])
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	d.LookupsPerSec = float64(len(all)) / elapsed.Seconds()
	d.LookupP50Micros = float64(all[len(all)/2].Nanoseconds()) / 1e3
	d.LookupP99Micros = float64(all[len(all)*99/100].Nanoseconds()) / 1e3
	return nil
}

func lookupLoop(ctx context.Context, sock string, tokens []uint32, wantChunks int, until time.Time, lat *[]time.Duration) error {
	c, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := c.Scope(ctx, benchScope)
	if err != nil {
		return err
	}
	keys := client.Tokens(h, tokens, 0)
	*lat = make([]time.Duration, 0, 1<<18)
	for {
		t0 := time.Now()
		if t0.After(until) {
			return nil
		}
		hit, err := c.Lookup(ctx, keys, 0)
		if err != nil {
			return err
		}
		if int(hit.Chunks) != wantChunks {
			return fmt.Errorf("lookup hit %d of %d chunks", hit.Chunks, wantChunks)
		}
		*lat = append(*lat, time.Since(t0))
	}
}

// benchTCP times STORE and RETRIEVE over loopback TCP next to a plain TCP
// stream of the same bytes, measured in the same round.
func benchTCP(ctx context.Context, f Options, r *Report, d *DaemonReport, addr string, src, dst [][]byte) error {
	c, err := client.DialTCP(ctx, addr, client.Options{Token: benchToken, Name: "bench"})
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := c.Scope(ctx, benchScope)
	if err != nil {
		return err
	}
	total := int64(f.Chunks * r.ChunkBytes)
	for round := range f.Rounds + 1 {
		stream, err := plainTCPStream(src, dst)
		if err != nil {
			return err
		}
		keys := client.Tokens(h, benchTokens(f.Chunks*f.Tokens, uint32(2000+round)), 0)
		var opErr error
		store := bestOf(1, total, func() error {
			var n int
			if n, opErr = c.Store(ctx, keys, src); opErr == nil && n != len(src) {
				opErr = fmt.Errorf("stored %d of %d", n, len(src))
			}
			return opErr
		})
		if opErr != nil {
			return opErr
		}
		clearChunks(dst)
		retrieve := bestOf(1, total, func() error {
			var n int
			if n, _, opErr = c.Retrieve(ctx, keys, dst); opErr == nil && n != len(dst) {
				opErr = fmt.Errorf("retrieved %d of %d", n, len(dst))
			}
			return opErr
		})
		if opErr != nil {
			return opErr
		}
		if round > 0 {
			d.TCPStreamGBps = max(d.TCPStreamGBps, stream)
			d.TCPStoreGBps = max(d.TCPStoreGBps, store)
			d.TCPRetrieveGBps = max(d.TCPRetrieveGBps, retrieve)
		}
	}
	if err := sameChunks("TCP protocol bench", src, dst); err != nil {
		return err
	}
	d.TCPStoreRatio = d.TCPStoreGBps / d.TCPStreamGBps
	d.TCPRetrieveRatio = d.TCPRetrieveGBps / d.TCPStreamGBps
	return nil
}

// plainTCPStream sends src over a fresh loopback TCP connection into dst
// with nothing but writes and io.ReadFull: the most a TCP protocol can do.
func plainTCPStream(src, dst [][]byte) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	recvErr := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			recvErr <- err
			return
		}
		defer conn.Close()
		for _, b := range dst {
			if _, err := io.ReadFull(conn, b); err != nil {
				recvErr <- err
				return
			}
		}
		_, err = conn.Write([]byte{1})
		recvErr <- err
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var total int64
	for _, b := range src {
		total += int64(len(b))
	}
	var ack [1]byte
	gbps := bestOf(1, total, func() error {
		for _, b := range src {
			if _, err := conn.Write(b); err != nil {
				return err
			}
		}
		_, err := io.ReadFull(conn, ack[:])
		return err
	})
	if err := <-recvErr; err != nil {
		return 0, err
	}
	if gbps == 0 {
		return 0, errors.New("plain TCP stream failed")
	}
	return gbps, nil
}

func printDaemon(w io.Writer, d *DaemonReport) {
	if d.External {
		fmt.Fprintf(w, "\nLOOKUP of a %d-token prompt against the daemon at --socket, %d clients: %.0f/s, p50 %.1f µs, p99 %.1f µs\n",
			d.LookupPrompt, d.LookupClients, d.LookupsPerSec, d.LookupP50Micros, d.LookupP99Micros)
		return
	}
	fmt.Fprintf(w, "\nthrough the daemon (in this process; client and daemon share the machine's cores):\n")
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: memcpy)\n", "local protocol store", d.LocalStoreGBps, d.LocalStoreGBps/d.LocalStoreRatio, d.LocalStoreRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "local protocol retrieve", d.LocalRetrieveGBps, d.LocalRetrieveGBps/d.LocalRetrieveRatio, d.LocalRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: plain loopback TCP stream)\n", "TCP protocol store", d.TCPStoreGBps, d.TCPStreamGBps, d.TCPStoreRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "TCP protocol retrieve", d.TCPRetrieveGBps, d.TCPStreamGBps, d.TCPRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: plain loopback TCP stream, same rounds)\n", "P2P retrieve (peer's RAM)", d.P2PRetrieveGBps, d.P2PStreamGBps, d.P2PRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: plain loopback TCP stream, same rounds)\n", "PD push (daemon to daemon)", d.PDPushGBps, d.PDStreamGBps, d.PDPushRatio)
	fmt.Fprintf(w, "LOOKUP of a %d-token prompt, %d clients: %.0f/s, p50 %.1f µs, p99 %.1f µs\n",
		d.LookupPrompt, d.LookupClients, d.LookupsPerSec, d.LookupP50Micros, d.LookupP99Micros)
}
