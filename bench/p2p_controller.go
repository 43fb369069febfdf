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

	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/cluster/member"
	"kvtier/controller"
	"kvtier/engine"
)

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

// joinCluster makes the engine served at addr join the controller at
// ctrl as a daemon does: its chunk stream, a member that registers and
// beats, and the admin route the controller asks for resyncs on. The
// returned function leaves.
func joinCluster(ctx context.Context, f Options, eng *engine.Engine, addr, ctrl string) (func(), error) {
	stream, err := member.NewStream("tcp://127.0.0.1:0", "bench-peer", nil)
	if err != nil {
		return nil, err
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		stream.Close()
		return nil, err
	}
	eng.SetObserver(stream)
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
	return func() {
		cancel()
		<-done
		admin.Close()
		eng.SetObserver(nil)
		stream.Close()
	}, nil
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
