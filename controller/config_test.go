package controller

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestDecodeKeepsWhatTheFileLeavesOut(t *testing.T) {
	c := Default()
	if err := c.Decode([]byte("# only comments\n"), "c.yaml"); err != nil {
		t.Fatal(err)
	}
	for _, empty := range []string{"", "---\n", "~\n"} {
		if err := c.Decode([]byte(empty), "c.yaml"); err != nil {
			t.Fatalf("Decode(%q): %v", empty, err)
		}
	}
	if err := c.Decode([]byte("scorer: tier-weighted\nhash_seed: \"\"\n"), "c.yaml"); err != nil {
		t.Fatal(err)
	}
	want := Default()
	if c.Scorer != "tier-weighted" || c.HashSeed == nil || *c.HashSeed != "" ||
		c.Listen != want.Listen || c.BlockSize != want.BlockSize || c.MaxBlocks != want.MaxBlocks || c.LogLevel != want.LogLevel {
		t.Errorf("decoded %+v", c)
	}
}

// TestDecodeNullKeepsTheValue: a key written without a value keeps the
// value it had, as in the daemon's configuration.
func TestDecodeNullKeepsTheValue(t *testing.T) {
	c := validConfig()
	if err := c.Decode([]byte("scorer:\nhash_seed: ~\npods: null\nlisten: 127.0.0.1:1\n"), "c.yaml"); err != nil {
		t.Fatal(err)
	}
	want := validConfig()
	want.Listen = "127.0.0.1:1"
	if c.Scorer != want.Scorer || *c.HashSeed != *want.HashSeed || !slices.Equal(c.Pods, want.Pods) || c.Listen != want.Listen {
		t.Errorf("decoded %+v, want %+v", c, want)
	}
}

// TestDecodeKeepsTheSeedAsWritten: PYTHONHASHSEED is text to vLLM, so a
// seed YAML reads as a number must keep its digits as written.
func TestDecodeKeepsTheSeedAsWritten(t *testing.T) {
	for _, seed := range []string{"0", "42", "007", "4294967295"} {
		c := Default()
		if err := c.Decode([]byte("hash_seed: "+seed+"\n"), "c.yaml"); err != nil {
			t.Fatal(err)
		}
		if c.HashSeed == nil || *c.HashSeed != seed {
			t.Errorf("hash_seed: %s decoded as %v", seed, c.HashSeed)
		}
	}
}

func TestDecodeIsStrict(t *testing.T) {
	for _, doc := range []string{
		"scorer_name: coverage\n",     // unknown key
		"block_size: sixteen\n",       // wrong type
		"pods: a=m=tcp://h:1\n",       // a list is wanted
		"listen: a\n---\nlisten: b\n", // two documents
		"- listen\n",                  // not a mapping
		"listen: [\n",                 // not YAML
		"listen: a\nlisten: b\n",      // a key twice
		"3: x\n",                      // not a key
	} {
		c := Default()
		err := c.Decode([]byte(doc), "c.yaml")
		if err == nil || !strings.Contains(err.Error(), "c.yaml") {
			t.Errorf("Decode(%q) = %v, want an error naming the file", doc, err)
		}
		if c.Listen != Default().Listen {
			t.Errorf("Decode(%q) failed but changed the configuration: %+v", doc, c)
		}
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.yaml")
	if err := os.WriteFile(path, []byte("max_blocks: 99\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	if err := c.LoadFile(path); err != nil || c.MaxBlocks != 99 {
		t.Errorf("LoadFile: %v, max_blocks %d", err, c.MaxBlocks)
	}
	if err := c.LoadFile(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}

// TestValidateNamesKeyAndFlag checks each error names the key and its
// flag, and that every problem is reported at once.
func TestValidateNamesKeyAndFlag(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid configuration refused: %v", err)
	}
	c := Config{Pods: []string{"not a pod"}, Scorer: "random", LogLevel: "loud", IndexRedis: "http://x"}
	err := c.Validate()
	for _, key := range []string{"hash_seed", "pods", "block_size", "scorer", "log_level", "index_redis"} {
		if err == nil || !strings.Contains(err.Error(), key+" (--"+Flag(key)+")") {
			t.Errorf("Validate() = %v, want it to name %s and its flag", err, key)
		}
	}
	// With the index in Redis, max_blocks does not apply.
	c = validConfig()
	c.MaxBlocks, c.IndexRedis = 0, "redis://127.0.0.1:6379"
	if err := c.Validate(); err != nil {
		t.Errorf("max_blocks 0 with index_redis: %v", err)
	}
	// A pods file alone is enough.
	c = validConfig()
	c.Pods, c.PodsFile = nil, "pods.txt"
	if err := c.Validate(); err != nil {
		t.Errorf("pods_file alone: %v", err)
	}
}

func TestKeysAreTheYAMLKeys(t *testing.T) {
	var tags []string
	for f := range reflect.TypeFor[Config]().Fields() {
		tags = append(tags, f.Tag.Get("yaml"))
	}
	if !slices.Equal(tags, Keys()) {
		t.Errorf("Keys() = %v, want the yaml tags in order: %v", Keys(), tags)
	}
	c := Default()
	for _, key := range Keys() {
		doc := key + ": null\n"
		if err := c.Decode([]byte(doc), "c.yaml"); err != nil {
			t.Errorf("key %s is not a YAML key: %v", key, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("hash_seed: 0\npods: [a=m=tcp://h:1]\nscorer: coverage\n"))
	f.Add([]byte("block_size: -1\nmax_blocks: 99999999999999999999\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := Default()
		if err := c.Decode(data, "fuzz"); err == nil {
			_ = c.Validate() // must not panic, whatever the file held
		}
	})
}
