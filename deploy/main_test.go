package deploy

import (
	"os"
	"testing"

	"kvtier/internal/servetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servetest.Cleanup()
	os.Exit(code)
}
