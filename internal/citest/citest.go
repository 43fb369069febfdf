// Package citest decides what a test does when something it needs from
// outside the repository is missing: a server binary, Python with a
// module, the traces in ../shared. On a developer's machine the test skips,
// saying so; under CI (CI=true) it fails, because .ci/run installs every
// such input by contract, and a suite that passes by skipping proves
// nothing.
package citest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// On reports whether the tests run under CI: CI is set to a true value
// ("true", "1"; anything but "", "0" or "false").
func On() bool {
	v := os.Getenv("CI")
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	return err != nil || b
}

// Missing stops the test because an input is unavailable: it fails under
// CI and skips elsewhere. The message says which, so a skip is never
// mistaken for a pass that CI would give.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if On() {
		t.Fatalf("%s (required under CI=true)", msg)
	}
	t.Skipf("%s (skipped outside CI only; under CI=true this fails)", msg)
}

// Shared returns the path of a file under ../shared, the directory that
// sits beside the checkout (see README), calling Missing if it is absent.
func Shared(t testing.TB, elem ...string) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(append([]string{root, "..", "shared"}, elem...)...)
	if _, err := os.Stat(path); err != nil {
		Missing(t, "%s: ../shared must sit beside the checkout: %v", filepath.Join(elem...), err)
	}
	return path
}

// moduleRoot finds the directory holding go.mod, from the working
// directory up: go test runs each package in its own directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
	}
}
