package scale

import (
	"context"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	RunChildIfAsked()
	os.Exit(m.Run())
}

func TestDiskSmall(t *testing.T) {
	rows, err := Disk(context.Background(), t.TempDir(), []int{2000, 20000}, 1000, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		t.Logf("%+v full %.1fus clean %.1fus crash %.1fus", r, r.PerRecord(r.FullScan), r.PerRecord(r.CleanStop), r.PerRecord(r.Crash))
	}
}
