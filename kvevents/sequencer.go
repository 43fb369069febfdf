package kvevents

// Status classifies a sequence number seen by a Sequencer.
type Status uint8

const (
	// First: the first message of the stream; it sets the baseline. Earlier
	// messages (a subscriber that joins late) are not reported missing.
	First Status = iota
	// InOrder: exactly the expected next sequence number.
	InOrder
	// Gap: messages were lost between the previous and this one; the
	// missing range is reported so that it can be replayed.
	Gap
	// Restart: the sequence went back (to 0 or below what was expected), so
	// the publisher restarted and its earlier state is gone. Messages of the
	// new run before this one, if any, are reported missing.
	Restart
)

func (s Status) String() string {
	switch s {
	case First:
		return "first"
	case InOrder:
		return "in-order"
	case Gap:
		return "gap"
	case Restart:
		return "restart"
	}
	return "unknown"
}

// Sequencer follows the sequence numbers of one publisher stream: one per
// (pod, data-parallel rank), since each DP rank runs its own publisher with
// its own counter. It is not safe for concurrent use.
type Sequencer struct {
	next    uint64
	started bool
}

// Observe records seq and classifies it. For Gap and Restart, missing is true
// and [missingFrom, missingTo] (inclusive) are the sequence numbers that never
// arrived; for a Restart that number range belongs to the new run.
func (s *Sequencer) Observe(seq uint64) (st Status, missing bool, missingFrom, missingTo uint64) {
	switch {
	case !s.started:
		s.started = true
		st = First
	case seq == s.next:
		st = InOrder
	case seq > s.next:
		st, missing, missingFrom, missingTo = Gap, true, s.next, seq-1
	default:
		st = Restart
		if seq > 0 {
			missing, missingFrom, missingTo = true, 0, seq-1
		}
	}
	s.next = seq + 1
	return st, missing, missingFrom, missingTo
}

// Next returns the sequence number expected next, and false before the first
// message.
func (s *Sequencer) Next() (uint64, bool) { return s.next, s.started }
