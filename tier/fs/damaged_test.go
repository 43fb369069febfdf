package fs

import (
	"context"
	"os"
	"testing"

	"kvtier/tier/remote"
)

// TestRemoveDamagedSparesAnotherFile: RemoveDamaged removes a file only
// if it holds the damaged bytes and is still the file it compared. A file
// with other bytes stays; so does one published under the name between
// the comparison and the unlink (another reader removed the damaged file,
// a writer stored the chunk again, with the same bytes here), and the
// counts stay right.
func TestRemoveDamagedSparesAnotherFile(t *testing.T) {
	tr := newTier(t, Config{})
	ctx := context.Background()
	k, data := key(3), randomBytes(10_000, 3)
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	other := append([]byte(nil), data...)
	other[5000] ^= 1
	for name, d := range map[string]remote.Damage{
		"other bytes":  {Size: len(data), Head: other},
		"other length": {Size: len(data) - 1, Head: data[:64]},
		"other part":   {Size: -1, Head: data[:64], Off: 4990, Part: other[4990:5010]},
		"past the end": {Size: -1, Head: data[:64], Off: 9990, Part: data[:20]},
	} {
		if r := tr.RemoveDamaged(k, d); r != remote.DamageGone {
			t.Fatalf("%s: %v, want DamageGone (replaced)", name, r)
		}
	}

	tr.beforeUnlinkDamaged = func() {
		tr.beforeUnlinkDamaged = nil
		if !tr.Remove(k) {
			t.Error("the other reader's removal failed")
		}
		if err := tr.Put(ctx, k, data); err != nil {
			t.Error(err)
		}
	}
	if r := tr.RemoveDamaged(k, remote.Damage{Size: len(data), Head: data}); r != remote.DamageGone {
		t.Fatalf("the file published after the comparison: %v, want DamageGone", r)
	}
	if _, err := os.Stat(tr.path(k)); err != nil {
		t.Fatalf("the new file: %v", err)
	}
	if st := tr.Stats(); st.Objects != 1 || st.Used != int64(len(data)) {
		t.Fatalf("counts: %+v", st)
	}
	if r := tr.RemoveDamaged(k, remote.Damage{Size: -1, Head: data[:64], Off: 4990, Part: data[4990:5010]}); r != remote.DamageRemoved {
		t.Fatalf("the matching file: %v, want DamageRemoved", r)
	}
	if r := tr.RemoveDamaged(k, remote.Damage{Size: len(data), Head: data}); r != remote.DamageGone {
		t.Fatalf("a missing file: %v, want DamageGone", r)
	}
	if st := tr.Stats(); st.Objects != 0 || st.Used != 0 {
		t.Fatalf("counts after the removal: %+v", st)
	}
}

// TestRemoveDamagedComparesInBlocks: a condition longer than the block
// holds reads at a time is compared block by block, to its last byte.
func TestRemoveDamagedComparesInBlocks(t *testing.T) {
	tr := newTier(t, Config{})
	ctx := context.Background()
	k, data := key(4), randomBytes(3*compareBlock+100, 4)
	if err := tr.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	other := append([]byte(nil), data...)
	other[len(other)-1] ^= 1
	if r := tr.RemoveDamaged(k, remote.Damage{Size: -1, Head: other}); r != remote.DamageGone {
		t.Fatalf("bytes that differ in the last block: %v, want DamageGone", r)
	}
	if r := tr.RemoveDamaged(k, remote.Damage{Size: len(data), Head: data[:100], Off: 100, Part: data[100:]}); r != remote.DamageRemoved {
		t.Fatalf("the matching file: %v, want DamageRemoved", r)
	}
}
