package controller

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"kvtier/router/index"
)

// TestDocsListEveryKeyAndScorer keeps docs/router.md true: its table of
// keys has one row per key, in order, with the key's flag and default, and
// its table of scorers one row per registered scorer.
func TestDocsListEveryKeyAndScorer(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "router.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| `--([a-z-]+)` \\| ([^|]+) \\|")
	var keys []string
	defaults := documentedDefaults()
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		key, flag, def := m[1], m[2], strings.TrimSpace(m[3])
		keys = append(keys, key)
		if flag != Flag(key) {
			t.Errorf("%s: documented flag --%s, want --%s", key, flag, Flag(key))
		}
		if want := defaults[key]; !strings.HasPrefix(def, want) {
			t.Errorf("%s: documented default %q, want %q", key, def, want)
		}
	}
	if fmt.Sprint(keys) != fmt.Sprint(Keys()) {
		t.Errorf("documented keys %v, want %v", keys, Keys())
	}
	for _, name := range index.ScorerNames() {
		if !strings.Contains(doc, "\n| `"+name+"`") {
			t.Errorf("scorer %s has no row in docs/router.md", name)
		}
	}
}

// documentedDefaults is each key's default as the docs write it: "none"
// for a zero value, else the value in backquotes.
func documentedDefaults() map[string]string {
	out := map[string]string{}
	v := reflect.ValueOf(Default())
	for i, key := range Keys() {
		f := v.Field(i)
		if f.IsZero() {
			out[key] = "none"
		} else {
			out[key] = fmt.Sprintf("`%v`", f.Interface())
		}
	}
	return out
}
