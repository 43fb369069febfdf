package tokenize

import "sync"

// segmentKey names a cached segment by everything before its end: the xxh3
// of the text prefix and the prefix length (a cheap guard against the odd
// 64-bit collision between prefixes of different lengths).
type segmentKey struct {
	hash   uint64
	length int
}

// segmentEntry is one cached segment's tokens, on an intrusive LRU list.
type segmentEntry struct {
	key        segmentKey
	tokens     []uint32 // never modified once cached
	prev, next *segmentEntry
}

// entryOverhead approximates the bytes an entry costs beyond its tokens
// (entry struct, map slot), so that many tiny segments still count.
const entryOverhead = 96

// segmentCache is an LRU of segment tokens bounded by bytes.
type segmentCache struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	entries map[segmentKey]*segmentEntry
	lru     segmentEntry // sentinel: lru.next is the most recently used
}

func newSegmentCache(limit int64) *segmentCache {
	c := &segmentCache{limit: limit, entries: make(map[segmentKey]*segmentEntry)}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

func entryCost(tokens []uint32) int64 { return int64(4*len(tokens)) + entryOverhead }

// get returns the cached tokens of key; callers must not modify them.
func (c *segmentCache) get(key segmentKey) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	c.moveToFront(e)
	return e.tokens, true
}

// put caches a copy of tokens under key, evicting least recently used
// segments beyond the byte limit.
func (c *segmentCache) put(key segmentKey, tokens []uint32) {
	cost := entryCost(tokens)
	if cost > c.limit {
		return
	}
	owned := append([]uint32(nil), tokens...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		c.moveToFront(e)
		return
	}
	e := &segmentEntry{key: key, tokens: owned}
	c.entries[key] = e
	c.link(e)
	c.used += cost
	for c.used > c.limit {
		c.evict(c.lru.prev)
	}
}

func (c *segmentCache) stats() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.used
}

func (c *segmentCache) link(e *segmentEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	e.next.prev = e
	c.lru.next = e
}

func (c *segmentCache) unlink(e *segmentEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (c *segmentCache) moveToFront(e *segmentEntry) {
	c.unlink(e)
	c.link(e)
}

func (c *segmentCache) evict(e *segmentEntry) {
	c.unlink(e)
	delete(c.entries, e.key)
	c.used -= entryCost(e.tokens)
}
