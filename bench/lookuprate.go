package bench

import (
	"bufio"
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
	"kvtier/internal/proccpu"
	"kvtier/server"
	"kvtier/wire"
)

// The LOOKUP rate is measured against what the socket itself can do, in
// the same run: clients each on their own connection of the same kind (a
// Unix socket) doing request/response round trips of empty frames against
// an echo server that reads a frame and writes one back and does nothing
// else. Each slice of a measured kind follows a slice of empty round trips,
// and its ratio is to that one: the load of a shared machine drifts over
// seconds, so only slices next to each other compare fairly. Rates and
// ratios are the medians over the rounds.
const (
	rateClients = 4
	ratePrompt  = 4096    // tokens per looked-up prompt
	rateBatch   = 16      // prompts, and lookups per LOOKUP_BATCH
	rateBuffer  = 1 << 20 // bytes of a request buffer: a batch's tokens fit
	rateRounds  = 8
	rateSlice   = 100 * time.Millisecond
)

// rateKind is one thing measured: a way to open a client and the request
// it repeats.
type rateKind struct {
	name   string
	dial   func(ctx context.Context) (rateClient, error)
	rates  []float64 // operations per second, one per slice
	ratios []float64 // each slice's rate over the empty round trips' just before
	cpu    []float64 // µs of this process's CPU time per operation, one per slice
	lat    []float64 // µs per call, all slices (LOOKUP only)
	track  bool
}

// median returns the median of v (sorting it).
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// rateClient repeats one request; do returns the operations it served
// (lookups for a batch).
type rateClient interface {
	do(ctx context.Context) (int, error)
	io.Closer
}

// benchLookups runs LOOKUPs and LOOKUP_BATCHes of cached prompts from
// several clients against the daemon at sock, next to empty round trips
// on the same kind of socket, and reports the rates and their ratios.
func benchLookups(ctx context.Context, d *DaemonReport, sock string) error {
	d.LookupClients, d.LookupPrompt, d.BatchSize = rateClients, ratePrompt, rateBatch
	ps, err := storePrompts(ctx, sock)
	if err != nil {
		return err
	}
	// The request and reply a LOOKUP exchanges, for the echo of the same
	// bytes: what the socket alone costs for them.
	reqBody, replyBody := lookupFrameLens(ps[0].tokens)
	echoSrv, err := startEcho()
	if err != nil {
		return err
	}
	defer echoSrv.Close()
	kinds := []*rateKind{
		{name: "empty", dial: func(context.Context) (rateClient, error) { return dialEcho(echoSrv.Addr().String(), 0, 0) }},
		{name: "same bytes", dial: func(context.Context) (rateClient, error) {
			return dialEcho(echoSrv.Addr().String(), reqBody, replyBody)
		}},
		{name: "ping", dial: func(ctx context.Context) (rateClient, error) { return dialPing(ctx, sock) }},
		{name: "lookup", track: true, dial: func(ctx context.Context) (rateClient, error) { return dialLookup(ctx, sock, ps, 1, 0) }},
		{name: "batch", dial: func(ctx context.Context) (rateClient, error) { return dialLookup(ctx, sock, ps, rateBatch, 0) }},
		{name: "lookup, request buffer", dial: func(ctx context.Context) (rateClient, error) {
			return dialLookup(ctx, sock, ps, 1, rateBuffer)
		}},
		{name: "batch, request buffer", dial: func(ctx context.Context) (rateClient, error) {
			return dialLookup(ctx, sock, ps, rateBatch, rateBuffer)
		}},
		{name: "lookup, engine hashes", dial: func(ctx context.Context) (rateClient, error) { return dialHashLookup(ctx, sock, ps, 1, false) }},
		{name: "batch, engine hashes", dial: func(ctx context.Context) (rateClient, error) {
			return dialHashLookup(ctx, sock, ps, rateBatch, false)
		}},
		{name: "lookup, client hashes", dial: func(ctx context.Context) (rateClient, error) { return dialHashLookup(ctx, sock, ps, 1, true) }},
	}
	empty := kinds[0]
	for round := range rateRounds {
		for _, k := range kinds[1:] {
			base, err := empty.measure(ctx)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", empty.name, round, err)
			}
			rate, err := k.measure(ctx)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", k.name, round, err)
			}
			k.ratios = append(k.ratios, rate/base)
		}
	}
	d.EmptyRoundTrips, d.EmptyCPUMicros = median(empty.rates), median(empty.cpu)
	d.CPUMicros = make(map[string]float64, len(kinds))
	for _, k := range kinds {
		d.CPUMicros[k.name] = median(k.cpu)
	}
	rate := func(i int) (float64, float64) { return median(kinds[i].rates), median(kinds[i].ratios) }
	d.SameBytesRoundTrips, d.SameBytesRatio = rate(1)
	d.PingsPerSec, d.PingRatio = rate(2)
	d.LookupsPerSec, d.LookupRatio = rate(3)
	d.BatchLookupsPerSec, d.BatchRatio = rate(4)
	d.SharedLookupsPerSec, d.SharedLookupRatio = rate(5)
	d.SharedBatchLookupsPerSec, d.SharedBatchRatio = rate(6)
	d.HashLookupsPerSec, d.HashLookupRatio = rate(7)
	d.HashBatchLookupsPerSec, d.HashBatchRatio = rate(8)
	d.ClientHashLookupsPerSec, d.ClientHashLookupRatio = rate(9)
	lat := kinds[3].lat
	slices.Sort(lat)
	d.LookupP50Micros = lat[len(lat)/2]
	d.LookupP99Micros = lat[len(lat)*99/100]
	return nil
}

