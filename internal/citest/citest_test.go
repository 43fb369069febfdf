package citest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOn(t *testing.T) {
	for v, want := range map[string]bool{"": false, "false": false, "0": false, "true": true, "1": true, "yes": true} {
		t.Setenv("CI", v)
		if got := On(); got != want {
			t.Errorf("CI=%q: On() = %v, want %v", v, got, want)
		}
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "citest", "citest.go")); err != nil {
		t.Fatalf("module root %s does not hold this package: %v", root, err)
	}
}
