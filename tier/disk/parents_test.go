package disk

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"kvtier/chunk"
	"kvtier/tier/policy"
)

// chainKey is record j of chain c in these tests.
func chainKey(c, j int) chunk.Key { return testKey(uint64(1000*(c+1) + j)) }

const (
	chains   = 4
	chainLen = 4
	chainRec = 10000 // payload bytes
)

// putChainRecord stores record j of chain c, naming record j-1 as its
// parent.
func putChainRecord(t *testing.T, d *Tier, c, j int) {
	t.Helper()
	k := chainKey(c, j)
	var err error
	if j == 0 {
		err = d.Put(context.Background(), k, testPayload(k, chainRec))
	} else {
		err = d.PutAfter(context.Background(), k, chainKey(c, j-1), testPayload(k, chainRec))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// chainPrefix checks that what d holds of chain c is a prefix and
// returns its length. It reads nothing, which would count as a use.
func chainPrefix(t *testing.T, d *Tier, c int, at string) int {
	t.Helper()
	n := 0
	for n < chainLen && d.Contains(chainKey(c, n)) {
		n++
	}
	for j := n + 1; j < chainLen; j++ {
		if d.Contains(chainKey(c, j)) {
			t.Fatalf("%s: chain %d keeps record %d after losing record %d: the tail is stranded", at, c, j, n)
		}
	}
	return n
}

// TestRestartKeepsChains stores four chains with PutAfter — the last one
// tail first, so that each record lies before its parent in the log —,
// restarts the tier (after a clean stop, from a checkpoint and the log
// written after it, and from the log alone), reads every record back and
// then each chain's last record again, so that it is the most recently
// used, and then fills the tier
// with other records. Under a prefix-aware policy eviction must take each
// chain from its tail: after a restart that brought records back as
// roots, the least recently used heads went first and stranded the
// tails.
func TestRestartKeepsChains(t *testing.T) {
	for _, mode := range []string{"clean stop", "checkpoint and log", "log only"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Capacity: 20 * recordSize(chainRec), Headroom: -1, Policy: policy.TREELRU,
				SegmentSize: 64 << 10, CheckpointRecords: 1 << 30, CheckpointInterval: -1}
			if mode == "log only" {
				opts.CheckpointRecords = -1
			}
			d := openTier(t, dir, opts)
			for c := range chains - 1 {
				for j := range chainLen {
					putChainRecord(t, d, c, j)
					if c == 1 && j == 1 && mode != "log only" {
						if err := d.Checkpoint(); err != nil { // chain 1 spans it
							t.Fatal(err)
						}
					}
				}
			}
			for j := chainLen - 1; j >= 0; j-- {
				putChainRecord(t, d, chains-1, j)
			}
			if mode == "checkpoint and log" {
				abandon(d)
			} else if err := d.Close(); err != nil {
				t.Fatal(err)
			}

			d = openTier(t, dir, opts)
			defer d.Close()
			rec := d.Recovered()
			if (mode == "log only") == rec.Checkpoint || (mode == "clean stop") != (rec.Scanned == 0) {
				t.Fatalf("%s: recovered %+v", mode, rec)
			}
			for c := range chains {
				for j := range chainLen {
					checkGet(t, d, chainKey(c, j), testPayload(chainKey(c, j), chainRec))
				}
			}
			for c := range chains {
				checkGet(t, d, chainKey(c, chainLen-1), testPayload(chainKey(c, chainLen-1), chainRec))
			}
			left := chains * chainLen
			for i := 0; left > 0; i++ {
				if i == 200 {
					t.Fatalf("%d chain records outlived 200 other records in a tier of 20", left)
				}
				k := testKey(uint64(90000 + i))
				mustPut(t, d, k, testPayload(k, chainRec))
				left = 0
				for c := range chains {
					left += chainPrefix(t, d, c, "after store "+strconv.Itoa(i))
				}
			}
		})
	}
}

