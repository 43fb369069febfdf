package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/cluster"
	"kvtier/engine"
	"kvtier/tier/p2p"
)

// benchP2P times two daemons pulling the chunks from the first one's RAM
// through their P2P tiers (resolve, lease, RETRIEVE with checksums,
// promotion into their own RAM), next to a plain loopback TCP stream of
// the same bytes, all in the same rounds: one daemon lists the peer in
// p2p_peers, the other finds it through a controller's lookup, as a
// daemon with enable_p2p and controller_url does. The controller runs in
// this process, and the peer (the served engine at addr) joins it for
// the measurement: registration, chunk stream, resync. The pulling
// daemons are engines in this process too. Their deadlines are a second
// plus the bytes' time, so that a loaded machine slows a pull rather
// than failing it.
func benchP2P(ctx context.Context, f Options, r *Report, d *DaemonReport, peer *engine.Engine, addr string, src, dst [][]byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctrl, stopCtrl, err := startController(ctx)
	if err != nil {
		return err
	}
	defer stopCtrl()
	leave, err := joinCluster(ctx, f, peer, addr, ctrl)
	if err != nil {
		return err
	}
	defer leave()
	api := cluster.NewClient(ctrl, &http.Client{Timeout: 5 * time.Second})

	total := int64(f.Chunks * r.ChunkBytes)
	open := func(o engine.Options) (*engine.Engine, error) {
		o.ChunkSize, o.RAMBytes, o.Policy, o.Prefault = f.Tokens, 2*total+int64(r.ChunkBytes), "LRU", true
		o.P2PToken, o.RemoteTimeout = benchToken, time.Second
		return engine.Open(o)
	}
	static, err := open(engine.Options{P2PPeers: []string{addr}})
	if err != nil {
		return err
	}
	defer static.Close()
	viaCtrl, err := open(engine.Options{P2PResolver: lookupResolver(api)})
	if err != nil {
		return err
	}
	defer viaCtrl.Close()

	keys := make([]chunk.Key, f.Chunks)
	for round := range f.Rounds + 1 {
		stream, err := plainTCPStream(src, dst)
		if err != nil {
			return err
		}
		for i := range keys {
			keys[i] = benchKey(uint32(3000+round), i)
		}
		if n, err := peer.Manager().Store(ctx, keys, src); err != nil || n != len(keys) {
			return fmt.Errorf("storing on the peer: %d of %d, %v", n, len(keys), err)
		}
		if err := awaitIndexed(ctx, api, keys, addr); err != nil {
			return err
		}
		// Each goes first in every other round.
		pullers := []*engine.Engine{static, viaCtrl}
		if round%2 == 1 {
			pullers[0], pullers[1] = pullers[1], pullers[0]
		}
		speeds := map[*engine.Engine]float64{}
		for _, e := range pullers {
			if speeds[e], err = timePull(ctx, e, keys, total, src, dst); err != nil {
				return err
			}
		}
		if round > 0 {
			d.P2PStreamGBps = max(d.P2PStreamGBps, stream)
			d.P2PRetrieveGBps = max(d.P2PRetrieveGBps, speeds[static])
			d.P2PCtrlRetrieveGBps = max(d.P2PCtrlRetrieveGBps, speeds[viaCtrl])
		}
	}
	d.P2PRetrieveRatio = d.P2PRetrieveGBps / d.P2PStreamGBps
	d.P2PCtrlRetrieveRatio = d.P2PCtrlRetrieveGBps / d.P2PStreamGBps
	return nil
}

// timePull times one engine pulling keys through its P2P tier and checks
// the bytes.
func timePull(ctx context.Context, eng *engine.Engine, keys []chunk.Key, total int64, src, dst [][]byte) (float64, error) {
	m, a := eng.Manager(), eng.Arena()
	ids := make([]arena.ID, len(keys))
	var opErr error
	speed := bestOf(1, total, func() error {
		var n int
		if n, opErr = m.Acquire(ctx, keys, ids); opErr == nil && n != len(keys) {
			opErr = fmt.Errorf("pulled %d of %d", n, len(keys))
		}
		return opErr
	})
	if opErr != nil {
		return 0, opErr
	}
	for i, id := range ids {
		copy(dst[i], a.Bytes(id))
		a.Unref(id)
	}
	return speed, sameChunks("P2P bench", src, dst)
}

// lookupResolver finds holders through the controller's lookup, as the
// daemon's controller resolver does (without its own address to skip:
// the puller is not registered).
func lookupResolver(api *cluster.Client) p2p.Resolver {
	return p2p.FromLookup(chunk.Key.Index, func(ctx context.Context, ids []uint64) ([][]p2p.Peer, error) {
		hs, err := api.Lookup(ctx, ids)
		out := make([][]p2p.Peer, len(hs))
		for i, row := range hs {
			for _, h := range row {
				out[i] = append(out[i], p2p.Peer(h))
			}
		}
		return out, err
	})
}
