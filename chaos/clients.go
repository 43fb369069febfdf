package chaos

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/internal/servetest"
	"kvtier/wire"
)

// Client processes the lease fault kills: the suite's own executable run
// again with childEnv set (Child runs them).
const (
	childEnv     = "KVTIER_CHAOS_CHILD"
	childSockEnv = "KVTIER_CHAOS_SOCK"
	childRunEnv  = "KVTIER_CHAOS_RUN"
)

// ChildArgs are the arguments the executable is run with as a child:
// `kvtier chaos` sets {"chaos"}; a test binary needs none (its TestMain
// calls Child before parsing flags).
var ChildArgs []string

// Child runs the client process the lease fault asked for, if this
// process is one, and then exits; otherwise it returns at once. Call it
// first thing in TestMain and in `kvtier chaos`.
func Child() {
	mode := os.Getenv(childEnv)
	if mode == "" {
		return
	}
	run, _ := strconv.ParseUint(os.Getenv(childRunEnv), 10, 64)
	if err := holdLeases(mode, os.Getenv(childSockEnv), run); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	time.Sleep(time.Minute) // killed long before
	os.Exit(0)
}

// leaseChunks are the chunks a child takes leases on: the retriever on
// chunks 0-3 (stored by the parent), the storer on 100-103, half written.
const leaseChunks = 4

// holdLeases takes the leases of mode: "retrieve" pins stored chunks for a
// minute; "store" reserves chunks and writes half of each, never
// committing.
func holdLeases(mode, sock string, run uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	c, err := client.DialUnix(ctx, sock, client.Options{Name: "chaos-child"})
	if err != nil {
		return err
	}
	h, err := c.Scope(ctx, scope)
	if err != nil {
		return err
	}
	for j := range leaseChunks {
		switch mode {
		case "retrieve":
			s, err := c.PrepareRetrieve(ctx, client.Tokens(h, tokens(run, j), 0), 60_000)
			if err != nil || len(s.Slots) != 1 {
				return fmt.Errorf("prepare retrieve %d: %d slots, %v", j, len(s.Slots), err)
			}
		case "store":
			i := 100 + j
			s, err := c.PrepareStore(ctx, client.Tokens(h, tokens(run, i), 0), []uint32{chunkBytes}, 60_000)
			if err != nil || len(s.Slots) != 1 {
				return fmt.Errorf("prepare store %d: %d slots, %v", i, len(s.Slots), err)
			}
			dst, err := c.Slot(s.Slots[0])
			if err != nil {
				return err
			}
			copy(dst, payload(run, i)[:chunkBytes/2])
		default:
			return fmt.Errorf("unknown child mode %q", mode)
		}
	}
	return nil
}

// startChild runs a child in mode and returns once it holds its leases.
func startChild(t testing.TB, mode, sock string, run uint64) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, ChildArgs...)
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childSockEnv+"="+sock, childRunEnv+"="+strconv.FormatUint(run, 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("%s child: %q %v", mode, line, err)
	}
	return cmd
}

// clientLeaseDeath kills client processes holding leases on the local
// socket: the arena they pinned or reserved must come back, a store they
// never committed must stay invisible, and what they read stays cached.
func clientLeaseDeath(t testing.TB, o Options, r *Report) {
	r.Checked = "after SIGKILL of clients holding retrieve and store leases, every pinned byte and lease is released, the uncommitted store is invisible, and the chunks they read stay cached with their bytes"
	d := servetest.Start(t, t.TempDir(), baseConf+"max_local_cpu_size: 0.015625\n")
	for round := range o.rounds() {
		run := newRun()
		c := dialUnix(t, d.Sock, run)
		for i := range leaseChunks {
			if ok, err := c.put(i); !ok {
				t.Fatalf("store %d: %v", i, err)
			}
			r.Stored++
		}
		reader := startChild(t, "retrieve", d.Sock, run)
		writer := startChild(t, "store", d.Sock, run)
		a := stats(t, d).Arena
		if a.PinnedBytes < leaseChunks*chunkBytes || a.Leases < 2*leaseChunks {
			t.Fatalf("the children's leases are not held: %+v", a)
		}
		r.Note("round %d: children held %d leases, %d pinned bytes", round, a.Leases, a.PinnedBytes)
		start := time.Now()
		reader.Process.Kill()
		writer.Process.Kill()
		reader.Wait()
		writer.Wait()
		waitUntil(t, "the killed clients' leases to end", func() bool {
			a := stats(t, d).Arena
			return a.PinnedBytes == 0 && a.Leases == 0
		})
		r.Recovery = max(r.Recovery, time.Since(start))
		for j := range leaseChunks {
			found, wrong, err := c.get(100 + j)
			if err != nil || found {
				t.Errorf("chunk %d, never committed by a killed client: found %v (%d wrong bytes), %v", 100+j, found, wrong, err)
				r.WrongBytes += wrong
			}
		}
		ids := []int{0, 1, 2, 3}
		// RAM is all this daemon has: its acknowledged chunks are what
		// must survive a client's death.
		r.Durable += leaseChunks
		verify(t, c, ids, func(int) bool { return true }, r)
	}
}

