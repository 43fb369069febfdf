package config

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Tenants' quotas: ram_bytes and disk_bytes bound the bytes the chunks of
// a tenant's namespaces may hold in the RAM and disk tiers. A quota is a
// size as the other size keys take it ("512MiB", "4GB", a plain number of
// bytes); absent or 0 means none.

// decodeQuota decodes one quota key of a tenant's mapping.
func decodeQuota(t *Tenant, key string, v *yaml.Node) error {
	if v.Kind != yaml.ScalarNode {
		return fmt.Errorf("%s: want a size, got %s", key, describe(v))
	}
	n, err := ParseSize(v.Value)
	if err != nil {
		return fmt.Errorf("%s: %v", key, err)
	}
	if key == "ram_bytes" {
		t.RAMBytes = n
	} else {
		t.DiskBytes = n
	}
	return nil
}

// validateQuotas refuses a quota the tier cannot honour: larger than the
// tier (an error, not clamped: a quota that can never bind is a typo or a
// misunderstanding), negative, or on a disk tier that is not configured.
func (c Config) validateQuotas(bad func(key, format string, args ...any)) {
	for i, t := range c.Tenants {
		who := fmt.Sprintf("tenant %d (%s)", i+1, clip(t.Name))
		if t.RAMBytes < 0 || t.DiskBytes < 0 {
			bad("tenants", "%s: a quota cannot be negative", who)
		}
		if ram := c.LocalCPUBytes(); t.RAMBytes > ram {
			bad("tenants", "%s: ram_bytes %v is more than the RAM tier's %v (max_local_cpu_size)", who, t.RAMBytes, ram)
		}
		switch disk := c.LocalDiskBytes(); {
		case t.DiskBytes > 0 && c.LocalDisk == "":
			bad("tenants", "%s: disk_bytes is set but there is no disk tier (local_disk)", who)
		case t.DiskBytes > disk:
			bad("tenants", "%s: disk_bytes %v is more than the disk tier's %v (max_local_disk_size)", who, t.DiskBytes, disk)
		}
	}
}
