package wire

// OpLookupBatch carries many LOOKUPs in one frame and answers them in one
// reply: a scheduler that has several prompts to ask about pays one round
// trip, not one per prompt.
const OpLookupBatch Op = 21

// MaxBatch bounds the lookups of one LOOKUP_BATCH. The body limit
// (MaxMetaBody) bounds their tokens too.
const MaxBatch = 1024

// LookupBatch is several LOOKUP bodies in one frame. Each is answered
// exactly as a LOOKUP of its own would be, in order, and a lookup that
// fails (an unknown scope handle, a skip the prompt cannot have, too many
// leases) fails alone: its entry in the reply carries the status.
//
//	0 4 count n (1 ≤ n ≤ MaxBatch)
//	4 . n × lookup (the body of LOOKUP: lease, keys)
type LookupBatch struct {
	Lookups []Lookup
}

func (m *LookupBatch) Append(b []byte) []byte {
	b = appendU32(b, uint32(len(m.Lookups)))
	for i := range m.Lookups {
		b = m.Lookups[i].Append(b)
	}
	return b
}

// Decode parses a whole batch, reusing the lookups (and their key slices)
// of an earlier decode into m. Every lookup is checked before any is
// served, so a malformed one fails the frame, not half of it.
func (m *LookupBatch) Decode(body []byte) error {
	return m.decode(decoder{b: body})
}

// DecodeView is Decode that leaves token ids and kind-1 hashes in body,
// as Lookup.DecodeView does: m is valid only as long as body is.
func (m *LookupBatch) DecodeView(body []byte) error {
	return m.decode(decoder{b: body, view: true})
}

func (m *LookupBatch) decode(d decoder) error {
	body := d.b
	n := d.u32("lookup batch count")
	switch {
	case d.err != nil:
	case n == 0:
		d.fail("lookup batch: no lookups")
	case n > MaxBatch:
		d.fail("lookup batch: %d lookups, limit %d", n, MaxBatch)
	case uint64(n)*lookupMinLen > uint64(len(body)-d.off):
		// Checked before the lookups are grown: a count cannot make the
		// decoder allocate more than the body could hold.
		d.fail("lookup batch: %d lookups in %d bytes", n, len(body)-d.off)
	}
	if d.err != nil {
		m.Lookups = m.Lookups[:0]
		return d.err
	}
	if cap(m.Lookups) < int(n) {
		m.Lookups = append(m.Lookups[:cap(m.Lookups)], make([]Lookup, int(n)-cap(m.Lookups))...)
	}
	m.Lookups = m.Lookups[:n]
	for i := range m.Lookups {
		l := &m.Lookups[i]
		l.LeaseMS = d.u32("lookup batch lease")
		l.Keys.decode(&d)
		if d.err != nil {
			break
		}
	}
	return d.end("lookup batch")
}

// lookupMinLen is the smallest lookup body: a lease and the keys' fixed
// fields with no keys.
const lookupMinLen = 4 + 16

// LookupResult answers one lookup of a batch: a status and, when it is
// StatusOK, the reply that LOOKUP would have given, else the message.
//
//	0 4 status
//	4 . status OK: the LOOKUP reply; otherwise the message (string)
type LookupResult struct {
	Status  Status
	Message string
	Reply   LookupReply
}

// LookupBatchReply answers a LOOKUP_BATCH, one result per lookup, in
// order.
//
//	0 4 count n
//	4 . n × result
type LookupBatchReply struct {
	Results []LookupResult
}

func (m *LookupBatchReply) Append(b []byte) []byte {
	b = appendU32(b, uint32(len(m.Results)))
	for i := range m.Results {
		b = m.Results[i].Append(b)
	}
	return b
}

// Append encodes one result: the batch's server appends them one by one
// as it serves the lookups.
func (r *LookupResult) Append(b []byte) []byte {
	b = appendU32(b, uint32(r.Status))
	if r.Status == StatusOK {
		return r.Reply.Append(b)
	}
	return appendStr(b, r.Message)
}

// Decode parses a reply, reusing the results of an earlier decode.
func (m *LookupBatchReply) Decode(body []byte) error {
	d := decoder{b: body}
	n := d.u32("lookup batch reply count")
	switch {
	case d.err != nil:
	case n > MaxBatch:
		d.fail("lookup batch reply: %d results, limit %d", n, MaxBatch)
	case uint64(n)*6 > uint64(len(body)-d.off): // a status and an empty message
		d.fail("lookup batch reply: %d results in %d bytes", n, len(body)-d.off)
	}
	if d.err != nil {
		m.Results = m.Results[:0]
		return d.err
	}
	if cap(m.Results) < int(n) {
		m.Results = append(m.Results[:cap(m.Results)], make([]LookupResult, int(n)-cap(m.Results))...)
	}
	m.Results = m.Results[:n]
	for i := range m.Results {
		r := &m.Results[i]
		r.Status = Status(d.u32("lookup batch reply status"))
		r.Message = ""
		switch {
		case d.err != nil:
		case r.Status >= statusLimit:
			d.fail("lookup batch reply: unknown status %d", r.Status)
		case r.Status == StatusOK:
			r.Reply.decode(&d)
		default:
			r.Reply = LookupReply{ByTier: r.Reply.ByTier[:0]}
			r.Message = d.str("lookup batch reply message")
		}
		if d.err != nil {
			break
		}
	}
	return d.end("lookup batch reply")
}
