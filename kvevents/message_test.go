package kvevents

import (
	"bytes"
	"errors"
	"testing"
)

func TestDecodeMessage(t *testing.T) {
	seq := []byte{0, 0, 0, 0, 0, 0, 1, 2}
	m, err := DecodeMessage([][]byte{[]byte("kv@p@m"), seq, {0x92}})
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Topic) != "kv@p@m" || m.Seq != 0x102 || !bytes.Equal(m.Payload, []byte{0x92}) {
		t.Fatalf("got %+v", m)
	}
	bad := [][][]byte{
		nil,
		{[]byte("t"), seq},
		{[]byte("t"), seq, {}, {}},
		{[]byte("t"), seq[:7], {}},
		{[]byte("t"), append(seq, 0), {}},
	}
	for i, frames := range bad {
		if _, err := DecodeMessage(frames); !errors.Is(err, ErrFrames) {
			t.Errorf("case %d: err = %v, want ErrFrames", i, err)
		}
	}
}

func TestReplayFrames(t *testing.T) {
	req := AppendReplayRequest(nil, 0x0102030405060708)
	if !bytes.Equal(req, []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("request = %x", req)
	}
	seq := AppendReplayRequest(nil, 42)
	r, err := DecodeReplayReply([][]byte{seq, []byte("payload")})
	if err != nil || r.End || r.Seq != 42 || string(r.Payload) != "payload" {
		t.Fatalf("reply = %+v, %v", r, err)
	}
	// A DEALER client sees the empty delimiter first.
	r, err = DecodeReplayReply([][]byte{{}, seq, []byte("p")})
	if err != nil || r.Seq != 42 || string(r.Payload) != "p" {
		t.Fatalf("reply with delimiter = %+v, %v", r, err)
	}
	// Newer vLLM puts the topic before seq, with or without the delimiter.
	for _, frames := range [][][]byte{{{}, []byte("kv@p@m"), seq, []byte("p")}, {[]byte("kv@p@m"), seq, []byte("p")}} {
		if r, err = DecodeReplayReply(frames); err != nil || r.Seq != 42 || string(r.Payload) != "p" {
			t.Fatalf("reply with topic %q = %+v, %v", frames, r, err)
		}
	}
	end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff} // -1 signed, as vLLM sends it
	for _, frames := range [][][]byte{{end, {}}, {{}, end, {}}, {{}, {}, end, {}}} {
		if r, err = DecodeReplayReply(frames); err != nil || !r.End {
			t.Fatalf("end marker %q = %+v, %v", frames, r, err)
		}
	}
	bad := [][][]byte{
		{end, []byte("x")}, // end marker with a payload
		{seq},              // too few frames
		{seq, {}, {}},      // three frames without a delimiter
		{{}, []byte("t"), []byte("t"), seq, []byte("p")}, // too many
		{seq[:4], []byte("p")},                           // short seq
	}
	for i, frames := range bad {
		if _, err := DecodeReplayReply(frames); !errors.Is(err, ErrFrames) {
			t.Errorf("case %d: err = %v, want ErrFrames", i, err)
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte("kv@p@m"), []byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90}, uint8(3))
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte, n uint8) {
		frames := [][]byte{topic, seq, payload, payload}[:int(n)%5]
		m, err := DecodeMessage(frames)
		if err != nil {
			return
		}
		if len(frames) != 3 || len(seq) != 8 || !bytes.Equal(AppendReplayRequest(nil, m.Seq), seq) {
			t.Fatalf("accepted %d frames with a %d-byte seq, decoded seq %d", len(frames), len(seq), m.Seq)
		}
		var d Decoder
		var b Batch
		if d.Decode(m.Payload, &b) == nil {
			checkBatch(t, &b)
		}
		if r, err := DecodeReplayReply(frames[1:]); err == nil && r.End && len(r.Payload) != 0 {
			t.Fatal("end marker with payload accepted")
		}
	})
}
