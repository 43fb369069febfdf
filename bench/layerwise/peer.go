package layerwise

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvtier/engine"
	"kvtier/kvformat"
	"kvtier/server"
)

// The P2P rows (--peer): a second daemon in this process, served over
// TCP on loopback, holds the prefix on its disk or in its RAM; the
// measured engine has no tier but RAM and the P2P tier pointed at it, so
// every load crosses the peer protocol (RETRIEVE for whole chunks,
// RETRIEVE_RANGES for layers).

// peer is the daemon holding the prefix for the P2P rows.
type peer struct {
	*fixture
	svc   *server.Service
	done  chan error
	addr  string
	token string
	reg   *prometheus.Registry // svc's request counters
}

// startPeer opens an engine with a disk tier under o.Dir, stores the
// prefix in it and serves it on a loopback port.
func startPeer(o Options, spec kvformat.Spec, size int) (*peer, error) {
	f, err := newFixture(o, spec, size)
	if err != nil {
		return nil, err
	}
	token := make([]byte, 16)
	rand.Read(token)
	svc := server.NewService(f.eng, server.ServiceOptions{Token: hex.EncodeToString(token)})
	ln, err := svc.ListenTCP("127.0.0.1:0", nil)
	if err != nil {
		f.close()
		return nil, err
	}
	p := &peer{fixture: f, svc: svc, done: make(chan error, 1), addr: ln.Addr().String(), token: hex.EncodeToString(token),
		reg: prometheus.NewRegistry()}
	for _, c := range svc.Collectors() {
		if err := p.reg.Register(c); err != nil {
			ln.Close()
			f.close()
			return nil, err
		}
	}
	go func() { p.done <- svc.Serve(ln) }()
	return p, nil
}

// reader opens the measured engine: RAM and a P2P tier to p, holding p's
// prefix under the same keys. onDisk makes each load find the prefix on
// p's disk only (p's RAM is emptied first), else in p's RAM.
func (p *peer) reader(o Options, size int, onDisk bool) (*fixture, error) {
	total := int64(size) * int64(o.Chunks)
	eng, err := engine.Open(engine.Options{ChunkSize: o.ChunkTokens, RAMBytes: 2*total + 64<<20, Policy: "LRU",
		P2PPeers: []string{p.addr}, P2PToken: p.token, RemoteTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	// The geometry as the connector sends it: this engine never saw the
	// scope's format tag, which the peer's stores registered.
	f := &fixture{eng: eng, keys: p.keys, data: p.data, layers: p.layers, given: engine.Layers{Layers: p.layers, Parts: 2},
		requests: p.requests}
	if onDisk {
		f.before = p.evict
	} else {
		f.before = p.warm
	}
	return f, nil
}

// requests returns how many requests p has served, every operation: the
// round trips the reader paid.
func (p *peer) requests() float64 {
	fams, err := p.reg.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, f := range fams {
		if f.GetName() != "kvtier_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// warm brings the prefix back into p's RAM, where a layerwise load from
// its disk left it out (a whole load promotes it).
func (p *peer) warm() {
	_, id, _ := p.eng.PrepareRetrieve(context.Background(), p.keys, leaseTTL, nil)
	p.eng.Release(id)
}

func (p *peer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := errors.Join(p.svc.Shutdown(ctx), <-p.done)
	return errors.Join(err, p.fixture.close())
}

// peerRows measures the P2P rows: the prefix on the peer's disk, then in
// its RAM.
func peerRows(ctx context.Context, o Options, spec kvformat.Spec, size int, log func(string, ...any)) ([]TierRow, []TTFTRow, error) {
	p, err := startPeer(o, spec, size)
	if err != nil {
		return nil, nil, err
	}
	defer p.close()
	var rows []TierRow
	var ttft []TTFTRow
	for _, c := range []struct {
		name   string
		onDisk bool
	}{{"peer-disk", true}, {"peer-ram", false}} {
		log("layerwise: the same prefix from a peer daemon (%s, %s)\n", c.name, p.addr)
		f, err := p.reader(o, size, c.onDisk)
		if err != nil {
			return rows, ttft, err
		}
		row, perLayer, err := f.tierRow(ctx, c.name, o.Rounds)
		if err == nil && c.onDisk {
			err = p.servedByRanges(ctx, f)
		}
		if err == nil {
			var tt []TTFTRow
			tt, err = f.ttft(ctx, c.name, perLayer, o.Rounds)
			ttft = append(ttft, tt...)
			rows = append(rows, row)
		}
		err = errors.Join(err, f.close())
		if err != nil {
			return rows, ttft, err
		}
	}
	return rows, ttft, nil
}

// servedByRanges checks that a layerwise load of the prefix from p's disk
// went by ranges: p serves ranges of a disk-only chunk from its disk tier
// and leaves its RAM alone, where a whole read would promote the chunk.
func (p *peer) servedByRanges(ctx context.Context, f *fixture) error {
	if _, _, _, _, err := f.stream(ctx, true, nil); err != nil {
		return err
	}
	for i, k := range p.keys {
		if p.eng.InRAM(k) {
			return fmt.Errorf("layerwise: chunk %d was promoted on the peer: not read by ranges", i)
		}
	}
	return nil
}