// TestParentWrittenLaterIsAdopted: a record published while its parent's
// record is still being written (the manager's two writers race) becomes
// its child once the parent is published, so the parent is not a leaf.
func TestParentWrittenLaterIsAdopted(t *testing.T) {
	ctx := context.Background()
	d := openTier(t, t.TempDir(), Options{Capacity: 3 * recordSize(chainRec), Headroom: -1, Policy: policy.TREELRU})
	defer d.Close()
	up, child := chainKey(0, 0), chainKey(0, 1)
	w, err := d.OpenWrite(ctx, up, chainRec)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.PutAfter(ctx, child, up, testPayload(child, chainRec)); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx, testPayload(up, chainRec), chunk.Key{}, false); err != nil {
		t.Fatal(err)
	}
	// The child is then read, so that the parent is the least recently
	// used record: were it a leaf, it would go first and strand the
	// child; as the child's parent it is none, and the child goes.
	checkGet(t, d, child, testPayload(child, chainRec))
	other := testKey(5)
	mustPut(t, d, other, testPayload(other, chainRec))
	mustPut(t, d, testKey(6), testPayload(testKey(6), chainRec))
	if !d.Contains(up) || d.Contains(child) {
		t.Fatalf("after one eviction: parent held %v, child held %v; want the child evicted", d.Contains(up), d.Contains(child))
	}
	checkGet(t, d, up, testPayload(up, chainRec))
}

// TestParentNotYetReservedIsAdopted: a record published before its
// parent's Put has even reserved a slot (that writer still waits for
// room, or has not taken the lock yet) becomes its child once the parent
// is published, as when the parent's record was being written.
func TestParentNotYetReservedIsAdopted(t *testing.T) {
	ctx := context.Background()
	d := openTier(t, t.TempDir(), Options{Capacity: 3 * recordSize(chainRec), Headroom: -1, Policy: policy.TREELRU})
	defer d.Close()
	up, child := chainKey(0, 0), chainKey(0, 1)
	if err := d.PutAfter(ctx, child, up, testPayload(child, chainRec)); err != nil {
		t.Fatal(err)
	}
	mustPut(t, d, up, testPayload(up, chainRec))
	checkGet(t, d, child, testPayload(child, chainRec))
	mustPut(t, d, testKey(5), testPayload(testKey(5), chainRec))
	mustPut(t, d, testKey(6), testPayload(testKey(6), chainRec))
	if !d.Contains(up) || d.Contains(child) {
		t.Fatalf("parent held %v, child held %v; want the child evicted", d.Contains(up), d.Contains(child))
	}
}

// TestWaitingChildrenAreBounded: children whose parent never comes are
// forgotten past maxWaitUp, oldest first, and the rest are still linked
// when their parent comes.
func TestWaitingChildrenAreBounded(t *testing.T) {
	var w waitUps
	up := func(i int) chunk.Key { return testKey(uint64(1_000_000 + i)) }
	for i := range maxWaitUp + 10 {
		w.note(testKey(uint64(i)), up(i))
	}
	if len(w.kids) != maxWaitUp || len(w.ring) != maxWaitUp {
		t.Fatalf("%d parents, %d notes held; want %d", len(w.kids), len(w.ring), maxWaitUp)
	}
	for i := range 10 {
		if k := w.take(up(i)); k != nil {
			t.Fatalf("wait %d kept past the bound", i)
		}
	}
	if k := w.take(up(maxWaitUp + 9)); len(k) != 1 || k[0].key != testKey(maxWaitUp+9) {
		t.Fatalf("newest wait: %v", k)
	}
	// Two children of one parent, the older forgotten by the bound, the
	// newer kept.
	w = waitUps{}
	w.note(testKey(1), up(0))
	for i := 1; i < maxWaitUp; i++ {
		w.note(testKey(uint64(100+i)), up(i))
	}
	w.note(testKey(2), up(0))
	if k := w.take(up(0)); len(k) != 1 || k[0].key != testKey(2) {
		t.Fatalf("parent 0's waits after the bound: %v", k)
	}
}

