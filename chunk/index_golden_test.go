package chunk

import (
	"fmt"
	"testing"
)

// TestIndexGolden pins the index keys of a prompt's chunks: the
// controller's lookup by tokens computes them in another process (often
// on another machine) than the daemons that reported them, so they must
// not depend on anything but the scope, the chunk size and the tokens.
func TestIndexGolden(t *testing.T) {
	c, err := NewChunker(goldenScope, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range c.Keys(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 4294967295}) {
		got = append(got, fmt.Sprintf("%016x", k.Index()))
	}
	want := []string{"2e710581c16fe774", "f6fb12f234dd997c"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("index keys %v, want %v: a change here orphans every chunk the cluster's index knows", got, want)
	}
	// splitmix64's finalizer of the golden scope id, worked out apart
	// from this package.
	if got, want := fmt.Sprintf("%016x", mixScope(goldenScope.ID())), "3e8175915498ff11"; got != want {
		t.Fatalf("mixed scope %s, want %s", got, want)
	}
}
