package remote

import (
	"bytes"

	"kvtier/chunk"
	"kvtier/tier"
)

// Damage is what a reader found damaged in an object: some of the bytes
// it read (wholeDamage), so that the store removes the object only while
// it still holds those bytes. Between the read and the removal another
// reader may have removed the object and a writer stored a good one under
// the same key; an unconditional delete would then remove the good
// object (which costs one more store of the same KV: S3 takes that risk).
type Damage struct {
	// Size is the object's length when the read learnt it, else -1.
	Size int
	// Head is the object's first bytes as read (the header; at most
	// damageWindow after a whole read).
	Head []byte
	// Part is further bytes read at Off (the piece a range read found
	// damaged, or the last bytes of a whole read), or nil.
	Off  int
	Part []byte
}

// damageWindow bounds what a Damage holds of an object: its first bytes
// and one window of its last bytes, each at most this long.
const damageWindow = 4096

// wholeDamage describes obj, a whole object that failed its checks, by its
// length, its first bytes (the header) and its last bytes, not all of it:
// an object can be tens of MiB, and the store compares what the Damage
// holds (Redis: as script arguments, while it blocks). That is exact
// enough because chunk keys are content hashes of the tokens: every good
// object under a key holds the same KV, so an object that matches but
// differs elsewhere can only be a good one stored since with the same
// codec, whose removal costs one more store of the same bytes.
func wholeDamage(obj []byte) Damage {
	d := Damage{Size: len(obj), Head: obj[:min(len(obj), damageWindow)]}
	if len(obj) > damageWindow {
		d.Off = max(damageWindow, len(obj)-damageWindow)
		d.Part = obj[d.Off:]
	}
	return d
}

// Matches reports whether obj, a whole object, holds what d describes.
func (d Damage) Matches(obj []byte) bool {
	if d.Size >= 0 && len(obj) != d.Size {
		return false
	}
	if len(obj) < len(d.Head) || !bytes.Equal(obj[:len(d.Head)], d.Head) {
		return false
	}
	if len(d.Part) == 0 {
		return true
	}
	return d.Off >= 0 && d.Off <= len(obj)-len(d.Part) && bytes.Equal(obj[d.Off:d.Off+len(d.Part)], d.Part)
}

// DamageRemover is implemented by a store that can remove an object on
// the condition that it still holds the damaged bytes a reader found
// (Redis: a compare-and-delete script; the shared filesystem: the same
// file, compared and unlinked; S3, which has no conditional delete, only
// an object of the damaged length, and may take a good object stored
// since with it: content-hash keys make that one more store of the same
// KV). Encoded removes damaged objects only from such stores: elsewhere
// (a kvtier daemon, a P2P peer) the object stays, and the breaker is what
// stops the reads.
type DamageRemover interface {
	// RemoveDamaged removes key's object if it still matches d and reports
	// what it did.
	RemoveDamaged(key chunk.Key, d Damage) Removal
}

// Removal is what RemoveDamaged did with a damaged object.
type Removal int

const (
	// DamageKept: the object was not removed (the store cannot remove on
	// condition, refused, or failed); it may still be there.
	DamageKept Removal = iota
	// DamageRemoved: the damaged object was removed.
	DamageRemoved
	// DamageGone: there was no damaged object left to remove: gone, or
	// replaced by another. Another reader of the same damaged object
	// has removed it, and counted it.
	DamageGone
)

var _ DamageRemover = (*Guarded)(nil)

// removeDamaged removes key's damaged object from t when t can do so on
// condition.
func removeDamaged(t tier.Tier, key chunk.Key, d Damage) Removal {
	if r, ok := t.(DamageRemover); ok {
		return r.RemoveDamaged(key, d)
	}
	return DamageKept
}

// RemoveDamaged implements DamageRemover through the breaker, like Remove;
// it is DamageKept when the store cannot remove on condition, or the call
// was refused or failed.
func (g *Guarded) RemoveDamaged(key chunk.Key, d Damage) Removal {
	if _, ok := g.inner.(DamageRemover); !ok {
		return DamageKept
	}
	c, err := g.begin(opRemoveDamaged)
	if err != nil {
		return DamageKept
	}
	c.key = key
	// Private copies: an abandoned call may still read them.
	c.buf = append(append(c.buf[:0], d.Head...), d.Part...)
	c.dmg = Damage{Size: d.Size, Head: c.buf[:len(d.Head)], Off: d.Off}
	if len(d.Part) > 0 {
		c.dmg.Part = c.buf[len(d.Head):]
	}
	if g.run(nil, c, g.deadline(len(c.buf))) != nil {
		return DamageKept
	}
	r := Removal(c.n)
	g.finish(c, outcomeNeutral)
	return r
}
