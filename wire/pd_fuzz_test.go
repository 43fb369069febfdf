package wire

import (
	"bytes"
	"testing"

	"kvtier/chunk"
)

func pdMessages() []func() message {
	return []func() message{
		func() message { return new(Push) },
		func() message { return new(PushStatus) },
		func() message { return new(PushStatusReply) },
		func() message { return new(Receive) },
		func() message { return new(Wait) },
		func() message { return new(WaitReply) },
	}
}

// FuzzDecodePD is FuzzDecode for the transfer messages: no panic, and a
// body that decodes encodes back to the same bytes.
func FuzzDecodePD(f *testing.F) {
	raw := Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3, Hash: chunk.Hash{1}}, {Scope: 3}}}
	f.Add((&Push{Transfer: 7, TimeoutMS: 100, Last: true, Dest: "127.0.0.1:1", Keys: raw}).Append(nil))
	f.Add((&Push{Transfer: 7, Dest: "127.0.0.1:1", Keys: raw, StoreLease: 9}).Append(nil))
	f.Add((&PushStatusReply{State: TransferFailed, Queued: 2, Pushed: 1, Message: "x"}).Append(nil))
	f.Add((&Receive{Transfer: 7, HoldMS: 5, Keys: raw, Sizes: []uint32{1, 2}}).Append(nil))
	f.Add((&Wait{TimeoutMS: 9, MinChunks: 2, Keys: Keys{Scope: 1, Kind: KindTokens, Tokens: []uint32{1}}}).Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mk := range pdMessages() {
			m := mk()
			if m.Decode(body) != nil {
				continue
			}
			if again := m.Append(nil); !bytes.Equal(again, body) {
				t.Fatalf("%T: decoded %x, encodes back as %x", m, body, again)
			}
		}
	})
}

func TestPDMessagesRoundTrip(t *testing.T) {
	raw := Keys{Kind: KindRaw, Raw: []chunk.Key{{Scope: 3, Hash: chunk.Hash{1}}}}
	in := Receive{Transfer: 7, HoldMS: 5, Keys: raw, Sizes: []uint32{10}}
	var out Receive
	if err := out.Decode(in.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if out.Transfer != 7 || out.HoldMS != 5 || out.Sizes[0] != 10 || out.Keys.Raw[0] != raw.Raw[0] {
		t.Fatalf("round trip: %+v", out)
	}
	bad := []message{
		&Push{Transfer: 0, Keys: raw},                                        // id 0
		&Receive{Transfer: 1, Keys: raw, Sizes: []uint32{MaxChunkBody}},      // no room for the trailer
		&Receive{Transfer: 1, Keys: Keys{Scope: 1, Kind: KindHashes}},        // not raw keys
		&Receive{Transfer: 1, Keys: Keys{Kind: KindRaw}, Sizes: []uint32{1}}, // more sizes than keys
	}
	for _, m := range bad {
		if err := m.Decode(m.Append(nil)); err == nil {
			t.Errorf("%T %+v decoded", m, m)
		}
	}
	var st PushStatusReply
	if err := st.Decode([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil {
		t.Error("unknown transfer state decoded")
	}
}
