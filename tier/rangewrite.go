package tier

import (
	"context"
	"errors"

	"kvtier/chunk"
)

// RangeWriter is implemented by tiers that can write an object a range
// at a time while its owner is still filling it, and make it visible only
// once it is complete: the disk tier, whose records carry their piece
// checksums in a header written last. Per-layer saves (LayerSave) write
// each layer of a chunk through it as soon as the connector says the layer
// is final, instead of the whole chunk after COMMIT_STORE.
type RangeWriter interface {
	// OpenWrite reserves room for key's object of size bytes and returns
	// its writer. It never waits for other writes, and gives up waiting
	// for anything when ctx ends. It returns nil and no error when the
	// tier holds key already, another write of key is under way, or there
	// is no room without waiting for writes: the caller then writes the
	// object whole, or not at all, as it would without range writes.
	OpenWrite(ctx context.Context, key chunk.Key, size int) (RangeWrite, error)
}

// RoomReserver is a RangeWriter whose OpenWrite takes room from a fixed
// budget (the disk tier's extents), so that an open can fail for lack of
// the room earlier opens took. A save opens such a tier's chunks one at a
// time in prefix order: the room then goes to the earliest chunks, which
// are worth the most — a lookup stops at the first chunk missing, and a
// later chunk is of no use without those before it.
type RoomReserver interface {
	RangeWriter
	ReservesRoom()
}

// ErrRangeOpen is why a RangeWriter's Put of a key fails while a range
// write of that key is open (opened, not yet committing or aborting). An
// open write ends when its client commits or its lease lapses, which can
// be minutes away, so a Put does not wait for it: the write counts as
// missed, not failed, and Sync redoes it if the range write did not store
// the key meanwhile.
var ErrRangeOpen = errors.New("tier: a range write of the key is open")

// RangeWrite writes one object. It is used by one goroutine at a time.
// Nothing it writes is visible, before or after a crash, until Commit
// returns nil.
type RangeWrite interface {
	// WriteRange writes src[from:to], whose bytes are final: src is the
	// whole object (OpenWrite's size) and the caller will not change those
	// bytes again. Ranges must not overlap. The tier may hold back bytes
	// that share a block or a checksum piece with bytes no range has
	// covered yet; Commit writes them.
	WriteRange(ctx context.Context, src []byte, from, to int) error
	// Commit writes whatever no range covered, then makes the object
	// durable (as the tier's Put would) and visible. parent names the
	// chunk before it in its prompt when hasParent, as ChainPutter. After
	// a failed Commit nothing is visible and the writer's room is given
	// back.
	Commit(ctx context.Context, src []byte, parent chunk.Key, hasParent bool) error
	// Abort gives back the room OpenWrite reserved; nothing becomes
	// visible. Abort after Commit does nothing.
	Abort()
}

// RangeWriteChooser is implemented by a RangeWriter that can write ranges
// only at some times (a remote store behind a circuit breaker) or with
// some settings (an envelope codec that cannot be cut into pieces): a
// per-layer save writes to it by ranges only when WritesRanges says so
// as the save begins, and otherwise leaves it to the write-behind queue
// after the commit, as without per-layer saves.
type RangeWriteChooser interface {
	WritesRanges() bool
}
