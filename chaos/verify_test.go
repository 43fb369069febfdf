package chaos

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"kvtier/internal/procstop"
	"kvtier/internal/servetest"
)

// TestVerifyTellsAMissedReadFromALoss checks the suite's own count of lost
// chunks against the store it reads, a real versitygw under a real
// daemon. A durable chunk whose reads miss only while the store is hung
// (as a read past the remote deadline on a loaded machine does) is
// re-read, not lost; a durable chunk whose object was deleted from the
// store is lost, and fails the fault, however long verify reads again.
func TestVerifyTellsAMissedReadFromALoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon and an S3 server")
	}
	s := startS3(t)
	_, c := remoteRig(t, s.url(fmt.Sprintf("chaos-%d", newRun()%1_000_000)))

	// Reads of targets 0 and 1 miss while the store is hung; it resumes
	// while verify reads again.
	if err := procstop.Stop(s.cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	resumed := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		resumed <- s.cmd.Process.Signal(syscall.SIGCONT)
	}()
	r := Report{Fault: "hung, then resumed"}
	out := verifyApart(t, c, []int{0, 1}, &r)
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	t.Logf("store resumed 1s after it was stopped; verify took %v", time.Since(stopped).Round(time.Millisecond))
	if out.Failed() || r.Lost != 0 || r.Verified != 2 || r.Reread == 0 || r.WrongBytes != 0 {
		t.Fatalf("targets read while the store was hung: %+v, failed %v", r, out.Failed())
	}
	t.Logf("%s", r.Summary())

	// Target 5's object is deleted behind the daemon's back: a real loss.
	removeObject(t, s.root, payload(c.run, 5))
	r = Report{Fault: "object deleted"}
	start := time.Now()
	out = verifyApart(t, c, []int{4, 5, 6}, &r)
	if !out.Failed() || r.Lost != 1 || r.Verified != 2 || r.WrongBytes != 0 {
		t.Fatalf("target 5 deleted from the store: %+v, failed %v", r, out.Failed())
	}
	if took := time.Since(start); took < reread {
		t.Errorf("the deleted chunk was counted lost after %v, before verify had read again for %v", took, reread)
	}
	t.Logf("%s", r.Summary())
}

// TestVerifyOfLocalTiersDoesNotReadAgain: for faults of the daemon's own
// tiers a durable chunk that misses is lost at once, with no re-read: a
// chunk that missed right after a restart and showed up later must fail
// the fault (was: read again for reread and passed with a note, and
// Recovery understated the gap).
func TestVerifyOfLocalTiersDoesNotReadAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a daemon")
	}
	d := servetest.Start(t, t.TempDir(), baseConf)
	c := dialUnix(t, d.Sock, newRun())
	if ok, err := c.put(0); !ok {
		t.Fatalf("store 0: %v", err)
	}
	var log bytes.Buffer
	out := newRunner(t.Name(), &log)
	r := Report{Fault: "never stored"}
	start := time.Now()
	out.run(func() { verify(out, c, []int{0, 1}, func(int) bool { return true }, &r) })
	if !out.Failed() || r.Lost != 1 || r.Verified != 1 || r.Reread != 0 {
		t.Fatalf("chunk 1, never stored, read as durable: %+v, failed %v", r, out.Failed())
	}
	if took := time.Since(start); took >= reread {
		t.Fatalf("verify of a local fault read again for %v", took)
	}
}

// verifyApart runs verify as a fault of its own, so that its failures are
// recorded there rather than failing t, and returns that fault's runner.
func verifyApart(t *testing.T, c *conn, ids []int, r *Report) *runner {
	t.Helper()
	var log bytes.Buffer
	out := newRunner(t.Name(), &log)
	out.run(func() { verifyRereading(out, c, ids, func(int) bool { return true }, r) })
	if log.Len() > 0 {
		t.Logf("verify said:\n%s", log.String())
	}
	return out
}

// removeObject deletes the one file under root (versitygw's posix
// directory) that holds chunk's bytes.
func removeObject(t *testing.T, root string, chunk []byte) {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err == nil && bytes.Contains(b, chunk[:256]) {
			found = append(found, path)
		}
		return err
	})
	if err != nil || len(found) != 1 {
		t.Fatalf("the chunk's object under %s: %v, %v", root, found, err)
	}
	if err := os.Remove(found[0]); err != nil {
		t.Fatal(err)
	}
}