// lookupFrameLens returns the body lengths of a LOOKUP of tokens and of
// its reply from a daemon with one tier.
func lookupFrameLens(tokens []uint32) (req, reply int) {
	req = len((&wire.Lookup{Keys: client.Tokens(1, tokens, 0)}).Append(nil))
	reply = len((&wire.LookupReply{ByTier: make([]uint32, 1)}).Append(nil))
	return req, reply
}

// benchPrompt is a looked-up prompt and the hit its lookup must report.
type benchPrompt struct {
	tokens         []uint32
	hashes         []chunk.Hash // its chunks' hashes (storeHashKeys)
	chunks, cached int          // cached of its chunks are stored
}

// storePrompts stores rateBatch prompts of ratePrompt tokens, all but the
// last 0 to 3 chunks of each (small chunks: only lookups are measured),
// so that every lookup hashes a whole prompt and a mixed-up answer shows.
func storePrompts(ctx context.Context, sock string) ([]benchPrompt, error) {
	c, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	h, err := c.Scope(ctx, benchScope)
	if err != nil {
		return nil, err
	}
	// The daemon's chunk size: one at --socket may have its own.
	n := (ratePrompt + c.ChunkTokens() - 1) / c.ChunkTokens()
	small := make([][]byte, n)
	for i := range small {
		small[i] = make([]byte, 4096)
	}
	ps := make([]benchPrompt, rateBatch)
	for i := range ps {
		p := benchPrompt{tokens: benchTokens(ratePrompt, uint32(77+i)), chunks: n, cached: max(1, n-i%4)}
		stored, err := c.Store(ctx, client.Tokens(h, p.tokens, 0), small[:p.cached])
		if err == nil && stored != p.cached {
			err = fmt.Errorf("stored %d of %d chunks", stored, p.cached)
		}
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	return ps, storeHashKeys(ctx, c, h, ps, small)
}

// measure runs one slice: rateClients clients, each on a connection of
// its own opened before the clock starts, repeat their request until the
// slice is over. It returns the slice's rate.
func (k *rateKind) measure(ctx context.Context) (float64, error) {
	cs := make([]rateClient, 0, rateClients)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range rateClients {
		c, err := k.dial(ctx)
		if err != nil {
			return 0, err
		}
		cs = append(cs, c)
	}
	counts := make([]int, len(cs))
	lats := make([][]float64, len(cs))
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	// Clients, daemon and echo server all run in this process, so its CPU
	// time over the slice is what the slice's requests cost, whoever else
	// uses the machine.
	cpu0 := proccpu.Used()
	start := time.Now()
	until := start.Add(rateSlice)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if k.track {
				lats[i] = make([]float64, 0, 1<<16)
			}
			for {
				t0 := time.Now()
				if t0.After(until) {
					return
				}
				got, err := c.do(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				counts[i] += got
				if k.track {
					lats[i] = append(lats[i], float64(time.Since(t0).Nanoseconds())/1e3)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := proccpu.Used() - cpu0
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	rate := float64(total) / elapsed.Seconds()
	k.rates = append(k.rates, rate)
	k.cpu = append(k.cpu, float64(cpu.Nanoseconds())/1e3/float64(max(total, 1)))
	for _, l := range lats {
		k.lat = append(k.lat, l...)
	}
	return rate, nil
}

// echoServer answers every frame on a Unix socket with a frame whose body
// is as long as the request's id says, reading through a buffer as the
// daemon's connections do: the least a server of this protocol's framing
// can do per round trip.
type echoServer struct {
	ln  net.Listener
	dir string
}

func startEcho() (*echoServer, error) {
	dir, err := os.MkdirTemp("", "kvtier-echo")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "echo.sock"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go echo(c)
		}
	}()
	return &echoServer{ln: ln, dir: dir}, nil
}

func (e *echoServer) Addr() net.Addr { return e.ln.Addr() }

func (e *echoServer) Close() error {
	err := e.ln.Close()
	os.RemoveAll(e.dir)
	return err
}

// echo reads frames and answers each with a reply of the body length the
// request's id asks for.
func echo(c net.Conn) {
	defer c.Close()
	rd := wire.NewReader(bufio.NewReaderSize(c, 64<<10))
	var out []byte
	for {
		h, err := rd.Header()
		if err != nil {
			return
		}
		if _, err := rd.BodyView(h); err != nil {
			return
		}
		out = wire.Begin(out)
		out = append(out, make([]byte, h.ID)...)
		if _, err := c.Write(wire.Finish(out, wire.OpPing, wire.FlagReply, h.ID, wire.StatusOK)); err != nil {
			return
		}
	}
}

// echoClient sends frames of reqBody body bytes and reads replies of
// replyBody.
type echoClient struct {
	conn  net.Conn
	rd    *wire.Reader
	frame []byte
	reply uint32
}

func dialEcho(addr string, reqBody, replyBody int) (*echoClient, error) {
	conn, err := net.Dial("unix", addr)
	if err != nil {
		return nil, err
	}
	frame := append(wire.Begin(nil), make([]byte, reqBody)...)
	frame = wire.Finish(frame, wire.OpPing, 0, uint32(replyBody), wire.StatusOK)
	return &echoClient{conn: conn, rd: wire.NewReader(bufio.NewReaderSize(conn, 64<<10)), frame: frame, reply: uint32(replyBody)}, nil
}

func (e *echoClient) do(context.Context) (int, error) {
	if _, err := e.conn.Write(e.frame); err != nil {
		return 0, err
	}
	h, err := e.rd.Header()
	if err == nil && h.Len != e.reply {
		err = fmt.Errorf("echo reply of %d bytes, want %d", h.Len, e.reply)
	}
	if err == nil {
		_, err = e.rd.Body(h)
	}
	return 1, err
}

func (e *echoClient) Close() error { return e.conn.Close() }

// pingClient round-trips empty PINGs through the daemon.
type pingClient struct{ *client.Client }

func dialPing(ctx context.Context, sock string) (rateClient, error) {
	c, err := client.DialUnix(ctx, sock, client.Options{})
	if err != nil {
		return nil, err
	}
	return pingClient{c}, nil
}

func (p pingClient) do(ctx context.Context) (int, error) { return 1, p.Ping(ctx) }

// lookupClient looks the prompts up, one LOOKUP after another or all in
// one LOOKUP_BATCH, and checks every answer. With a request buffer, the client copies each prompt's tokens
// into it on every call.
type lookupClient struct {
	*client.Client
	prompts []benchPrompt
	keys    []wire.Lookup
	batch   bool // all prompts in one LOOKUP_BATCH, else one LOOKUP each
	next    int
	chunk   int // tokens per chunk
}

func dialLookup(ctx context.Context, sock string, ps []benchPrompt, batch, buffer int) (rateClient, error) {
	c, err := client.DialUnix(ctx, sock, client.Options{RequestBuffer: buffer})
	if err != nil {
		return nil, err
	}
	h, err := c.Scope(ctx, benchScope)
	if err != nil {
		c.Close()
		return nil, err
	}
	l := &lookupClient{Client: c, prompts: ps, batch: batch > 1, chunk: c.ChunkTokens()}
	l.keys = make([]wire.Lookup, len(ps))
	for i, p := range ps {
		l.keys[i].Keys = client.Tokens(h, p.tokens, 0)
	}
	return l, nil
}

func (l *lookupClient) do(ctx context.Context) (int, error) {
	if !l.batch {
		i := l.next % len(l.prompts)
		l.next++
		hit, err := l.Lookup(ctx, l.keys[i].Keys, 0)
		if err != nil {
			return 0, err
		}
		return 1, l.check(i, &hit)
	}
	res, err := l.LookupBatch(ctx, l.keys)
	if err != nil {
		return 0, err
	}
	for i := range res {
		if err := client.ResultErr(&res[i]); err != nil {
			return 0, err
		}
		if err := l.check(i, &res[i].Reply); err != nil {
			return 0, err
		}
	}
	return len(res), nil
}

func (l *lookupClient) check(i int, hit *wire.LookupReply) error {
	p := &l.prompts[i]
	want := min(len(p.tokens), p.cached*l.chunk)
	if int(hit.Chunks) != p.cached || int(hit.Tokens) != want {
		return fmt.Errorf("lookup of prompt %d hit %d chunks, %d tokens; want %d, %d", i, hit.Chunks, hit.Tokens, p.cached, want)
	}
	return nil
}

// benchLookupsOnly measures the lookup rates alone (--lookups-only),
// against a daemon served in this process on a Unix socket, or the one at
// --socket.
func benchLookupsOnly(ctx context.Context, f Options, r *Report, progress io.Writer) error {
	d := &DaemonReport{External: f.Socket != ""}
	r.Daemon = d
	if f.Socket != "" {
		fmt.Fprintf(progress, "daemon at %s: lookups from concurrent clients, empty round trips ...\n", f.Socket)
		return benchLookups(ctx, d, f.Socket)
	}
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 64 << 20, Policy: "LRU"})
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
	fmt.Fprintln(progress, "daemon: lookups from concurrent clients, empty round trips ...")
	return benchLookups(ctx, d, sock)
}
