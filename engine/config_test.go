package engine_test

import (
	"strings"
	"testing"
	"time"

	"kvtier/config"
	"kvtier/engine"
	"kvtier/tier/disk"
)

func TestOptionsFromConfig(t *testing.T) {
	dir := t.TempDir()
	c, err := config.Parse([]byte("chunk_size: 16\nmax_local_cpu_size: 0.001\nlocal_disk: file://"+dir+
		"\nmax_local_disk_size: 0.01\ncache_policy: arc\nsave_unfull_chunk: true\nnamespace: tenant-a\nwrite_wait: 0\ndisk_direct_io: off\n"+
		"disk_cache_policy: s3fifo\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o, err := engine.OptionsFromConfig(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.ChunkSize != 16 || !o.SaveUnfull || o.Policy != "ARC" || o.Namespace != "tenant-a" || o.DiskDir != dir ||
		o.DiskDirectIO != disk.DirectOff || o.DiskPolicy != "S3FIFO" || o.Tier.WriteWait >= 0 {
		t.Fatalf("options = %+v", o)
	}
	gib := float64(1 << 30)
	if o.RAMBytes < int64(0.001*gib)-4096 || o.RAMBytes > int64(0.001*gib) || o.DiskBytes < int64(0.01*gib)-4096 || o.DiskBytes > int64(0.01*gib) {
		t.Fatalf("sizes: RAM %d, disk %d", o.RAMBytes, o.DiskBytes)
	}
	e, err := engine.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if tiers := e.Manager().Tiers(); len(tiers) != 2 || tiers[1].Name() != "disk" {
		t.Fatalf("tiers = %v", tiers)
	} else if p := tiers[1].(*disk.Tier).Policy(); p != "S3FIFO" {
		t.Fatalf("disk tier evicts by %s, want the configured S3FIFO", p)
	}

	for yaml, want := range map[string]string{
		"local_cpu: false\n": "local_cpu",
	} {
		c, err := config.Parse([]byte(yaml), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := engine.OptionsFromConfig(c, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %s", yaml, err, want)
		}
	}
}

func TestOptionsFromConfigRemote(t *testing.T) {
	c, err := config.Parse([]byte("remote_url: 'redis://h:6379  fs:///srv/kv'\nremote_serde: naive\nremote_timeout: 3s\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o, err := engine.OptionsFromConfig(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.RemoteURLs) != 2 || o.RemoteURLs[1] != "fs:///srv/kv" || o.RemoteCodec != "raw" || o.RemoteTimeout != 3*time.Second {
		t.Errorf("remote options %q %q %v", o.RemoteURLs, o.RemoteCodec, o.RemoteTimeout)
	}
}
