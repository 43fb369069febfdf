package policy

// s3fifo is S3-FIFO (Yang et al., SOSP 2023): three FIFO queues and a
// two-bit frequency per key.
//
//   - New keys enter the small queue S, which holds about 10% of the keys.
//     Most keys are never hit again ("one-hit wonders") and leave from S
//     quickly, without pushing anything out of the main queue.
//   - When S is at or above its share, Evict looks at the oldest key of S: a
//     key hit while in S moves to the main queue M with its frequency
//     cleared; a key never hit is evicted and remembered in the ghost queue G.
//   - Otherwise Evict takes from M, which is FIFO with reinsertion: an old key
//     with frequency > 0 goes back to the front of M with its frequency
//     decremented; the first key found with frequency 0 is the victim.
//   - A key admitted while remembered in G was evicted too early: it goes
//     straight to M.
//
// G holds keys only (no data), at most as many as M's share of the cache.
// Since policies are count-based the shares come from the current Len().
type s3fifo[K comparable] struct {
	pool               pool[K] // slot.count is the frequency, 0..s3MaxFreq
	small, main, ghost queue
}

const (
	s3Small uint8 = iota
	s3Main
	s3Ghost
)

// s3MaxFreq caps the frequency counter: two bits.
const s3MaxFreq = 3

func newS3FIFO[K comparable]() *s3fifo[K] {
	s := &s3fifo[K]{pool: newPool[K]()}
	s.small = s.pool.newQueue()
	s.main = s.pool.newQueue()
	s.ghost = s.pool.newQueue()
	return s
}

func (s *s3fifo[K]) Name() string { return S3FIFO }
func (s *s3fifo[K]) Len() int     { return s.small.len + s.main.len }

func (s *s3fifo[K]) Admit(k K) {
	i, ok := s.pool.index[k]
	switch {
	case !ok:
		i = s.pool.track(k)
		s.pool.slots[i].queue = s3Small
		s.pool.pushFront(&s.small, i)
	case s.pool.slots[i].queue == s3Ghost:
		s.pool.moveTo(&s.ghost, &s.main, s3Main, i)
		s.pool.slots[i].count = 0
	default:
		s.Access(k)
	}
}

func (s *s3fifo[K]) Access(k K) {
	i, ok := s.pool.index[k]
	if !ok || s.pool.slots[i].queue == s3Ghost {
		return
	}
	if c := &s.pool.slots[i].count; *c < s3MaxFreq {
		*c++
	}
}

func (s *s3fifo[K]) Remove(k K) {
	if i, ok := s.pool.index[k]; ok {
		s.pool.unlink(s.queueOf(i), i)
		s.pool.forget(i)
	}
}

func (s *s3fifo[K]) Evict(busy func(K) bool) (K, bool) {
	smallShare := max(1, s.Len()/10)
	if s.small.len >= smallShare {
		if k, ok := s.evictSmall(busy); ok {
			return k, true
		}
		return s.evictMain(busy)
	}
	if k, ok := s.evictMain(busy); ok {
		return k, true
	}
	return s.evictSmall(busy)
}

// evictSmall walks S from its oldest key, promoting hit keys to M, and
// evicts the first idle key that was never hit, remembering it in G.
func (s *s3fifo[K]) evictSmall(busy func(K) bool) (K, bool) {
	for i := s.pool.oldest(&s.small); i != none; {
		newer := s.pool.newer(&s.small, i)
		k := s.pool.keys[i]
		switch {
		case busy != nil && busy(k):
		case s.pool.slots[i].count > 0:
			s.pool.moveTo(&s.small, &s.main, s3Main, i)
			s.pool.slots[i].count = 0
		default:
			s.pool.moveTo(&s.small, &s.ghost, s3Ghost, i)
			s.trimGhost()
			return k, true
		}
		i = newer
	}
	var zero K
	return zero, false
}

// evictMain walks M from its oldest key, giving each idle key with a
// non-zero frequency another round at the front (one count cheaper), and
// evicts the first idle key whose frequency is zero. Reinserted keys are
// met again further along the same walk, so it ends after at most
// s3MaxFreq+1 visits per idle key; busy keys keep their place.
func (s *s3fifo[K]) evictMain(busy func(K) bool) (K, bool) {
	for i := s.pool.oldest(&s.main); i != none; {
		newer := s.pool.newer(&s.main, i)
		k := s.pool.keys[i]
		switch {
		case busy != nil && busy(k):
		case s.pool.slots[i].count > 0:
			s.pool.slots[i].count--
			s.pool.moveToFront(&s.main, i)
			if newer == none { // i was already the newest: look at it again
				newer = i
			}
		default:
			s.pool.unlink(&s.main, i)
			s.pool.forget(i)
			return k, true
		}
		i = newer
	}
	var zero K
	return zero, false
}

// trimGhost keeps G no longer than M's share of the cache.
func (s *s3fifo[K]) trimGhost() {
	n := s.Len()
	limit := max(1, n-n/10)
	for s.ghost.len > limit {
		i := s.pool.oldest(&s.ghost)
		s.pool.unlink(&s.ghost, i)
		s.pool.forget(i)
	}
}

func (s *s3fifo[K]) queueOf(i int32) *queue {
	switch s.pool.slots[i].queue {
	case s3Small:
		return &s.small
	case s3Main:
		return &s.main
	}
	return &s.ghost
}
