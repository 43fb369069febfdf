package deploy

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// freeForm are values whose entries are Kubernetes or kvtier structures
// documented where they are defined, not one by one in values.yaml.
var freeForm = map[string]bool{"resources": true, "podSecurityContext": true, "securityContext": true,
	"config": true, "updateStrategy": true}

// TestValuesDocumented checks every key of the chart's values.yaml has a
// comment and a row in docs/deploy.md's values table.
func TestValuesDocumented(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal(mustRead(t, chartDir+"/values.yaml"), &doc); err != nil {
		t.Fatal(err)
	}
	docs := string(mustRead(t, "../docs/deploy.md"))
	var walk func(n *yaml.Node, prefix string)
	n := 0
	walk = func(m *yaml.Node, prefix string) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			path := prefix + k.Value
			n++
			if strings.TrimSpace(k.HeadComment) == "" {
				t.Errorf("values.yaml:%d: %s has no comment", k.Line, path)
			}
			if !strings.Contains(docs, "| `"+path+"` |") {
				t.Errorf("docs/deploy.md: no row for %s", path)
			}
			if v.Kind == yaml.MappingNode && !freeForm[k.Value] {
				walk(v, path+".")
			}
		}
	}
	walk(doc.Content[0], "")
	if n < 50 {
		t.Fatalf("only %d keys in values.yaml", n)
	}
}
