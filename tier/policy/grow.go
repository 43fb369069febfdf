package policy

import "slices"

// Grow implements Grower for every policy New returns.

func (r *recency[K]) Grow(n int) { r.pool.grow(n) }
func (l *lfu[K]) Grow(n int)     { l.pool.grow(n) }
func (s *s3fifo[K]) Grow(n int)  { s.pool.grow(n) }
func (a *arc[K]) Grow(n int)     { a.pool.grow(n) }

func (t *tree[K]) Grow(n int) {
	if len(t.index) == 0 {
		t.index = make(map[K]int32, n)
	}
	t.keys = slices.Grow(t.keys, n)
	t.nodes = slices.Grow(t.nodes, n)
	t.leaves = slices.Grow(t.leaves, n)
}
