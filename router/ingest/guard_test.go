package ingest

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"sync/atomic"
	"testing"
)

// zmtpStream builds a greeting followed by frames of the given sizes, short
// and long ones, as a ZMTP 3 peer would send them.
func zmtpStream(sizes ...uint64) []byte {
	var b bytes.Buffer
	b.Write(make([]byte, zmtpGreetingBytes))
	for _, n := range sizes {
		if n < 256 {
			b.Write([]byte{0x01, byte(n)})
		} else {
			b.WriteByte(0x01 | zmtpLongFrame)
			binary.Write(&b, binary.BigEndian, n)
		}
		b.Write(make([]byte, n))
	}
	return b.Bytes()
}

// TestFrameGuardFollowsFraming feeds valid streams split at every byte
// boundary (the guard sees whatever a Read returns) and a stream whose
// last frame is one byte over the limit, which must be refused no matter
// how the size field is split.
func TestFrameGuardFollowsFraming(t *testing.T) {
	const limit = 1000
	good := zmtpStream(0, 5, 255, 256, limit)
	for cut := range len(good) {
		g := frameGuard{greetingLeft: zmtpGreetingBytes, limit: limit}
		if err := g.feed(good[:cut]); err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		if err := g.feed(good[cut:]); err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		if g.inSize || g.bodyLeft != 0 {
			t.Fatalf("cut %d: guard not at a frame boundary at the end", cut)
		}
	}
	bad := zmtpStream(3, limit+1)
	for cut := range len(bad) {
		g := frameGuard{greetingLeft: zmtpGreetingBytes, limit: limit}
		err := g.feed(bad[:cut])
		if err == nil {
			err = g.feed(bad[cut:])
		}
		if err == nil || !strings.Contains(err.Error(), "1001-byte") {
			t.Fatalf("cut %d: oversized frame gave %v", cut, err)
		}
	}
}

// TestSubscriberRefusesHugeFrame points a subscriber at a peer that sends
// a ZMTP greeting and then announces a 64 GiB frame. Without the guard
// zmq4 would allocate it and the test process would die of a fatal
// out-of-memory error; with it the connection is dropped and retried.
func TestSubscriberRefusesHugeFrame(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var served atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			greeting := make([]byte, zmtpGreetingBytes)
			greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
			copy(greeting[12:], "NULL")
			hdr := []byte{0x04 | zmtpLongFrame, 0, 0, 0, 16, 0, 0, 0, 0} // a 64 GiB command
			c.Write(append(greeting, hdr...))
			served.Add(1)
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
			c.Close()
		}
	}()
	f := newFixture(t)
	startSubscriber(t, f, Endpoint{Pod: "p", Model: "m", Address: "tcp://" + ln.Addr().String()})
	waitFor(t, "the subscriber to reconnect after a refused frame", func() bool { return served.Load() >= 2 })
}
