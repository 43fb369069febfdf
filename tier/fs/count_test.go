package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
)

// TestPutCountsAnObjectOnce: two Puts of one key, as a Put the breaker
// abandoned at its deadline and the retry of the same chunk, both pass the
// check that the file is not there and both write a temporary file; then
// they publish, in either order. The object is stored once, whole, and
// counted once (Puts, Objects, Used), and removing it brings the counts
// back to zero.
func TestPutCountsAnObjectOnce(t *testing.T) {
	for _, retryFirst := range []bool{false, true} {
		tr := newTier(t, Config{})
		k, data := key(5), object(3)
		ctx := context.Background()
		var retryErr error
		inRetry, release, retried := make(chan struct{}), make(chan struct{}), make(chan struct{})
		calls := 0
		tr.beforePublish = func() {
			calls++
			switch {
			case calls == 1 && retryFirst: // the retry runs whole, then the first publishes
				retryErr = tr.Put(ctx, k, data)
			case calls == 1: // the retry waits at its own publish until the first is done
				go func() {
					retryErr = tr.Put(ctx, k, data)
					close(retried)
				}()
				<-inRetry
			case !retryFirst:
				close(inRetry)
				<-release
			}
		}
		if err := tr.Put(ctx, k, data); err != nil {
			t.Fatal(err)
		}
		if !retryFirst {
			close(release)
			<-retried
		}
		if retryErr != nil {
			t.Fatal(retryErr)
		}
		if calls != 2 {
			t.Fatalf("retry first %v: %d writers reached the publish, want 2", retryFirst, calls)
		}
		s := tr.Stats()
		if s.Puts != 1 || s.Objects != 1 || s.Used != int64(len(data)) || s.BytesWritten != uint64(len(data)) {
			t.Fatalf("retry first %v: puts %d, objects %d, used %d, written %d; want 1, 1, %d, %d",
				retryFirst, s.Puts, s.Objects, s.Used, s.BytesWritten, len(data), len(data))
		}
		dst := make([]byte, len(data))
		if n, err := tr.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:n], data) {
			t.Fatalf("retry first %v: read back %d bytes, %v", retryFirst, n, err)
		}
		assertNoTemps(t, tr.cfg.Root)
		if !tr.Remove(k) {
			t.Fatal("Remove found nothing")
		}
		if s := tr.Stats(); s.Objects != 0 || s.Used != 0 {
			t.Fatalf("retry first %v: after Remove objects %d, used %d", retryFirst, s.Objects, s.Used)
		}
	}
}

// TestPutCountsAnObjectWhoseDirSyncFailed: a Put whose link published the
// file but whose directory sync failed returns the error and counts the
// object all the same, since it is there: the retry stops at its Stat
// and would never count it (was: counted nowhere until the next sweep).
func TestPutCountsAnObjectWhoseDirSyncFailed(t *testing.T) {
	tr := newTier(t, Config{})
	k, data := key(6), object(2)
	ctx := context.Background()
	failed := false
	tr.dirSync = func(dir string) error {
		if !failed {
			failed = true
			return syscall.EIO
		}
		return syncDir(dir)
	}
	if err := tr.Put(ctx, k, data); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Put with a failing directory sync: %v", err)
	}
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if s := tr.Stats(); s.Puts != 1 || s.Objects != 1 || s.Used != int64(len(data)) {
		t.Fatalf("puts %d, objects %d, used %d; want 1, 1, %d", s.Puts, s.Objects, s.Used, len(data))
	}
	assertNoTemps(t, tr.cfg.Root)
}

// TestPutCountsItsOwnLinkOnEEXIST: over NFSv3 a LINK retransmitted after
// its reply was lost finds the link its first transmission made and
// answers EEXIST. The file is the writer's own, so the writer counts it
// (was: taken for another writer's, counted nowhere).
func TestPutCountsItsOwnLinkOnEEXIST(t *testing.T) {
	tr := newTier(t, Config{})
	k, data := key(7), object(4)
	tr.link = func(oldname, newname string) error {
		if err := os.Link(oldname, newname); err != nil {
			return err
		}
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: syscall.EEXIST}
	}
	if err := tr.Put(context.Background(), k, data); err != nil {
		t.Fatal(err)
	}
	if s := tr.Stats(); s.Puts != 1 || s.Objects != 1 || s.Used != int64(len(data)) {
		t.Fatalf("puts %d, objects %d, used %d; want 1, 1, %d", s.Puts, s.Objects, s.Used, len(data))
	}
	assertNoTemps(t, tr.cfg.Root)

	// Another writer's file under the name is not ours: not counted.
	tr2 := newTier(t, Config{Root: tr.cfg.Root})
	tr2.link = func(oldname, newname string) error {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: syscall.EEXIST}
	}
	if created, err := tr2.writeAtomic(tr2.path(k), data); err != nil || created {
		t.Fatalf("publish over another writer's file: created %v, %v", created, err)
	}
	assertNoTemps(t, tr.cfg.Root)
}
