package disk

// headerCache keeps the verified header blocks of records recently read
// by ranges, so that a daemon serving one RETRIEVE_RANGES per layer of a
// disk-only chunk reads the record's 4 KiB header once, not once per
// request (docs/layerwise.md, serving ranges from disk).
//
// It is direct-mapped by index slot and lives in the index, under the
// tier's lock. An entry names the slot and the record's place (key,
// segment, offset, size); index.drop forgets the entry of the slot it
// frees, and put only stores a header for a slot that is live at that
// place when it is stored. A record removed, evicted, dropped as corrupt
// or rewritten is therefore never read with the header of what was there
// before: its slot's entry went with the drop, and a new record gets a
// slot with no entry until its own header has been read and checked.
type headerCache struct {
	ents [headerCacheSize]headerEntry
}

// headerCacheSize bounds the cache: about 2.1 KiB per entry (a header's
// piece checksums), 136 KiB in all.
const headerCacheSize = 64

type headerEntry struct {
	slot int32 // 0: empty (slot 0 is never used by the index)
	loc  slot  // the record's place when its header was stored
	hdr  header
}

// get copies slot i's cached header into h when it is there for the
// record at loc.
func (c *headerCache) get(i int32, loc slot, h *header) bool {
	e := &c.ents[int(i)%headerCacheSize]
	if e.slot != i || !samePlace(e.loc, loc) {
		return false
	}
	*h = e.hdr
	return true
}

// put stores h, verified, as the header of the record at loc in slot i.
// The caller has checked that slot i still holds that record.
func (c *headerCache) put(i int32, loc slot, h *header) {
	e := &c.ents[int(i)%headerCacheSize]
	e.slot, e.loc, e.hdr = i, loc, *h
}

// forget drops slot i's entry: the slot is being freed.
func (c *headerCache) forget(i int32) {
	if e := &c.ents[int(i)%headerCacheSize]; e.slot == i {
		e.slot = 0
	}
}

func samePlace(a, b slot) bool {
	return a.key == b.key && a.seg == b.seg && a.off == b.off && a.size == b.size
}

// cacheHeader stores r's verified header for the next range reads of the
// same record, if the record is still live where r found it.
func (r *rangeRead) cacheHeader() {
	t := r.t
	t.mu.Lock()
	if s := &t.idx.slots[r.slot]; s.state == slotLive && samePlace(*s, r.loc) {
		t.idx.hdrs.put(r.slot, r.loc, &r.hdr)
	}
	t.mu.Unlock()
}
