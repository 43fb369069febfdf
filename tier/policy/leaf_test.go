package policy

import "testing"

// checkLeaves checks the tree's leaf array against its nodes: every entry
// is a live node without children that points back at it, with an exact
// copy of what the rank reads, and every live node without children has
// an entry.
func checkLeaves(t *testing.T, p Prefixed[int]) {
	t.Helper()
	tr := p.(*tree[int])
	for pos, l := range tr.leaves {
		nd := &tr.nodes[l.node]
		switch {
		case !nd.live || nd.child != none:
			t.Fatalf("%s: leaf entry %d is node %d, live %v, child %d", tr.name, pos, l.node, nd.live, nd.child)
		case nd.leaf != int32(pos):
			t.Fatalf("%s: leaf entry %d is node %d, which points at entry %d", tr.name, pos, l.node, nd.leaf)
		case l.last != nd.last || l.hits != nd.hits || l.hadChild != nd.hadChild || l.depth != nd.depth:
			t.Fatalf("%s: leaf entry %d holds %+v, node %d has last %d hits %d hadChild %v",
				tr.name, pos, l, l.node, nd.last, nd.hits, nd.hadChild)
		}
	}
	leaves, protected := 0, 0
	for i := range tr.nodes {
		if tr.nodes[i].live && tr.nodes[i].child == none {
			leaves++
		}
		if tr.nodes[i].live && tr.nodes[i].hits >= protectAt {
			protected++
		}
	}
	if protected != tr.protected {
		t.Fatalf("%s: %d live nodes with %d hits or more, the count says %d", tr.name, protected, protectAt, tr.protected)
	}
	if leaves != len(tr.leaves) {
		t.Fatalf("%s: %d childless live nodes, %d leaf entries", tr.name, leaves, len(tr.leaves))
	}
}

// lowestIdleLeaf is what Evict must choose while the tree has no more
// leaves than it samples: the idle leaf of lowest rank, the first in the
// leaf array on a tie. ok is false when the choice is not determined that
// way (more leaves, or every leaf busy).
func lowestIdleLeaf(p Prefixed[int], busy func(int) bool) (int, bool) {
	tr := p.(*tree[int])
	if len(tr.leaves) > treeSamples {
		return 0, false
	}
	best := none
	var bestRank float64
	for j := range tr.leaves {
		l := &tr.leaves[j]
		if r := tr.rank(l); !busy(tr.keys[l.node]) && (best == none || r < bestRank) {
			best, bestRank = l.node, r
		}
	}
	if best == none {
		return 0, false
	}
	return tr.keys[best], true
}