// TestLateRecordsLinkedBeforePolicyReady: the records a checkpoint
// restores before their parents are linked on the policy goroutine,
// before it reports the policy ready, not by the first operation that
// takes the tier's lock afterwards (pol), which would stall every read
// behind a walk up each chain.
func TestLateRecordsLinkedBeforePolicyReady(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Capacity: 20 * recordSize(chainRec), Headroom: -1, Policy: policy.TREELRU,
		SegmentSize: 64 << 10, CheckpointRecords: 1 << 30, CheckpointInterval: -1}
	d := openTier(t, dir, opts)
	for c := range 2 {
		for j := chainLen - 1; j >= 0; j-- { // tail first: every record before its parent
			putChainRecord(t, d, c, j)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = openTier(t, dir, opts)
	defer d.Close()
	if !d.Recovered().Checkpoint {
		t.Fatal("the checkpoint was not used")
	}
	d.mu.Lock()
	w := d.idx.warm
	d.mu.Unlock()
	if w == nil {
		t.Fatal("no policy goroutine ran")
	}
	<-w.done // without pol: what is left for the tier's lock
	if len(w.late) != 0 {
		t.Fatalf("%d restored records left to link under the tier's lock", len(w.late))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.idx.pol()
	if p.Len() != 2*chainLen { // Adopt also fails for a key the policy lost
		t.Fatalf("policy holds %d keys, want %d", p.Len(), 2*chainLen)
	}
	ad := p.(policy.Adopter[chunk.Key])
	for c := range 2 {
		for j := 1; j < chainLen; j++ { // linked: adopting again fails
			if ad.Adopt(chainKey(c, j), chainKey(c, j-1)) {
				t.Fatalf("record %d of chain %d was a root", j, c)
			}
		}
	}
}

// TestKeyFoundTwiceKeepsItsChildren: a chain's head found twice in the
// log (a crash cut short the punch of its older copy) keeps the later
// copy and its place in the policy, so its child stays its child; before,
// the key left the policy and came back as a root, and its children
// became roots. From the log alone and from a checkpoint listing the
// older copy.
func TestKeyFoundTwiceKeepsItsChildren(t *testing.T) {
	for _, mode := range []string{"log only", "checkpoint and log"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Capacity: 20 * recordSize(chainRec), Headroom: -1, Policy: policy.TREELRU,
				SegmentSize: 64 << 10, CheckpointRecords: 1 << 30, CheckpointInterval: -1}
			if mode == "log only" {
				opts.CheckpointRecords = -1
			}
			d := openTier(t, dir, opts)
			for j := range chainLen {
				putChainRecord(t, d, 0, j)
			}
			head := chainKey(0, 0)
			path, off := location(t, d, head)
			n := recordSize(chainRec)
			saved := make([]byte, n)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.ReadAt(saved, off); err != nil {
				t.Fatal(err)
			}
			if mode != "log only" {
				if err := d.Checkpoint(); err != nil { // lists the older copy
					t.Fatal(err)
				}
			}
			d.Remove(head)
			newer := testPayload(testKey(999), chainRec) // not the older copy's bytes
			mustPut(t, d, head, newer)                   // the later copy
			abandon(d)
			if _, err := f.WriteAt(saved, off); err != nil { // the punch "never happened"
				t.Fatal(err)
			}

			d = openTier(t, dir, opts)
			defer d.Close()
			if rec := d.Recovered(); (mode == "log only") == rec.Checkpoint {
				t.Fatalf("recovered %+v", rec)
			}
			checkGet(t, d, head, newer)
			for j := 1; j < chainLen; j++ {
				checkGet(t, d, chainKey(0, j), testPayload(chainKey(0, j), chainRec))
			}
			if st := d.Stats(); st.Objects != chainLen || st.Used != chainLen*n {
				t.Fatalf("stats %+v: want %d records of %d bytes", st, chainLen, n)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			p := d.idx.pol()
			if p.Len() != chainLen { // Adopt also fails for a key the policy lost
				t.Fatalf("policy holds %d keys, want %d", p.Len(), chainLen)
			}
			ad := p.(policy.Adopter[chunk.Key])
			for j := 1; j < chainLen; j++ {
				if ad.Adopt(chainKey(0, j), chainKey(0, j-1)) { // linked: adopting again fails
					t.Fatalf("record %d of the chain was a root", j)
				}
			}
		})
	}
}

// checkpointV1 rewrites a checkpoint as the version 1 writer wrote it:
// 40-byte record entries, no parents.
func checkpointV1(t testing.TB, cp []byte) []byte {
	t.Helper()
	c, err := decodeCheckpoint(cp)
	if err != nil {
		t.Fatal(err)
	}
	head := ckptHeaderLen + len(c.segs)*ckptSegLen
	out := slices.Clone(cp[:head])
	binary.LittleEndian.PutUint16(out[4:], 1)
	for i := range c.count() {
		e := c.recs[i*c.recLen : i*c.recLen+ckptRecLenV1]
		out = append(out, e...)
		size := binary.LittleEndian.Uint64(out[len(out)-8:])
		binary.LittleEndian.PutUint64(out[len(out)-8:], size&^ckptHasUp)
	}
	return resum(append(out, make([]byte, ckptTrailerLen)...))
}

