package grpcapi

import (
	"context"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/dynamicpb"
)

// FuzzHandlerDecode feeds arbitrary bytes through the handler exactly as
// the server does (gRPC's proto codec into the dynamicpb request). It must
// never panic, and a request that decodes yields one score per pod.
func FuzzHandlerDecode(f *testing.F) {
	var valid []byte
	valid = protowire.AppendTag(valid, 1, protowire.BytesType)
	valid = protowire.AppendString(valid, "prompt")
	valid = protowire.AppendTag(valid, 3, protowire.BytesType)
	valid = protowire.AppendString(valid, "dp-3")
	f.Add(valid)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Add([]byte{0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	codec := encoding.GetCodecV2(proto.Name)
	f.Fuzz(func(t *testing.T, data []byte) {
		dec := func(v any) error { return codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, v) }
		sc := &fakeScorer{}
		resp, err := getPodScoresHandler(sc, context.Background(), dec, nil)
		if err != nil {
			return
		}
		if got, want := len(scoresOf(resp.(*dynamicpb.Message))), len(sc.lastCall().pods); got != want {
			t.Fatalf("%d scores for %d pods", got, want)
		}
	})
}
