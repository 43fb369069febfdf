package config

import (
	"bytes"
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzParse feeds arbitrary bytes to the YAML loader. It must never panic,
// and whatever it accepts must marshal to a document it accepts again with
// the same meaning (compared as marshalled text, which also copes with NaN
// inside extra_config).
func FuzzParse(f *testing.F) {
	for _, p := range []string{"testdata/lmcache.yaml", "testdata/lmcache_pd.yaml"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"", "~", "- 1", "chunk_size: 1.5", "a: &x [*x]", "chunk_size: 1\nchunk_size: 2",
		"extra_config: {a: [1, {b: .nan}]}", "disk_segment_size: 1.5GiB\nwrite_wait: 1ms",
		"local_disk: file:///x\nmax_local_disk_size: .inf", "? [a]\n: 1", "<<: {chunk_size: 3}",
		"remote_url: 'redis://u:p@h:1?token=x'\nlocal_cpu_use_hugepages: on",
		"chunk_size: 1\n---\n", "extra_config: !!binary aGVsbG8=", "namespace: !!str 12",
		"p2p_init_ports: '8000, 8001'\npin_timeout_sec: 5", "blend_recompute_ratios: [.nan, 1]",
		"ec: {chunk_size: 1}\nec_enable_pd: true", "pd_allocation_timeout_sec: .inf\nenable_xpyd: no",
		"retrieve_locations: [*a]", "lmcache_worker_port: &a 1\nhidden_state_layers: [*a]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _, err := parse(data, "fuzz.yaml") // Parse without logging warnings
		if err != nil {
			return
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("accepted config does not marshal: %v", err)
		}
		again, _, err := parse(out, "marshalled.yaml")
		if err != nil {
			t.Fatalf("marshalled config is rejected: %v\ninput: %q\nmarshalled:\n%s", err, data, out)
		}
		out2, err := yaml.Marshal(again)
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the config:\n%s\n---\n%s", out, out2)
		}
		_ = c.String()
	})
}

// FuzzEnv feeds arbitrary values to the variables of every LMCache key
// (LMCACHE_, KVTIER_ and the LMCACHE_EC_ override). Loading must never
// panic, and every error must name its key.
func FuzzEnv(f *testing.F) {
	for i, v := range []string{"256", "true", "8000, x", "inf", "'\"quoted\"'", "{\"a\": [1]}", "", ",,", "1e400", "-0"} {
		f.Add(uint16(i*11), v)
	}
	f.Fuzz(func(t *testing.T, i uint16, value string) {
		name := lmcacheNameList[int(i)%len(lmcacheNameList)]
		for _, v := range []string{LMCacheEnvName(name), EnvName(name), LMCacheEnvName("ec_" + name)} {
			_, _, err := load("", []string{v + "=" + value}, 0)
			if err != nil && len(keyErrors(err)) == 0 {
				t.Fatalf("%s=%q: an error that names no key: %v", v, value, err)
			}
		}
	})
}
