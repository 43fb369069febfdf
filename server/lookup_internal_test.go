package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier/chunk"
	"kvtier/engine"
	"kvtier/wire"
)

// BenchmarkLookupOne is the daemon's own work for one LOOKUP of a cached
// 4,096-token prompt, with no socket: decoding the body, keying the
// tokens, probing the RAM tier, building the reply. "frame" keys the
// tokens where they lie in the frame (as the daemon does), "buffer"
// copies them from a request buffer a chunk at a time, "hashes" takes the
// 16 chunk hashes an engine computed (key kind 1: nothing to key), and
// "copied" is
// how the daemon did it before: the tokens copied out of the body into a
// token array (Decode) and keyed with the streaming hasher
// (engine.Keys). cpu-ns/op is the process's CPU time per lookup, which a
// loaded machine inflates far less than wall time.
//
//	go test -run X -bench LookupOne -benchtime 200000x ./server
func BenchmarkLookupOne(b *testing.B) {
	eng, err := engine.Open(engine.Options{ChunkSize: 256, RAMBytes: 16 << 20, Policy: "LRU"})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	scope := chunk.Scope{Model: "bench", WorldSize: 1, Format: "bfloat16/KV_2LTD"}
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i)*2654435761 + 3
	}
	chunks := make([][]byte, 16)
	for i := range chunks {
		chunks[i] = make([]byte, 4096)
	}
	if n, err := eng.Store(context.Background(), engine.Request{Scope: scope, Tokens: tokens}, chunks); err != nil || n != 16 {
		b.Fatalf("stored %d: %v", n, err)
	}
	svc := NewService(eng, ServiceOptions{})
	defer svc.Shutdown(context.Background())
	id, err := eng.RegisterScope(scope)
	if err != nil {
		b.Fatal(err)
	}
	s := &session{svc: svc, scopes: []scopeEntry{{scope: scope, id: id}}}
	s.reqBuf = (&wire.Keys{Kind: wire.KindTokens, Tokens: tokens}).Append(nil)[16:]
	frame := (&wire.Lookup{Keys: wire.Keys{Scope: 1, Kind: wire.KindTokens, Tokens: tokens}}).Append(nil)
	shared := (&wire.Lookup{Keys: wire.Keys{Scope: 1, Kind: wire.KindShared, Shared: wire.SharedTokens{Count: 4096}}}).Append(nil)
	c, err := eng.ScopeChunker(scope)
	if err != nil {
		b.Fatal(err)
	}
	var hashes []chunk.Hash
	for _, k := range c.Keys(nil, tokens) {
		hashes = append(hashes, k.Hash)
	}
	byHash := (&wire.Lookup{Keys: wire.Keys{Scope: 1, Kind: wire.KindHashes, Hashes: hashes}}).Append(nil)
	check := func(b *testing.B, out []byte, rerr *requestError) {
		var r wire.LookupReply
		if rerr != nil || r.Decode(out) != nil || r.Chunks != 16 {
			b.Fatalf("lookup: %v, %+v", rerr, r)
		}
	}
	run := func(name string, one func() ([]byte, *requestError)) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				out, rerr := one()
				if rerr != nil {
					check(b, out, rerr)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			out, rerr := one()
			check(b, out, rerr)
		})
	}
	run("frame", func() ([]byte, *requestError) {
		if err := s.lookup.DecodeView(frame); err != nil {
			b.Fatal(err)
		}
		var rerr *requestError
		s.out, rerr = s.lookupOne(s.out[:0], &s.lookup, false)
		return s.out, rerr
	})
	run("buffer", func() ([]byte, *requestError) {
		if err := s.lookup.DecodeView(shared); err != nil {
			b.Fatal(err)
		}
		var rerr *requestError
		s.out, rerr = s.lookupOne(s.out[:0], &s.lookup, false)
		return s.out, rerr
	})
	run("hashes", func() ([]byte, *requestError) {
		if err := s.lookup.DecodeView(byHash); err != nil {
			b.Fatal(err)
		}
		var rerr *requestError
		s.out, rerr = s.lookupOne(s.out[:0], &s.lookup, false)
		return s.out, rerr
	})
	run("copied", func() ([]byte, *requestError) {
		if err := s.lookup.Decode(frame); err != nil {
			b.Fatal(err)
		}
		r, rerr := s.resolve(&s.lookup.Keys)
		if rerr != nil {
			return nil, rerr
		}
		n, _ := eng.LookupKeys(r.keys)
		reply := wire.LookupReply{Chunks: uint32(n), Tokens: uint32(engine.TokensThrough(r.chunker, n, r.tokens)), ByTier: s.byTier[:0]}
		s.out = reply.Append(s.out[:0])
		return s.out, nil
	})
}

// processCPU is the process's CPU time: the benchmark's loop is all that
// runs in it.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestSessionNowAgreesWithTimeNow: the session's clock agrees with
// time.Now (within the time between the reads), with an epoch and without
// one, and carries a monotonic reading, so that the write deadlines it sets
// lie ahead, not in the past, and compare by the monotonic clock. Plain
// time.Now passes too: what now saves (a clock read) is a cost, which
// BenchmarkLookupOne measures, not a behaviour.
func TestSessionNowAgreesWithTimeNow(t *testing.T) {
	for _, s := range []*session{{}, {epoch: time.Now().Add(-time.Hour)}} {
		before := time.Now()
		got := s.now()
		after := time.Now()
		if !strings.Contains(got.String(), " m=") {
			t.Fatalf("epoch %v: now %v has no monotonic reading", s.epoch, got)
		}
		if got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
			t.Fatalf("epoch %v: now %v, outside %v..%v", s.epoch, got, before, after)
		}
		if d := time.Until(got.Add(time.Minute)); d < 59*time.Second {
			t.Fatalf("epoch %v: a deadline a minute ahead is %v away", s.epoch, d)
		}
	}
}