// hostileClients runs connections that misbehave beside a client that
// stores and reads: slow ones (slowloris), ones sending random bytes, and
// ones that send a frame header and part of its body, then stall. The
// daemon must serve the good client throughout and cut every hostile
// connection off by itself.
func hostileClients(t testing.TB, o Options, r *Report) {
	r.Checked = "slowloris, random-byte and truncated-frame connections on TCP and the local socket are all cut off by the daemon, while a client beside them stores and reads every chunk correctly"
	d := servetest.Start(t, t.TempDir(), baseConf+"max_local_cpu_size: 0.0625\nframe_timeout: 1s\n")
	run := newRun()
	good := dialUnix(t, d.Sock, run)

	type cut struct {
		kind string
		took time.Duration // from the last byte sent to the daemon closing
		err  error
	}
	cuts := make(chan cut, 64)
	var wg sync.WaitGroup
	for _, network := range []string{"tcp", "unix"} {
		addr := d.TCP
		if network == "unix" {
			addr = d.Sock
		}
		for _, kind := range []string{"slowloris", "garbage", "truncated"} {
			for range 4 {
				wg.Go(func() {
					took, err := hostile(network, addr, kind)
					cuts <- cut{network + " " + kind, took, err}
				})
			}
		}
	}
	const goodChunks = 400 // 25 MiB of the 64 MiB RAM tier
	stop := make(chan struct{})
	var served sync.WaitGroup
	var acked []int
	served.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i >= goodChunks { // RAM holds them all: read one back instead
				if found, wrong, err := good.get(i % goodChunks); err != nil || !found || wrong > 0 {
					t.Errorf("the good client's read of %d: found %v, %d wrong bytes, %v", i%goodChunks, found, wrong, err)
					return
				}
				continue
			}
			ok, err := good.put(i)
			if !ok {
				t.Errorf("the good client's store %d: %v", i, err)
				return
			}
			acked = append(acked, i)
		}
	})
	wg.Wait()
	close(cuts)
	time.Sleep(max(0, o.load()-time.Second))
	close(stop)
	served.Wait()

	worst := map[string]time.Duration{}
	for c := range cuts {
		if c.err != nil {
			t.Errorf("%s: %v", c.kind, c.err)
		}
		worst[c.kind] = max(worst[c.kind], c.took)
		r.Recovery = max(r.Recovery, c.took)
	}
	for kind, took := range worst {
		r.Note("%s connections cut off at worst %v after their last byte", kind, took.Round(time.Millisecond))
	}
	r.Stored, r.Durable = len(acked), len(acked)
	verify(t, good, acked, func(int) bool { return true }, r)
	// A session counts until its cleanup ends, a moment after the peer
	// sees the connection closed.
	waitUntil(t, "kvtier_client_connections to count the good client alone", func() bool {
		return d.Metric(t, "kvtier_client_connections") == "1"
	})
}

// hostile opens one misbehaving connection, sends what kind sends, and
// waits for the daemon to close it. It returns how long after the last
// byte sent that was.
func hostile(network, addr, kind string) (time.Duration, error) {
	c, err := net.DialTimeout(network, addr, hang)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(hang))
	hello := (&wire.Hello{Version: wire.Version, Name: "slow"}).Append(nil)
	frame := make([]byte, wire.HeaderSize, wire.HeaderSize+len(hello))
	wire.Header{Len: uint32(len(hello)), Op: wire.OpHello, ID: 1}.Put(frame)
	frame = append(frame, hello...)
	switch kind {
	case "slowloris": // a valid HELLO, one byte every 50 ms
		for _, b := range frame[:len(frame)-1] {
			if _, err := c.Write([]byte{b}); err != nil {
				return 0, nil // cut off while still sending
			}
			time.Sleep(50 * time.Millisecond)
		}
	case "garbage":
		junk := make([]byte, 4096)
		rand.Read(junk)
		if _, err := c.Write(junk); err != nil {
			return 0, nil
		}
	case "truncated": // a whole HELLO, then a frame cut short: its header and part of its body
		if _, err := c.Write(frame); err != nil {
			return 0, err
		}
		if err := readFrame(c); err != nil {
			return 0, fmt.Errorf("HELLO reply: %v", err)
		}
		part := make([]byte, wire.HeaderSize+8)
		wire.Header{Len: 64, Op: wire.OpScope, ID: 2}.Put(part)
		if _, err := c.Write(part); err != nil {
			return 0, err
		}
	}
	sent := time.Now()
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return time.Since(sent), fmt.Errorf("not cut off after %v", hang)
			}
			return time.Since(sent), nil
		}
	}
}

// readFrame reads one frame (a reply) from c.
func readFrame(c net.Conn) error {
	hdr := make([]byte, wire.HeaderSize)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return err
	}
	h, err := wire.ParseHeader(hdr)
	if err != nil {
		return err
	}
	if h.Status != wire.StatusOK {
		return fmt.Errorf("status %v", h.Status)
	}
	_, err = io.CopyN(io.Discard, c, int64(h.Len))
	return err
}
