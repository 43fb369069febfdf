package scale

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	RunChildIfAsked() // the disk fill child is this test binary
	os.Exit(m.Run())
}

// TestQuick runs the small version of every part and checks what the
// figures must say whatever the machine: the clean restart read no header,
// the crash restart read exactly the records stored after the checkpoint,
// the full scan read them all, and every part produced its rows.
func TestQuick(t *testing.T) {
	o := Quick(t.TempDir())
	r, err := Run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Disk) != len(o.DiskRecords) || len(r.RAM) != len(o.RAMChunks) ||
		len(r.Router) != len(o.RouterBlocks) || len(r.Churn) == 0 {
		t.Fatalf("rows missing: %+v", r)
	}
	for _, d := range r.Disk {
		if d.CleanScanned != 0 || d.CleanFromCkpt != d.Records || d.CrashScanned != o.DiskTail {
			t.Errorf("%d records: clean stop read %d headers and took %d from the checkpoint, crash read %d (tail %d)",
				d.Records, d.CleanScanned, d.CleanFromCkpt, d.CrashScanned, o.DiskTail)
		}
		if d.CheckpointB < ckptBytesPerRecord || d.CheckpointB > ckptBytesPerRecord+1 {
			t.Errorf("checkpoint of %.1f bytes per record", d.CheckpointB)
		}
	}
	if len(r.Restart) != o.Restarts {
		t.Errorf("%d repeated restarts, want %d", len(r.Restart), o.Restarts)
	}
	for _, x := range r.Restart {
		if x.CrashRead != o.DiskTail || x.CleanRead != 0 || x.CrashPol < x.Crash || x.CleanPol < x.Clean {
			t.Errorf("repeated restart %+v: want %d log records read after the crash, none after the clean stop, the policy ready after Open", x, o.DiskTail)
		}
	}
	for _, m := range r.RAM {
		if m.HeapBytes <= 0 || m.Lookup <= 0 {
			t.Errorf("RAM row %+v", m)
		}
	}
	var out bytes.Buffer
	r.Print(&out)
	for _, want := range []string{"Disk tier restart", "repeated", "RAM tier", "under churn", "Router index"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// ckptBytesPerRecord is a record entry of the checkpoint format.
const ckptBytesPerRecord = 56

// TestSelect: --parts keeps only the parts named, and refuses others.
func TestSelect(t *testing.T) {
	o := Full("d")
	if err := o.Select("restarts,ram", []int{2000}, 3); err != nil {
		t.Fatal(err)
	}
	if !o.RestartsOnly || o.Restarts != 3 || len(o.DiskRecords) != 1 || o.DiskRecords[0] != 2000 ||
		len(o.RAMChunks) == 0 || o.ChurnChunks != nil || o.RouterBlocks != nil {
		t.Fatalf("selected %+v", o)
	}
	o = Full("d")
	if err := o.Select("disk", nil, 0); err != nil || o.RestartsOnly || o.Restarts != 0 || o.RAMChunks != nil {
		t.Fatalf("disk alone: %+v, %v", o, err)
	}
	if err := o.Select("disks", nil, 0); err == nil {
		t.Fatal("an unknown part was accepted")
	}
}
