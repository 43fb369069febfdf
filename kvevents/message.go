package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrFrames reports ZMQ frames of the wrong number or size.
var ErrFrames = errors.New("kvevents: bad frames")

// seqLen is the size of a sequence-number frame: uint64, big-endian.
const seqLen = 8

// endOfReplay is the sequence frame that closes a replay: -1 as a signed
// 64-bit integer, i.e. all bits set.
const endOfReplay = ^uint64(0)

// Message is one published batch: the three frames of a PUB message. Topic
// and Payload alias the frames they were decoded from.
type Message struct {
	Topic   []byte
	Seq     uint64
	Payload []byte
}

// DecodeMessage checks and splits the frames (topic, seq, payload) of one
// message received on vLLM's PUB socket.
func DecodeMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("%w: message has %d frames, want 3 (topic, seq, payload)", ErrFrames, len(frames))
	}
	seq, err := decodeSeq(frames[1])
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: frames[0], Seq: seq, Payload: frames[2]}, nil
}

func decodeSeq(frame []byte) (uint64, error) {
	if len(frame) != seqLen {
		return 0, fmt.Errorf("%w: sequence frame is %d bytes, want %d", ErrFrames, len(frame), seqLen)
	}
	return binary.BigEndian.Uint64(frame), nil
}

// AppendReplayRequest appends the request a client sends to vLLM's replay
// ROUTER socket: the first wanted sequence number, 8 bytes big-endian. The
// server answers with every buffered message whose seq ≥ start.
func AppendReplayRequest(dst []byte, start uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, start)
}

// ReplayReply is one reply from the replay socket: a buffered message, or
// (End) the marker that says the replay is complete.
type ReplayReply struct {
	Seq     uint64
	Payload []byte // aliases the frame
	End     bool
}

// DecodeReplayReply decodes one reply of the replay socket. vLLM releases
// differ: older ones answer (seq, payload), newer ones put the topic first,
// (topic, seq, payload); both end with seq = -1 (signed) and an empty
// payload. A DEALER client also receives the empty delimiter frame the
// server sends after the client identity, so a leading empty frame is
// dropped first. The topic is not returned: replayed messages belong to
// the stream that asked for them.
func DecodeReplayReply(frames [][]byte) (ReplayReply, error) {
	if len(frames) > 2 && len(frames[0]) == 0 {
		frames = frames[1:] // DEALER delimiter
	}
	if len(frames) == 3 {
		frames = frames[1:] // topic
	}
	if len(frames) != 2 {
		return ReplayReply{}, fmt.Errorf("%w: replay reply has %d frames, want [topic,] seq, payload", ErrFrames, len(frames))
	}
	seq, err := decodeSeq(frames[0])
	if err != nil {
		return ReplayReply{}, err
	}
	if seq == endOfReplay {
		if len(frames[1]) != 0 {
			return ReplayReply{}, fmt.Errorf("%w: end-of-replay marker carries a %d-byte payload, want none", ErrFrames, len(frames[1]))
		}
		return ReplayReply{End: true}, nil
	}
	return ReplayReply{Seq: seq, Payload: frames[1]}, nil
}
