package controller

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"kvtier/chunk"
	"kvtier/router/api"
	"kvtier/router/grpcapi"
	"kvtier/router/index"
	"kvtier/router/tokenize"
)

// TestGRPCScoresLikeHTTP asks GetPodScores over a real gRPC connection for
// a prompt string and checks the scores a pod holding its blocks gets.
func TestGRPCScoresLikeHTTP(t *testing.T) {
	ix, _ := index.New(index.Config{MaxBlocks: 1 << 12})
	pods := index.NewPods()
	hasher, _ := chunk.NewVLLMHasher("0", 16)
	tok, err := tokenize.Open("tiktoken:cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	pool := tokenize.NewPool(tok, tokenize.PoolOptions{})
	h, err := api.New(api.Config{Index: ix, Pods: pods, Hasher: hasher,
		Tokenizers: func(string) *tokenize.Pool { return pool }})
	if err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("kvtier keeps KV in cheaper memory. ", 30)
	ids, _ := tok.Encode(prompt, nil)
	var hashes []uint64
	for _, d := range hasher.BlockHashes(nil, ids, chunk.VLLMRequest{}) {
		hashes = append(hashes, chunk.EventHash(d))
	}
	id, _ := pods.Intern("pod-a")
	if err := ix.Add(id, index.GPU, hashes[:4]); err != nil {
		t.Fatal(err)
	}

	addr, stop, err := startGRPC("127.0.0.1:0", h, grpcapi.ScorerOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	file := grpcapi.File()
	svc := file.Services().Get(0)
	method := svc.Methods().ByName("GetPodScores")
	call := func(model, text string, podNames ...string) (*dynamicpb.Message, error) {
		req := dynamicpb.NewMessage(method.Input())
		fields := method.Input().Fields()
		req.Set(fields.ByName("prompt"), protoString(text))
		req.Set(fields.ByName("model_name"), protoString(model))
		list := req.Mutable(fields.ByName("pod_identifiers")).List()
		for _, p := range podNames {
			list.Append(protoString(p))
		}
		resp := dynamicpb.NewMessage(method.Output())
		err := conn.Invoke(context.Background(), "/"+string(svc.FullName())+"/GetPodScores", req, resp)
		return resp, err
	}
	resp, err := call("m", prompt, "pod-a", "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	scores := resp.Get(method.Output().Fields().ByName("scores")).List()
	if scores.Len() != 2 {
		t.Fatalf("%d scores", scores.Len())
	}
	first := scores.Get(0).Message()
	sf := first.Descriptor().Fields()
	if first.Get(sf.ByName("pod")).String() != "pod-a" || first.Get(sf.ByName("score")).Float() != 4 {
		t.Errorf("first score %v", first)
	}
	if _, err := call("", prompt); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a request without a model: %v, want InvalidArgument", err)
	}
}

func protoString(s string) protoreflect.Value { return protoreflect.ValueOfString(s) }
