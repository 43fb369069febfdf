package config

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const docsPath = "../docs/configuration.md"

// TestDocsCoverEveryKey keeps docs/configuration.md true: every key, its
// variable and every recognised LMCache key must appear in it.
func TestDocsCoverEveryKey(t *testing.T) {
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	for _, k := range Keys() {
		if !strings.Contains(doc, "| `"+k+"` |") || !strings.Contains(doc, "`"+EnvName(k)+"`") {
			t.Errorf("%s or %s is missing from the key tables of %s", k, EnvName(k), docsPath)
		}
	}
	for k := range synonyms {
		if !strings.Contains(doc, "| `"+k+"` |") {
			t.Errorf("synonym %s is not documented", k)
		}
	}
}

// TestDocsListEveryPolicy keeps the documented values of the policy keys
// equal to what package policy builds: the enum of cache_policy and of
// disk_cache_policy is policy.Names(), in its order.
func TestDocsListEveryPolicy(t *testing.T) {
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(cachePolicies))
	for i, name := range cachePolicies {
		quoted[i] = "`" + name + "`"
	}
	want := "| enum: " + strings.Join(quoted, ", ") + " |"
	for _, key := range []string{"cache_policy", "disk_cache_policy"} {
		found := false
		for line := range strings.Lines(string(data)) {
			if rest, ok := strings.CutPrefix(line, "| `"+key+"` "); ok && strings.HasPrefix(rest, "| enum:") {
				found = true
				if !strings.HasPrefix(rest, want) {
					t.Errorf("%s lists the %s values as %q; the registered policies are %s", docsPath, key, rest, want)
				}
			}
		}
		if !found {
			t.Errorf("%s has no enum row for %s", docsPath, key)
		}
	}
}

// TestDocsExamplesLoad parses every YAML example in the documentation.
func TestDocsExamplesLoad(t *testing.T) {
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(data), -1)
	if len(blocks) == 0 {
		t.Fatal("no yaml example in the documentation")
	}
	for _, b := range blocks {
		c, err := Parse([]byte(b[1]), docsPath)
		if err != nil {
			t.Errorf("documented example does not load: %v\n%s", err, b[1])
			continue
		}
		if c.LocalDisk != "/mnt/nvme/kvtier" || c.DiskSegmentSize != GiB || c.CachePolicy != "S3FIFO" {
			t.Errorf("example loaded differently than it reads: %+v", c)
		}
	}
}

var updateDocs = flag.Bool("update", false, "rewrite the generated LMCache table in "+docsPath)

// The LMCache table in the documentation sits between these lines.
const (
	lmcacheTableBegin = "<!-- BEGIN LMCache keys: generated from config/lmcache.go; after changing that table run go test ./config -run TestDocsLMCacheTable -update -->\n"
	lmcacheTableEnd   = "<!-- END LMCache keys -->\n"
)

// TestDocsLMCacheTable keeps the documented LMCache table equal to the one
// the loader uses. With -update it rewrites the documentation instead.
func TestDocsLMCacheTable(t *testing.T) {
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	before, rest, ok1 := strings.Cut(doc, lmcacheTableBegin)
	current, after, ok2 := strings.Cut(rest, lmcacheTableEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s has no generated LMCache table (want the lines %q and %q)", docsPath, lmcacheTableBegin, lmcacheTableEnd)
	}
	want := renderLMCacheTable()
	if current == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(docsPath, []byte(before+lmcacheTableBegin+want+lmcacheTableEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the LMCache table in %s is out of date: run go test ./config -run TestDocsLMCacheTable -update", docsPath)
}

// renderLMCacheTable writes the LMCache tables as Markdown.
func renderLMCacheTable() string {
	var b strings.Builder
	b.WriteString("| LMCache key | LMCache default | Environment | In kvtier |\n|---|---|---|---|\n")
	for _, k := range lmcacheKeys {
		fmt.Fprintf(&b, "| `%s` | `%s` | `%s` | %s |\n", k.Name, k.showDefault(), LMCacheEnvName(k.Name), docDisposition(k))
	}
	b.WriteString("\nOlder names, read as the key they stand for (LMCache's `_CONFIG_ALIASES`), and names LMCache only warns about:\n\n")
	b.WriteString("| Older name | Environment | In kvtier |\n|---|---|---|\n")
	aliases := slices.Sorted(maps.Keys(lmcacheAliases))
	for _, old := range aliases {
		fmt.Fprintf(&b, "| `%s` | `%s` | the same as `%s` |\n", old, LMCacheEnvName(old), lmcacheAliases[old])
	}
	for _, k := range lmcacheRetired {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", k.Name, LMCacheEnvName(k.Name), docDisposition(k))
	}
	return b.String()
}

func docDisposition(k lmcacheKey) string {
	var s string
	switch k.Disposition {
	case implemented:
		s = "implemented"
	case mapped:
		s = "sets `" + k.Target + "`"
	case ignored:
		s = "ignored: " + k.Reason
	case refused:
		s = "**refused**: not supported yet (" + k.Reason + ")"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

// TestDocsListEveryEncoding: the remote_serde row names exactly the
// encodings the codec package registers (plus LMCache's "naive"), in order.
func TestDocsListEveryEncoding(t *testing.T) {
	data, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(remoteSerdes))
	for i, name := range remoteSerdes {
		quoted[i] = "`" + name + "`"
	}
	want := "| `remote_serde` | enum: " + strings.Join(quoted, ", ") + " |"
	if !strings.Contains(string(data), want) {
		t.Errorf("%s has no row starting %q: the remote_serde values drifted from codec.Names", docsPath, want)
	}
}
