package engine

import (
	"fmt"
	"log/slog"

	"kvtier/config"
	"kvtier/tier"
	"kvtier/tier/disk"
)

// OptionsFromConfig turns a loaded configuration into engine options.
// Settings that this release cannot honour are errors, never ignored.
func OptionsFromConfig(c config.Config, log *slog.Logger) (Options, error) {
	if !c.LocalCPU {
		return Options{}, fmt.Errorf("engine: local_cpu: false is not supported: the RAM tier also stages every transfer")
	}
	mode, err := directMode(c.DiskDirectIO)
	if err != nil {
		return Options{}, err
	}
	wait := c.WriteWait
	if wait == 0 {
		wait = -1 // config: 0 means never wait; tier.Options: negative does
	}
	return Options{
		ChunkSize:       c.ChunkSize,
		SaveUnfull:      c.SaveUnfullChunk,
		Namespace:       c.Namespace,
		RAMBytes:        int64(c.LocalCPUBytes()),
		Policy:          c.CachePolicy,
		HugePages:       c.Hugepages,
		Prefault:        c.Prefault,
		DiskDir:         c.LocalDisk,
		DiskBytes:       int64(c.LocalDiskBytes()),
		DiskDirectIO:    mode,
		DiskSegmentSize: int64(c.DiskSegmentSize),
		DiskPolicy:      c.DiskCachePolicy,
		RemoteURLs:      c.RemoteURLs(),
		RemoteCodec:     remoteCodec(c.RemoteSerde),
		RemoteTimeout:   c.RemoteTimeout,
		P2PPeers:        c.P2PPeers,
		P2PToken:        c.TCPToken, // a fleet shares one token: the one this daemon asks of its own TCP clients
		P2PSelf:         c.TCPAddr,
		LeaseTTL:        c.LeaseTTL,
		Quotas:          QuotaOwnersFromConfig(c),
		Tier:            tier.Options{QueueDepth: c.WriteQueueDepth, WriteWait: wait},
		Logger:          log,
	}, nil
}

// directMode parses the disk_direct_io values.
func directMode(s string) (disk.DirectMode, error) {
	switch s {
	case "", "auto":
		return disk.DirectAuto, nil
	case "on":
		return disk.DirectOn, nil
	case "off":
		return disk.DirectOff, nil
	}
	return 0, fmt.Errorf("engine: disk_direct_io %q: want auto, on or off", s)
}

// remoteCodec maps remote_serde to a codec name: LMCache's "naive" is raw.
func remoteCodec(serde string) string {
	if serde == "naive" || serde == "" {
		return "raw"
	}
	return serde
}
