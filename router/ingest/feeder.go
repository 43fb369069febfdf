package ingest

import (
	"kvtier/router/index"
)

// Feeder applies KV-event messages handed to it directly — (topic, seq,
// payload) exactly as a vLLM publisher sends them — through the same path
// a Subscriber's sockets use: decoding, sequence tracking, tier mapping
// and the index writes. Simulations and tests use it to drive the router
// deterministically, without sockets. A Feeder is not safe for concurrent
// use; give each goroutine its own.
type Feeder struct {
	s        *stream
	counters *counterSet
	seqFrame [8]byte
	frames   [3][]byte
}

// NewFeeder returns a Feeder writing to ix. fallbackPod names the pod of
// messages whose topic does not follow "kv@<pod>@<model>".
func NewFeeder(ix index.Store, pods *index.Pods, fallbackPod string) *Feeder {
	cs := &counterSet{}
	return &Feeder{s: newStream(ix, pods, cs, fallbackPod, nil), counters: cs}
}

// Handle applies one message. Like a Subscriber it never fails: what it
// cannot use is counted (see Stats).
func (f *Feeder) Handle(topic []byte, seq uint64, payload []byte) {
	for i := range 8 {
		f.seqFrame[i] = byte(seq >> (56 - 8*i))
	}
	f.frames = [3][]byte{topic, f.seqFrame[:], payload}
	f.s.handle(f.frames[:])
}

// Stats returns the counters of every pod seen so far.
func (f *Feeder) Stats() map[string]PodStats { return f.counters.snapshot() }
