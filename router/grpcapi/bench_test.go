package grpcapi

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

func benchRequest() *dynamicpb.Message {
	pods := make([]string, 8)
	for i := range pods {
		pods[i] = fmt.Sprintf("10.0.0.%d:8000", i)
	}
	return newRequest("llama-3-8b", "You are a helpful assistant. Summarise the following document.", pods...)
}

// BenchmarkGetPodScores is a loopback round trip with 8 pods, client and
// server in this process (allocations count both sides).
func BenchmarkGetPodScores(b *testing.B) {
	conn := serve(b, &fakeScorer{})
	req := benchRequest()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resp := dynamicpb.NewMessage(schema.response)
		if err := conn.Invoke(ctx, FullMethod, req, resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetPodScoresRawBaseline is the same round trip with no protobuf
// work on the client (bytes in, bytes out): the cost of gRPC and loopback
// that dynamicpb on the client side adds to.
func BenchmarkGetPodScoresRawBaseline(b *testing.B) {
	conn := serve(b, &fakeScorer{})
	body, err := codecMarshal(benchRequest())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := invokeRaw(ctx, conn, FullMethod, body); err != nil {
			b.Fatal(err)
		}
	}
}

func codecMarshal(m *dynamicpb.Message) ([]byte, error) { return proto.Marshal(m) }
