package backends_test

import (
	"os"
	"strings"
	"testing"

	_ "kvtier/tier/backends"
	"kvtier/tier/remote"
)

// TestDocsNameEveryScheme keeps the remote_url row of
// docs/configuration.md true to the scheme registry: every scheme a
// linked backend registers must be shown there as "`scheme://".
func TestDocsNameEveryScheme(t *testing.T) {
	const docs = "../../docs/configuration.md"
	data, err := os.ReadFile(docs)
	if err != nil {
		t.Fatal(err)
	}
	row := tableRow(string(data), "remote_url")
	if row == "" {
		t.Fatalf("%s has no remote_url row", docs)
	}
	names := remote.Names()
	if len(names) == 0 {
		t.Fatal("no scheme registered")
	}
	for _, scheme := range names {
		if !strings.Contains(row, "`"+scheme+"://") {
			t.Errorf("the remote_url row of %s does not show the registered scheme %s://", docs, scheme)
		}
	}
}

// tableRow returns the line of a Markdown key table that documents key.
func tableRow(doc, key string) string {
	for line := range strings.Lines(doc) {
		if strings.HasPrefix(line, "| `"+key+"` |") {
			return line
		}
	}
	return ""
}
