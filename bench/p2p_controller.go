package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/cluster/member"
	"kvtier/controller"
	"kvtier/engine"
	"kvtier/server"
	"kvtier/tier/p2p"
)

// benchP2PController times the P2P pull of benchP2P with the peer found
// through a controller, as a daemon with enable_p2p and controller_url
// finds it: a controller runs in this process, the peer joins it
// (registration, chunk stream, resync) and the pulling engine's resolver
// is the controller's lookup. The plain loopback TCP stream is measured
// again in the same rounds, so the ratio compares like with like.
func benchP2PController(ctx context.Context, f Options, r *Report, d *DaemonReport, src, dst [][]byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctrl, stopCtrl, err := startController(ctx)
	if err != nil {
		return err
	}
	defer stopCtrl()
	peer, peerAddr, stopPeer, err := startClusterPeer(ctx, f, r, ctrl)
	if err != nil {
		return err
	}
	defer stopPeer()

	api := cluster.NewClient(ctrl, &http.Client{Timeout: 5 * time.Second})
	res := p2p.FromLookup(chunk.Key.Index, func(ctx context.Context, ids []uint64) ([][]p2p.Peer, error) {
		hs, err := api.Lookup(ctx, ids)
		out := make([][]p2p.Peer, len(hs))
		for i, row := range hs {
			for _, h := range row {
				out[i] = append(out[i], p2p.Peer(h))
			}
		}
		return out, err
	})
	total := int64(f.Chunks * r.ChunkBytes)
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 2*total + int64(r.ChunkBytes), Policy: "LRU",
		Prefault: true, P2PResolver: res, P2PToken: benchToken, RemoteTimeout: time.Second})
	if err != nil {
		return err
	}
	defer eng.Close()
	m, a := eng.Manager(), eng.Arena()
	ids := make([]arena.ID, f.Chunks)
	keys := make([]chunk.Key, f.Chunks)
	for round := range f.Rounds + 1 {
		stream, err := plainTCPStream(src, dst)
		if err != nil {
			return err
		}
		for i := range keys {
			keys[i] = benchKey(uint32(5000+round), i)
		}
		if n, err := peer.Manager().Store(ctx, keys, src); err != nil || n != len(keys) {
			return fmt.Errorf("storing on the peer: %d of %d, %v", n, len(keys), err)
		}
		if err := awaitIndexed(ctx, api, keys, peerAddr); err != nil {
			return err
		}
		var opErr error
		pull := bestOf(1, total, func() error {
			var n int
			if n, opErr = m.Acquire(ctx, keys, ids); opErr == nil && n != len(keys) {
				opErr = fmt.Errorf("pulled %d of %d", n, len(keys))
			}
			return opErr
		})
		if opErr != nil {
			return opErr
		}
		for i, id := range ids {
			copy(dst[i], a.Bytes(id))
			a.Unref(id)
		}
		if err := sameChunks("P2P bench (controller)", src, dst); err != nil {
			return err
		}
		if round > 0 {
			d.P2PCtrlStreamGBps = max(d.P2PCtrlStreamGBps, stream)
			d.P2PCtrlRetrieveGBps = max(d.P2PCtrlRetrieveGBps, pull)
		}
	}
	d.P2PCtrlRetrieveRatio = d.P2PCtrlRetrieveGBps / d.P2PCtrlStreamGBps
	return nil
}

var controllerListening = regexp.MustCompile(`msg="controller listening" addr=(\S+)`)

// startController runs a controller in this process on a loopback port
// and returns its base URL once it listens.
func startController(ctx context.Context) (string, func(), error) {
	seed := "0"
	cfg := controller.Default()
	// Its log (at info: the listening line names the port) stays here.
	cfg.Listen, cfg.HashSeed, cfg.HeartbeatInterval = "127.0.0.1:0", &seed, 250*time.Millisecond
	logs := &lineLog{}
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan error, 1)
	go func() { exited <- controller.Run(ctx, func() {}, cfg, logs) }()
	stop := func() { cancel(); <-exited }
	deadline := time.After(10 * time.Second)
	for {
		if m := controllerListening.FindStringSubmatch(logs.String()); m != nil {
			return "http://" + m[1], stop, nil
		}
		select {
		case err := <-exited:
			return "", nil, fmt.Errorf("controller: %v\n%s", err, logs)
		case <-deadline:
			stop()
			return "", nil, errors.New("controller: not listening after 10s")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lineLog collects a controller's log lines.
type lineLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startClusterPeer serves an engine over TCP that joins the controller
// at ctrl as a daemon does: its chunk stream, a member that registers and
// beats, and the admin route the controller asks for resyncs on.
func startClusterPeer(ctx context.Context, f Options, r *Report, ctrl string) (*engine.Engine, string, func(), error) {
	total := int64(f.Chunks * r.ChunkBytes)
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 2*total + int64(r.ChunkBytes), Policy: "LRU", Prefault: true})
	if err != nil {
		return nil, "", nil, err
	}
	svc := server.NewService(eng, server.ServiceOptions{Token: benchToken})
	tln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		eng.Close()
		return nil, "", nil, err
	}
	go svc.Serve(tln)
	addr := tln.Addr().String()
	stream, err := member.NewStream("tcp://127.0.0.1:0", "bench-peer", nil)
	if err != nil {
		svc.Shutdown(context.Background())
		eng.Close()
		return nil, "", nil, err
	}
	eng.SetObserver(stream)
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stream.Close()
		svc.Shutdown(context.Background())
		eng.Close()
		return nil, "", nil, err
	}
	mb := member.New(member.Options{Controller: ctrl, Interval: 250 * time.Millisecond, Stream: stream, Lister: eng,
		Log: slog.New(slog.DiscardHandler), Register: cluster.Register{Instance: "bench-peer", Addr: addr,
			Events: "tcp://" + stream.Addr(), Admin: "http://" + aln.Addr().String(), ChunkSize: f.Tokens}})
	admin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mb.StartResync()
		w.WriteHeader(http.StatusAccepted)
	})}
	go admin.Serve(aln)
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); mb.Run(mctx) }()
	stop := func() {
		cancel()
		<-done
		admin.Close()
		svc.Shutdown(context.Background())
		stream.Close()
		eng.Close()
	}
	return eng, addr, stop, nil
}

// awaitIndexed waits until the controller lists the peer at addr as a
// holder of every key: the chunk stream is asynchronous, and a pull
// timed before it lands would time misses.
func awaitIndexed(ctx context.Context, api *cluster.Client, keys []chunk.Key, addr string) error {
	ids := make([]uint64, len(keys))
	for i, k := range keys {
		ids[i] = k.Index()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		hs, err := api.Lookup(ctx, ids)
		held := 0
		for _, row := range hs {
			for _, h := range row {
				if h.Addr == addr {
					held++
					break
				}
			}
		}
		if err == nil && held == len(ids) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the controller lists the peer for %d of %d chunks after 20s (%v)", held, len(ids), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
