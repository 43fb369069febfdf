package server_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"kvtier/client"
	"kvtier/server"
	"kvtier/wire"
)

var (
	fuzzOnce   sync.Once
	fuzzDaemon *daemon
)

// FuzzSession sends arbitrary bytes after a valid handshake on a TCP
// connection. The daemon must answer with frames or close the connection
// (never hang or crash), and keep serving a well-behaved client after
// every input. One daemon serves all inputs; it is never shut down, so it
// sees the whole corpus.
func FuzzSession(f *testing.F) {
	hello := frame(wire.OpHello, 0, 1, (&wire.Hello{Version: wire.Version, Token: testToken}).Append(nil))
	keys := wire.Keys{Scope: 1, Kind: wire.KindTokens, Tokens: prompt(2*pChunkTokens, 1)}
	scope := frame(wire.OpScope, 0, 2, (&wire.Scope{WorldSize: 1, Model: "m"}).Append(nil))
	f.Add(scope)
	f.Add(append(scope, frame(wire.OpLookup, 0, 3, (&wire.Lookup{Keys: keys}).Append(nil))...))
	f.Add(append(scope, frame(wire.OpStore, wire.FlagMore, 3, (&wire.Store{Keys: keys, Sizes: []uint32{4}}).Append(nil))...))
	f.Add(append(append(scope, frame(wire.OpStore, wire.FlagMore, 3, (&wire.Store{Keys: keys, Sizes: []uint32{4}}).Append(nil))...),
		frame(wire.OpStore, 0, 3, []byte{1, 2, 3, 4})...))
	f.Add(append(scope, frame(wire.OpRetrieve, 0, 3, (&wire.KeysOnly{Keys: keys}).Append(nil))...))
	f.Add(frame(wire.OpCommitStore, 0, 3, (&wire.Commit{Lease: 1, Count: 1}).Append(nil)))
	f.Add(frame(wire.OpStoreLayer, 0, 3, (&wire.StoreLayer{Lease: 1, Layer: 2, Layers: 4, Parts: 2}).Append(nil)))
	f.Add(frame(wire.OpStoreLayer, 0, 3, []byte{1, 2, 3}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(frame(wire.OpFlush, 0, 3, (&wire.Flush{TimeoutMS: 10}).Append(nil)))
	for _, rs := range [][]wire.ByteRange{{{Key: 0, From: 0, To: 1 << 30}}, {{Key: 0, From: 0, To: 4}, {Key: 0, From: 0, To: 4}, {Key: 1, From: 2, To: 3}}} {
		f.Add(append(scope, frame(wire.OpRetrieveRanges, 0, 3, (&wire.RetrieveRanges{Keys: keys, Ranges: rs}).Append(nil))...))
	}
	f.Add(append(scope, frame(wire.OpLookupBatch, 0, 3, (&wire.LookupBatch{Lookups: []wire.Lookup{{Keys: keys}, {LeaseMS: 5, Keys: keys}}}).Append(nil))...))
	f.Fuzz(func(t *testing.T, input []byte) {
		fuzzOnce.Do(func() { fuzzDaemon = startPersistent(t) })
		d := fuzzDaemon
		conn, err := net.Dial("tcp", d.tcp)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write(hello)
		conn.Write(input)
		conn.(*net.TCPConn).CloseWrite()
		// Everything the daemon sends must be well-formed frames, and it
		// must end the connection once our side is closed.
		rd := wire.NewReader(conn)
		for {
			h, err := rd.Header()
			if err == io.EOF {
				break
			}
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("the daemon neither answered nor closed the connection")
				}
				break // reset by the daemon closing mid-frame: fine
			}
			if h.Flags&wire.FlagReply == 0 {
				t.Fatalf("the daemon sent a frame that is not a reply: %+v", h)
			}
			if rd.Discard(h.Len) != nil {
				break
			}
		}
		c, err := client.DialTCP(context.Background(), d.tcp, client.Options{Token: testToken})
		if err != nil {
			t.Fatalf("a good client cannot connect after this input: %v", err)
		}
		defer c.Close()
		if err := c.Ping(context.Background()); err != nil {
			t.Fatalf("a good client is not served after this input: %v", err)
		}
	})
}

// startPersistent starts a daemon that lives as long as the test process:
// the fuzzer runs inputs in many short-lived tests.
func startPersistent(t *testing.T) *daemon {
	d, _, err := newDaemon(8<<20, server.ServiceOptions{}, "") // TCP only: nothing on disk outlives the test
	if err != nil {
		t.Fatal(err)
	}
	return d
}
