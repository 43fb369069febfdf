package engine

import (
	"context"
	"errors"
	"sync"

	"kvtier/chunk"
	"kvtier/tier"
)

// Layer feeds (docs/disaggregation.md, docs/layerwise.md): a producer
// daemon pushes the chunks of a store lease that is still being filled,
// layer by layer, as the client's STORE_LAYER notices say each layer is
// final. A LayerFeed is what the pushing side waits on: the layers noticed
// so far, the geometry they follow, and how the lease ended.

// ErrStoreAborted is a feed's answer for a chunk whose store lease ended
// without committing it: its bytes will never be final.
var ErrStoreAborted = errors.New("the store was given up before its chunk was committed")

// LayerFeed follows the layers of one store lease. It is safe for
// concurrent use.
type LayerFeed struct {
	mu        sync.Mutex
	changed   chan struct{} // made by a waiter, closed at the next change
	geo       tier.LayerGeometry
	ready     int // leading layers noticed
	noticed   []uint64
	ended     bool // committed or given up
	committed int  // chunks committed, when ended
}

func newLayerFeed() *LayerFeed { return &LayerFeed{} }

// notice records layer as final, under geometry geo (the first valid one
// sticks).
func (f *LayerFeed) notice(layer int, geo tier.LayerGeometry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended || layer < 0 || layer >= tier.MaxLayers {
		return
	}
	if !f.geo.Valid() && geo.Valid() {
		f.geo = geo
	}
	w := layer / 64
	for len(f.noticed) <= w {
		f.noticed = append(f.noticed, 0)
	}
	f.noticed[w] |= 1 << (layer % 64)
	for f.ready < len(f.noticed)*64 && f.noticed[f.ready/64]&(1<<(f.ready%64)) != 0 {
		f.ready++
	}
	f.wakeLocked()
}

// end records the lease's end: its first committed chunks are final in
// every layer, the rest given up.
func (f *LayerFeed) end(committed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return
	}
	f.ended, f.committed = true, committed
	f.wakeLocked()
}

func (f *LayerFeed) wakeLocked() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// waitChanLocked returns the channel the next change closes.
func (f *LayerFeed) waitChanLocked() chan struct{} {
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

// Geometry waits until the feed knows how its chunks split into layers
// (the first notice with a geometry) or the lease ended, and returns the
// geometry; a zero one means the chunks are sent whole, once committed.
func (f *LayerFeed) Geometry(ctx context.Context) (tier.LayerGeometry, error) {
	for {
		f.mu.Lock()
		geo, ended, ch := f.geo, f.ended, f.waitChanLocked()
		f.mu.Unlock()
		if geo.Valid() || ended {
			return geo, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return tier.LayerGeometry{}, ctx.Err()
		}
	}
}

// WaitLayer waits until layers [0, upto) of chunk j of the lease (its
// index among the lease's chunks) are final — noticed, or committed — and
// returns ErrStoreAborted once the lease ended without committing chunk j.
func (f *LayerFeed) WaitLayer(ctx context.Context, j, upto int) error {
	for {
		f.mu.Lock()
		ready, ended, committed, ch := f.ready, f.ended, f.committed, f.waitChanLocked()
		f.mu.Unlock()
		switch {
		case ended && j < committed:
			return nil
		case ended:
			return ErrStoreAborted
		case ready >= upto:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Fed is one chunk a producer pushes from a store lease in progress: its
// feed and its index among the lease's chunks.
type Fed struct {
	Feed  *LayerFeed
	Index int
}

// FeedChunks references the chunks of store lease id named by keys, in
// order, into refs, and appends to fed where each comes from: a chunk the
// lease reserved (still being filled) with the lease's feed, made on first
// use; a chunk the lease found cached already with a nil feed. It returns
// how many leading keys it referenced; a key that is not among the lease's
// chunks, or whose cached copy is gone, ends the run. An unknown lease, or
// one of another kind, is ErrUnknownLease.
func (e *Engine) FeedChunks(id LeaseID, keys []chunk.Key, refs *Refs, fed []Fed) ([]Fed, int, error) {
	t := e.leases
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lookup(id)
	if !ok || t.slots[i].kind != leaseStore {
		return fed, 0, ErrUnknownLease
	}
	l := t.slots[i]
	if l.feed == nil {
		l.feed = newLayerFeed()
	}
	a := e.arenaOf()
	refs.e = e
	j, n := 0, 0
	for _, k := range keys {
		for j < len(l.keys) && l.keys[j] != k {
			j++
		}
		if j == len(l.keys) {
			break
		}
		if l.ids[j] != 0 {
			a.Ref(l.ids[j])
			refs.ids = append(refs.ids, l.ids[j])
			fed = append(fed, Fed{Feed: l.feed, Index: j})
		} else if refs.AcquireRAMKey(e, k) {
			fed = append(fed, Fed{})
		} else {
			break
		}
		n++
		j++
	}
	return fed, n, nil
}
