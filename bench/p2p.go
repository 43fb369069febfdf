package bench

import (
	"context"
	"fmt"
	"time"

	"kvtier/arena"
	"kvtier/chunk"
	"kvtier/engine"
)

// benchP2P times a second daemon pulling the chunks from the first one's
// RAM through its P2P tier (resolve, lease, RETRIEVE with checksums,
// promotion into its own RAM), next to a plain loopback TCP stream of the
// same bytes in the same round. The pulling daemon is an engine in this
// process whose only peer is the daemon at addr, the served engine peer.
// Its deadlines are a second plus the bytes' time, as in the controller
// case, so that a loaded machine slows a pull rather than failing it.
func benchP2P(ctx context.Context, f Options, r *Report, d *DaemonReport, peer *engine.Engine, addr string, src, dst [][]byte) error {
	total := int64(f.Chunks * r.ChunkBytes)
	eng, err := engine.Open(engine.Options{ChunkSize: f.Tokens, RAMBytes: 2*total + int64(r.ChunkBytes), Policy: "LRU",
		Prefault: true, P2PPeers: []string{addr}, P2PToken: benchToken, RemoteTimeout: time.Second})
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
			keys[i] = benchKey(uint32(3000+round), i)
		}
		if n, err := peer.Manager().Store(ctx, keys, src); err != nil || n != len(keys) {
			return fmt.Errorf("storing on the peer: %d of %d, %v", n, len(keys), err)
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
		if err := sameChunks("P2P bench", src, dst); err != nil {
			return err
		}
		if round > 0 {
			d.P2PStreamGBps = max(d.P2PStreamGBps, stream)
			d.P2PRetrieveGBps = max(d.P2PRetrieveGBps, pull)
		}
	}
	d.P2PRetrieveRatio = d.P2PRetrieveGBps / d.P2PStreamGBps
	return nil
}
