package engine

import (
	"errors"
	"fmt"
	"log/slog"

	"kvtier/arena"
	"kvtier/tier"
	"kvtier/tier/disk"
	"kvtier/tier/mem"
)

// Options describe a whole local hierarchy: the RAM tier's arena and
// policy, an optional disk tier, and the manager's queueing.
type Options struct {
	ChunkSize  int    // tokens per chunk
	SaveUnfull bool   // keep a trailing partial chunk
	Namespace  string // namespace of requests that name none

	RAMBytes  int64  // arena capacity
	Policy    string // eviction policy of the RAM tier
	HugePages bool
	Prefault  bool

	DiskDir         string // empty disables the disk tier
	DiskBytes       int64
	DiskDirectIO    disk.DirectMode
	DiskSegmentSize int64
	DiskSync        disk.SyncMode

	Tier   tier.Options
	Logger *slog.Logger
}

// Open builds the arena, the RAM tier, the disk tier if configured, and
// the manager, and returns an engine over them. Close releases all of it.
func Open(o Options) (*Engine, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RAMBytes <= 0 {
		return nil, fmt.Errorf("engine: RAM capacity %d must be positive", o.RAMBytes)
	}
	a, err := arena.New(arena.Options{Capacity: o.RAMBytes, Name: "kvtier", HugePages: o.HugePages, Prefault: o.Prefault})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	ram, err := mem.New(a, o.Policy)
	if err != nil {
		a.Close()
		return nil, err
	}
	var lower []tier.Tier
	if o.DiskDir != "" {
		d, err := disk.Open(o.DiskDir, disk.Options{Capacity: o.DiskBytes, DirectIO: o.DiskDirectIO,
			SegmentSize: o.DiskSegmentSize, Sync: o.DiskSync, Logger: o.Logger})
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("engine: %w", err)
		}
		lower = append(lower, d)
	}
	o.Tier.Logger = o.Logger
	mgr, err := tier.NewManager(ram, lower, o.Tier)
	if err != nil {
		for _, t := range lower {
			t.Close()
		}
		a.Close()
		return nil, err
	}
	e, err := New(mgr, o.ChunkSize, o.SaveUnfull, o.Logger)
	if err == nil {
		e.namespace = o.Namespace
	}
	if err != nil {
		mgr.Close()
		a.Close()
		return nil, err
	}
	e.arena = a
	return e, nil
}

// closeAll closes the manager and, when the engine opened it, the arena.
func (e *Engine) closeAll() error {
	err := e.mgr.Close()
	if e.arena != nil {
		err = errors.Join(err, e.arena.Close())
	}
	return err
}
