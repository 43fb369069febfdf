package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

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
	// The baseline of the lookup rates, from as many clients on the same
	// kind of socket in the same rounds (see lookuprate.go): round trips
	// of empty frames with an echo server. Beside it, round trips of
	// frames as long as LOOKUP's request and reply, and PINGs through the
	// daemon. Every ratio is a median of per-slice ratios to the empty
	// round trips measured just before (lookups over round trips).
	EmptyRoundTrips float64 `json:"empty_round_trips_per_sec"`
	// CPU time of the bench's process (clients, daemon, echo server) per
	// operation, median over slices, by kind: what each costs whatever
	// else runs on the machine. EmptyCPUMicros is the empty round trip's.
	EmptyCPUMicros      float64            `json:"empty_round_trip_cpu_us"`
	CPUMicros           map[string]float64 `json:"cpu_us_per_op"`
	SameBytesRoundTrips float64            `json:"same_bytes_round_trips_per_sec"`
	SameBytesRatio      float64            `json:"same_bytes_ratio"`
	PingsPerSec         float64            `json:"pings_per_sec"`
	PingRatio           float64            `json:"ping_ratio"`
	LookupRatio         float64            `json:"lookup_ratio"` // LOOKUPs / empty round trips
	BatchSize           int                `json:"lookup_batch_size"`
	BatchLookupsPerSec  float64            `json:"batch_lookups_per_sec"` // lookups, not frames
	BatchRatio          float64            `json:"batch_ratio"`           // batched lookups / empty round trips
	// The same with the tokens in a request buffer (wire.KindShared).
	SharedLookupsPerSec      float64 `json:"shared_lookups_per_sec"`
	SharedLookupRatio        float64 `json:"shared_lookup_ratio"`
	SharedBatchLookupsPerSec float64 `json:"shared_batch_lookups_per_sec"`
	SharedBatchRatio         float64 `json:"shared_batch_ratio"`
	// The same with engine-computed chunk hashes (wire.KindHashes), and
	// LOOKUPs whose client computes them on every call.
	HashLookupsPerSec       float64 `json:"hash_lookups_per_sec"`
	HashLookupRatio         float64 `json:"hash_lookup_ratio"`
	HashBatchLookupsPerSec  float64 `json:"hash_batch_lookups_per_sec"`
	HashBatchRatio          float64 `json:"hash_batch_ratio"`
	ClientHashLookupsPerSec float64 `json:"client_hash_lookups_per_sec"`
	ClientHashLookupRatio   float64 `json:"client_hash_lookup_ratio"`

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
	// The same with the peer found through a controller's lookup, in the
	// same rounds against the same stream.
	P2PCtrlRetrieveGBps  float64 `json:"p2p_controller_retrieve_gbps"`
	P2PCtrlRetrieveRatio float64 `json:"p2p_controller_retrieve_ratio"`

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
		fmt.Fprintf(progress, "daemon at %s: lookups from concurrent clients, empty round trips ...\n", f.Socket)
		return benchLookups(ctx, d, f.Socket)
	}
	total := int64(f.Chunks * r.ChunkBytes)
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 2*total + int64(r.ChunkBytes), Policy: "LRU", Prefault: true})
	if err != nil {
		return err
	}
	defer eng.Close()
	svc := server.NewService(eng, server.ServiceOptions{Token: benchToken})
	defer svc.Shutdown(context.Background())
	sock, cleanup, err := serveLocal(svc)
	if err != nil {
		return err
	}
	defer cleanup()
	tln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	go svc.Serve(tln)

	d := &DaemonReport{}
	r.Daemon = d
	fmt.Fprintln(progress, "daemon: local protocol ...")
	if err := benchLocal(ctx, f, r, d, sock, src, dst); err != nil {
		return fmt.Errorf("local protocol: %w", err)
	}
	fmt.Fprintln(progress, "daemon: lookups from concurrent clients, empty round trips ...")
	if err := benchLookups(ctx, d, sock); err != nil {
		return fmt.Errorf("lookups: %w", err)
	}
	fmt.Fprintln(progress, "daemon: TCP protocol and a plain TCP stream ...")
	if err := benchTCP(ctx, f, r, d, tln.Addr().String(), src, dst); err != nil {
		return fmt.Errorf("tcp protocol: %w", err)
	}
	fmt.Fprintln(progress, "daemon: P2P pulls (static peer, peer found through a controller) and a plain TCP stream ...")
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
		fmt.Fprintf(w, "\nagainst the daemon at --socket:\n")
		printLookupRates(w, d)
		return
	}
	fmt.Fprintf(w, "\nthrough the daemon (in this process; client and daemon share the machine's cores):\n")
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: memcpy)\n", "local protocol store", d.LocalStoreGBps, d.LocalStoreGBps/d.LocalStoreRatio, d.LocalStoreRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "local protocol retrieve", d.LocalRetrieveGBps, d.LocalRetrieveGBps/d.LocalRetrieveRatio, d.LocalRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: plain loopback TCP stream)\n", "TCP protocol store", d.TCPStoreGBps, d.TCPStreamGBps, d.TCPStoreRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f\n", "TCP protocol retrieve", d.TCPRetrieveGBps, d.TCPStreamGBps, d.TCPRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: plain loopback TCP stream, same rounds)\n", "P2P retrieve (peer's RAM)", d.P2PRetrieveGBps, d.P2PStreamGBps, d.P2PRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (peer found through a controller, same rounds)\n", "P2P retrieve via controller", d.P2PCtrlRetrieveGBps, d.P2PStreamGBps, d.P2PCtrlRetrieveRatio)
	fmt.Fprintf(w, "%-28s %10.2f %10.2f %8.2f  (baseline: plain loopback TCP stream, same rounds)\n", "PD push (daemon to daemon)", d.PDPushGBps, d.PDStreamGBps, d.PDPushRatio)
	printLookupRates(w, d)
}

