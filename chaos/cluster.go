package chaos

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kvtier/internal/servetest"
)

// controller is a running `kvtier controller`.
type controller struct {
	cmd    *exec.Cmd
	log    *servetest.Log
	exited chan error
}

// startController runs a controller on addr with 250 ms heartbeats and
// returns once it answers /healthz.
func startController(t testing.TB, addr string) *controller {
	t.Helper()
	return startControllerArgs(t, addr)
}

// startControllerArgs is startController with more arguments.
func startControllerArgs(t testing.TB, addr string, extra ...string) *controller {
	t.Helper()
	bin, err := servetest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"controller", "--listen", addr, "--hash-seed", "0", "--heartbeat-interval", "250ms"}, extra...)
	p := &controller{cmd: exec.Command(bin, args...),
		log: &servetest.Log{}, exited: make(chan error, 1)}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(p.kill)
	waitUntil(t, "the controller to answer", func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// kill ends the controller with SIGKILL.
func (p *controller) kill() {
	p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// instances lists the daemons registered with the controller at addr.
func instances(addr string) []string {
	resp, err := http.Get("http://" + addr + "/v1/cluster/instances")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var out struct{ Instances []struct{ Instance string } }
	if json.NewDecoder(resp.Body).Decode(&out) != nil {
		return nil
	}
	var names []string
	for _, in := range out.Instances {
		names = append(names, in.Instance)
	}
	slices.Sort(names)
	return names
}

// clusterConf is a daemon that joins the controller at ctrl as instance,
// finds peers through it, and keeps a disk tier in dir.
func clusterConf(dir, ctrl, instance string) string {
	return baseConf + fmt.Sprintf("max_local_cpu_size: 0.0078125\nlocal_disk: %s\nmax_local_disk_size: 0.0625\n"+
		"controller_url: http://%s\ninstance_id: %s\ncluster_events_endpoint: tcp://127.0.0.1:0\nenable_p2p: true\n",
		filepath.Join(dir, "disk"), ctrl, instance)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// p2pRead waits until chunk i reads back on c (through P2P from the
// daemon that holds it) and returns how long that took.
func p2pRead(t testing.TB, c *conn, i int, what string) time.Duration {
	t.Helper()
	return waitUntil(t, what, func() bool {
		found, _, err := c.get(i)
		return err == nil && found
	})
}

func span(from, to int) []int {
	var ids []int
	for i := from; i < to; i++ {
		ids = append(ids, i)
	}
	return ids
}

// clusterKill runs a controller and two daemons, d1 storing and d2
// reading d1's chunks through P2P, and kills the controller, then d1.
func clusterKill(t testing.TB, o Options, r *Report) {
	r.Checked = "in a controller + 2 daemon cluster, a killed controller leaves both daemons serving and storing, and once restarted gets them back; a killed peer makes P2P reads misses, never errors, and restarted on its disk its durable chunks are read through P2P again, byte-exact"
	ctrl := freeAddr(t)
	c := startController(t, ctrl)
	dir1, dir2 := t.TempDir(), t.TempDir()
	d1 := servetest.Start(t, dir1, clusterConf(dir1, ctrl, "d1"))
	d2 := servetest.Start(t, dir2, clusterConf(dir2, ctrl, "d2"))
	waitUntil(t, "both daemons to register", func() bool { return slices.Equal(instances(ctrl), []string{"d1", "d2"}) })
	run := newRun()
	w, rd := dialTCP(t, d1.TCP, run), dialTCP(t, d2.TCP, run)

	// Set A (0-15) and set B (16-31) stored on d1, made durable.
	const n = 32
	for i := range n {
		if ok, err := w.put(i); !ok {
			t.Fatalf("store %d on d1: %v", i, err)
		}
	}
	if ok, rep, err := w.flush(); !ok {
		t.Fatalf("FLUSH on d1 not durable: %+v %v", rep, err)
	}
	r.Stored, r.Durable = n, n
	p2pRead(t, rd, 0, "d2 to read d1's chunk through P2P")
	verifyRereading(t, rd, span(1, 16), func(int) bool { return true }, r)

	// The controller dies: both daemons go on serving and storing.
	c.kill()
	verifyRereading(t, rd, span(0, 16), func(int) bool { return true }, r) // now in d2's RAM
	// Stores go on for the load time while the controller is dead.
	deadline := time.Now().Add(o.load())
	outage := 100
	for ; outage < 108 || (time.Now().Before(deadline) && outage < 600); outage++ {
		if ok, err := w.put(outage); !ok {
			t.Errorf("store %d on d1 with the controller dead: %v", outage, err)
		}
		r.Stored++
	}
	durableOutage := false
	if ok, _, err := w.flush(); err == nil && ok {
		durableOutage = true
		r.Durable += outage - 100
	}
	restarted := time.Now()
	c = startController(t, ctrl)
	waitUntil(t, "both daemons to register again", func() bool { return slices.Equal(instances(ctrl), []string{"d1", "d2"}) })
	p2pRead(t, rd, 16, "P2P to work again after the controller restart")
	ctrlBack := time.Since(restarted)
	r.Note("controller restart: daemons registered and P2P served again after %v", ctrlBack.Round(time.Millisecond))

	// The peer dies: d2's reads of its chunks are misses.
	d1.Kill()
	var worst time.Duration
	for i := 17; i < 20; i++ {
		start := time.Now()
		found, _, err := rd.get(i)
		worst = max(worst, time.Since(start))
		if err != nil || found {
			t.Errorf("chunk %d on d2 with its only holder dead: found %v, %v (want a miss)", i, found, err)
		}
	}
	r.Note("reads of a dead peer's chunks: misses, slowest %v", worst.Round(time.Millisecond))
	restarted = time.Now()
	d1 = servetest.Start(t, dir1, clusterConf(dir1, ctrl, "d1"))
	p2pRead(t, rd, 17, "P2P to serve the restarted peer's chunks")
	peerBack := time.Since(restarted)
	r.Note("peer restart on its disk: P2P served its chunks again after %v", peerBack.Round(time.Millisecond))
	r.Recovery = max(ctrlBack, peerBack)
	// The restarted peer's chunks reach d2 as its resync and d2's view of
	// it (breaker, remembered holders) catch up, not all at once: wait for
	// each, so a durable chunk that never comes back fails the fault after
	// the hang limit and one that is merely late does not.
	for i := 18; i < n; i++ {
		p2pRead(t, rd, i, fmt.Sprintf("P2P to serve the restarted peer's chunk %d", i))
	}
	verifyRereading(t, rd, span(18, n), func(int) bool { return true }, r)
	w = dialTCP(t, d1.TCP, run)
	verifyRereading(t, w, span(0, n), func(int) bool { return true }, r)
	verifyRereading(t, w, span(100, outage), func(int) bool { return durableOutage }, r)
	select {
	case err := <-c.exited:
		t.Errorf("the restarted controller exited: %v", err)
	default:
	}
	if h := tierStats(t, d2, "p2p").Hits; h == 0 {
		t.Error("d2's P2P tier served nothing")
	} else {
		r.Note("d2's P2P tier served %d chunks", h)
	}
}
