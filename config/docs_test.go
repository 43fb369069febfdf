package config

import (
	"os"
	"regexp"
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