// printLookupRates writes the lookup rates beside the empty round trips
// of the same run.
func printLookupRates(w io.Writer, d *DaemonReport) {
	fmt.Fprintf(w, "\n%d clients on the local socket, cached %d-token prompts; per second (median of slices), and ratio to the empty round trips just before (median):\n", d.LookupClients, d.LookupPrompt)
	fmt.Fprintf(w, "%-34s %10s %8s %8s %8s\n", "", "per s", "ratio", "CPU µs", "CPU rt")
	row := func(name, kind string, v, ratio float64, note string) {
		cpu := d.CPUMicros[kind]
		fmt.Fprintf(w, "%-34s %10.0f %8.2f %8.2f %8.2f  %s\n", name, v, ratio, cpu, d.EmptyCPUMicros/cpu, note)
	}
	row("empty round trips (baseline)", "empty", d.EmptyRoundTrips, 1, "16-byte frames with an echo server")
	row("same-bytes round trips", "same bytes", d.SameBytesRoundTrips, d.SameBytesRatio, "frames as long as LOOKUP's, same echo server")
	row("PING through the daemon", "ping", d.PingsPerSec, d.PingRatio, "")
	row("LOOKUP", "lookup", d.LookupsPerSec, d.LookupRatio, fmt.Sprintf("p50 %.1f µs, p99 %.1f µs", d.LookupP50Micros, d.LookupP99Micros))
	row(fmt.Sprintf("LOOKUP_BATCH of %d (lookups)", d.BatchSize), "batch", d.BatchLookupsPerSec, d.BatchRatio, "")
	row("LOOKUP, request buffer", "lookup, request buffer", d.SharedLookupsPerSec, d.SharedLookupRatio, "tokens copied into shared memory, not sent")
	row(fmt.Sprintf("LOOKUP_BATCH of %d, request buffer", d.BatchSize), "batch, request buffer", d.SharedBatchLookupsPerSec, d.SharedBatchRatio, "")
	row("LOOKUP, engine hashes (kind 1)", "lookup, engine hashes", d.HashLookupsPerSec, d.HashLookupRatio, "16-byte chunk hashes computed once, sent")
	row(fmt.Sprintf("LOOKUP_BATCH of %d, engine hashes", d.BatchSize), "batch, engine hashes", d.HashBatchLookupsPerSec, d.HashBatchRatio, "")
	row("LOOKUP, hashed by the client", "lookup, client hashes", d.ClientHashLookupsPerSec, d.ClientHashLookupRatio, "kind 1, the client hashing the prompt on every call")
	if d.External {
		fmt.Fprintf(w, "(CPU µs: this process's CPU time per operation, clients and echo server: the daemon at --socket is not counted, so CPU rt says little)\n")
		return
	}
	fmt.Fprintf(w, "(CPU µs: this process's CPU time per operation, clients, daemon and echo server together; CPU rt: the empty round trip's over it)\n")
}

// serveLocal serves svc on a Unix socket in a new temporary directory and
// returns the socket's path and what removes the directory.
func serveLocal(svc *server.Service) (string, func(), error) {
	dir, err := os.MkdirTemp("", "kvtier-bench")
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "kvtier.sock")
	ln, err := server.ListenUnix(sock, 0)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	go svc.Serve(ln)
	return sock, func() { os.RemoveAll(dir) }, nil
}