// TestVersion1CheckpointOpens: a directory as the build before parents
// left it — records without parents (version 2 headers) and a version 1
// checkpoint — opens from that checkpoint, reads back every record, and
// the records come back as roots in log order, as they did. The same
// checkpoint listing records that do name parents (version 3 headers)
// brings them back as roots too: the checkpoint is what is read.
func TestVersion1CheckpointOpens(t *testing.T) {
	for _, withParents := range []bool{false, true} {
		dir := t.TempDir()
		opts := Options{Capacity: 64 << 20, SegmentSize: 64 << 10, Policy: policy.TREELRU, CheckpointInterval: -1}
		d := openTier(t, dir, opts)
		var keys []chunk.Key
		for c := range 3 {
			for j := range chainLen {
				k := chainKey(c, j)
				if withParents {
					putChainRecord(t, d, c, j)
				} else {
					mustPut(t, d, k, testPayload(k, chainRec))
				}
				keys = append(keys, k)
			}
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, checkpointName)
		cp, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, path, checkpointV1(t, cp))
		d = openTier(t, dir, opts)
		if rec := d.Recovered(); !rec.Checkpoint || rec.FromCheckpoint != len(keys) || rec.Scanned != 0 {
			t.Fatalf("parents %v: a version 1 checkpoint was not used: %+v", withParents, rec)
		}
		for _, k := range keys {
			checkGet(t, d, k, testPayload(k, chainRec))
		}
		got := stateOf(d)
		abandon(d)
		if !slices.Equal(got.order, keys) {
			t.Fatalf("parents %v: eviction order %v, want the log order of roots %v", withParents, got.order, keys)
		}
	}
}

// TestLogParentsLinkedWhenPolicyReadyEarly: after a crash, the policy
// goroutine may be done before Open indexes the records written after the
// checkpoint, and the first of those then applies what the goroutine
// could not link. A checkpointed record whose parent lies in that log, and
// a record of that log found before its parent, are still linked once
// Open returns: before, they were tried at the first record of the log,
// before their parents were admitted, and left roots.
func TestLogParentsLinkedWhenPolicyReadyEarly(t *testing.T) {
	beforeLogTail = func(x *index) { <-x.warm.done }
	defer func() { beforeLogTail = nil }()
	for _, name := range []string{"checkpointed child", "log child"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Capacity: 40 * recordSize(chainRec), Headroom: -1, Policy: policy.TREELRU,
				SegmentSize: 1 << 20, CheckpointRecords: 1 << 30, CheckpointInterval: -1}
			d := openTier(t, dir, opts)
			k0 := testKey(70000)
			mustPut(t, d, k0, testPayload(k0, chainRec))
			up, child := chainKey(0, 0), chainKey(0, 1)
			putChild := func() {
				if err := d.PutAfter(context.Background(), child, up, testPayload(child, chainRec)); err != nil {
					t.Fatal(err)
				}
			}
			if name == "checkpointed child" {
				putChild()
			}
			if err := d.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			if name == "log child" {
				putChild()
			}
			for i := range 3 { // log records indexed before the parent
				k := testKey(uint64(50000 + i))
				mustPut(t, d, k, testPayload(k, chainRec))
			}
			mustPut(t, d, up, testPayload(up, chainRec))
			abandon(d)

			d = openTier(t, dir, opts)
			defer d.Close()
			if rec := d.Recovered(); !rec.Checkpoint || rec.Scanned == 0 {
				t.Fatalf("recovered %+v: want a checkpoint and a log past it", rec)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.idx.warm != nil {
				t.Fatal("the policy goroutine was not done before the log was indexed")
			}
			p := d.idx.pol()
			if p.Len() != 6 {
				t.Fatalf("policy holds %d keys, want 6", p.Len())
			}
			if p.(policy.Adopter[chunk.Key]).Adopt(child, up) { // linked: adopting again fails
				t.Fatal("the child was left a root")
			}
		})
	}
}
