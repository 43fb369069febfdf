package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// fakeScorer stands in for the router's scorer. Pod i of the request
// scores i+0.5; pods named "dp-N" carry data-parallel rank N (N may be
// negative or zero, to test presence). Prompts starting with "err:" fail.
type fakeScorer struct {
	mu   sync.Mutex
	last call
}

type call struct {
	model, prompt string
	pods          []string
	hasDeadline   bool
}

var errBackend = errors.New("index shard unavailable")

func (f *fakeScorer) ScorePrompt(ctx context.Context, model, prompt string, pods []string) ([]PodScore, error) {
	_, hasDeadline := ctx.Deadline()
	f.mu.Lock()
	f.last = call{model: model, prompt: prompt, pods: pods, hasDeadline: hasDeadline}
	f.mu.Unlock()
	switch prompt {
	case "err:invalid":
		return nil, fmt.Errorf("model %q not served: %w", model, ErrInvalid)
	case "err:canceled":
		return nil, fmt.Errorf("lookup: %w", context.Canceled)
	case "err:deadline":
		return nil, fmt.Errorf("lookup: %w", context.DeadlineExceeded)
	case "err:backend":
		return nil, errBackend
	}
	out := make([]PodScore, len(pods))
	for i, p := range pods {
		out[i] = PodScore{Pod: p, Score: float64(i) + 0.5}
		var rank int32
		if _, err := fmt.Sscanf(p, "dp-%d", &rank); err == nil {
			out[i].DataParallelRank, out[i].HasRank = rank, true
		}
	}
	return out, nil
}

func (f *fakeScorer) lastCall() call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// serve starts a server on a loopback port and returns a client connection.
func serve(t testing.TB, sc Scorer, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(sc, opts...)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn
}

func newRequest(model, prompt string, pods ...string) *dynamicpb.Message {
	m := dynamicpb.NewMessage(schema.request)
	m.Set(schema.modelName, protoreflect.ValueOfString(model))
	m.Set(schema.prompt, protoreflect.ValueOfString(prompt))
	list := m.Mutable(schema.podIdentifiers).List()
	for _, p := range pods {
		list.Append(protoreflect.ValueOfString(p))
	}
	return m
}

// scoresOf reads a response message back into PodScores.
func scoresOf(resp *dynamicpb.Message) []PodScore {
	list := resp.Get(schema.scores).List()
	out := make([]PodScore, list.Len())
	for i := range out {
		ps := list.Get(i).Message()
		out[i] = PodScore{
			Pod:              ps.Get(schema.pod).String(),
			Score:            ps.Get(schema.value).Float(),
			DataParallelRank: int32(ps.Get(schema.dataParallelRank).Int()),
			HasRank:          ps.Has(schema.dataParallelRank),
		}
	}
	return out
}

func invoke(ctx context.Context, conn *grpc.ClientConn, req *dynamicpb.Message) ([]PodScore, error) {
	resp := dynamicpb.NewMessage(schema.response)
	if err := conn.Invoke(ctx, FullMethod, req, resp); err != nil {
		return nil, err
	}
	return scoresOf(resp), nil
}

func TestGetPodScoresDynamic(t *testing.T) {
	sc := &fakeScorer{}
	conn := serve(t, sc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	got, err := invoke(ctx, conn, newRequest("llama-3", "hello world", "pod-a", "dp-0", "dp--1", "dp-7"))
	if err != nil {
		t.Fatal(err)
	}
	want := []PodScore{
		{Pod: "pod-a", Score: 0.5},
		{Pod: "dp-0", Score: 1.5, DataParallelRank: 0, HasRank: true},
		{Pod: "dp--1", Score: 2.5, DataParallelRank: -1, HasRank: true},
		{Pod: "dp-7", Score: 3.5, DataParallelRank: 7, HasRank: true},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("scores\n got %v\nwant %v", got, want)
	}
	c := sc.lastCall()
	if c.model != "llama-3" || c.prompt != "hello world" || strings.Join(c.pods, ",") != "pod-a,dp-0,dp--1,dp-7" || !c.hasDeadline {
		t.Errorf("scorer saw %+v, want the request's fields and the client's deadline", c)
	}

	// No pods: the scorer sees nil and the response is empty, not an error.
	got, err = invoke(ctx, conn, newRequest("m", "p"))
	if err != nil || len(got) != 0 || sc.lastCall().pods != nil {
		t.Errorf("no pods: scores %v err %v pods %v", got, err, sc.lastCall().pods)
	}
}

// rawCodec sends and receives message bytes as they are, under the name
// "proto" so the content-type matches a generated client's.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func invokeRaw(ctx context.Context, conn *grpc.ClientConn, method string, req []byte) ([]byte, error) {
	var resp []byte
	err := conn.Invoke(ctx, method, &req, &resp, grpc.ForceCodecV2(rawCodec{}))
	return resp, err
}

// TestWireCompatibility encodes the request by hand from the field numbers
// and types in llm-d's proto and decodes the response the same way, so it
// holds for any client generated from that proto.
func TestWireCompatibility(t *testing.T) {
	sc := &fakeScorer{}
	conn := serve(t, sc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var req []byte
	req = protowire.AppendTag(req, 3, protowire.BytesType) // pods first: field order must not matter
	req = protowire.AppendString(req, "pod-a")
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendString(req, "the prompt")
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	req = protowire.AppendString(req, "qwen")
	req = protowire.AppendTag(req, 3, protowire.BytesType)
	req = protowire.AppendString(req, "dp--1")
	req = protowire.AppendTag(req, 99, protowire.VarintType) // unknown field from a newer client: skipped
	req = protowire.AppendVarint(req, 1)

	resp, err := invokeRaw(ctx, conn, FullMethod, req)
	if err != nil {
		t.Fatal(err)
	}
	if c := sc.lastCall(); c.model != "qwen" || c.prompt != "the prompt" || strings.Join(c.pods, ",") != "pod-a,dp--1" {
		t.Errorf("scorer saw %+v", c)
	}

	// Expected bytes, built independently: repeated PodScore scores = 1,
	// each {string pod = 1; double score = 2; optional int32 rank = 3}.
	var a, b, want []byte
	a = protowire.AppendTag(a, 1, protowire.BytesType)
	a = protowire.AppendString(a, "pod-a")
	a = protowire.AppendTag(a, 2, protowire.Fixed64Type)
	a = protowire.AppendFixed64(a, 0x3fe0000000000000) // 0.5
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "dp--1")
	b = protowire.AppendTag(b, 2, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, 0x3ff8000000000000) // 1.5
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, 0xffffffffffffffff) // int32 -1 sign-extends to ten bytes
	for _, ps := range [][]byte{a, b} {
		want = protowire.AppendTag(want, 1, protowire.BytesType)
		want = protowire.AppendBytes(want, ps)
	}
	// Protobuf lets a message's fields come in any order (and dynamic
	// messages do not promise one), so compare each PodScore's fields as
	// a set of (number, wire type, bytes), keeping the scores' order.
	if got, exp := canonical(t, resp), canonical(t, want); fmt.Sprint(got) != fmt.Sprint(exp) {
		t.Errorf("response\n got %v (%x)\nwant %v (%x)", got, resp, exp, want)
	}
}

// canonical parses a GetPodScoresResponse: for each entry of field 1, in
// order, its fields as sorted "number/type/hex value" strings.
func canonical(t *testing.T, b []byte) [][]string {
	t.Helper()
	var out [][]string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			t.Fatalf("response: field %d type %d where scores (1, bytes) were expected", num, typ)
		}
		b = b[n:]
		msg, n := protowire.ConsumeBytes(b)
		if n < 0 {
			t.Fatal("response: truncated score")
		}
		b = b[n:]
		var fields []string
		for len(msg) > 0 {
			num, typ, n := protowire.ConsumeTag(msg)
			if n < 0 {
				t.Fatal("score: bad tag")
			}
			msg = msg[n:]
			n = protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				t.Fatal("score: bad value")
			}
			fields = append(fields, fmt.Sprintf("%d/%d/%x", num, typ, msg[:n]))
			msg = msg[n:]
		}
		slices.Sort(fields)
		out = append(out, fields)
	}
	return out
}

// TestRankPresenceOnWire: rank 0 with HasRank is sent (field 3 = 0), and
// without HasRank nothing is sent, so a generated client can tell them apart.
func TestRankPresenceOnWire(t *testing.T) {
	for _, s := range []PodScore{{Pod: "p", DataParallelRank: 0, HasRank: true}, {Pod: "p", DataParallelRank: 5}} {
		b, err := proto.Marshal(newResponse([]PodScore{s}))
		if err != nil {
			t.Fatal(err)
		}
		_, _, n := protowire.ConsumeTag(b) // scores = 1
		ps, _ := protowire.ConsumeBytes(b[n:])
		has := false
		for len(ps) > 0 {
			num, typ, k := protowire.ConsumeTag(ps)
			ps = ps[k:]
			k = protowire.ConsumeFieldValue(num, typ, ps)
			if num == 3 {
				has = true
			}
			ps = ps[k:]
		}
		if has != s.HasRank {
			t.Errorf("%+v: field 3 on wire = %v, want %v", s, has, s.HasRank)
		}
	}
}

func TestErrorCodes(t *testing.T) {
	conn := serve(t, &fakeScorer{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		prompt  string
		code    codes.Code
		message string
	}{
		{"err:invalid", codes.InvalidArgument, `model "m" not served: grpcapi: invalid request`},
		{"err:canceled", codes.Canceled, "lookup: context canceled"},
		{"err:deadline", codes.DeadlineExceeded, "lookup: context deadline exceeded"},
		{"err:backend", codes.Internal, "score prompt: index shard unavailable"},
	} {
		_, err := invoke(ctx, conn, newRequest("m", tc.prompt, "pod-a"))
		st := status.Convert(err)
		if st.Code() != tc.code || st.Message() != tc.message {
			t.Errorf("%s: got %v %q, want %v %q", tc.prompt, st.Code(), st.Message(), tc.code, tc.message)
		}
	}
}

func TestOversizedRequestRejected(t *testing.T) {
	sc := &fakeScorer{}
	conn := serve(t, sc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, err := invoke(ctx, conn, newRequest("m", strings.Repeat("x", DefaultMaxRecvBytes+1), "pod-a"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized request: %v, want ResourceExhausted", err)
	}
	if sc.lastCall().prompt != "" {
		t.Error("scorer was called for an oversized request")
	}
	// Just under the limit still works (the pod and tags take a few bytes).
	if _, err := invoke(ctx, conn, newRequest("m", strings.Repeat("x", DefaultMaxRecvBytes-64), "pod-a")); err != nil {
		t.Errorf("request under the limit: %v", err)
	}
}

// TestOptionsOverrideDefaults: options passed to NewServer win over its
// defaults, here a smaller receive limit.
func TestOptionsOverrideDefaults(t *testing.T) {
	conn := serve(t, &fakeScorer{}, grpc.MaxRecvMsgSize(1024))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := invoke(ctx, conn, newRequest("m", strings.Repeat("x", 2048))); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("2 KiB request with a 1 KiB limit: %v, want ResourceExhausted", err)
	}
}

func TestUnknownMethodUnimplemented(t *testing.T) {
	conn := serve(t, &fakeScorer{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, method := range []string{"/indexer.v1.IndexerService/AddPod", "/indexer.v2.IndexerService/GetPodScores", "/foo/bar"} {
		if _, err := invokeRaw(ctx, conn, method, nil); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: %v, want Unimplemented", method, err)
		}
	}
}

func TestMalformedRequest(t *testing.T) {
	sc := &fakeScorer{}
	conn := serve(t, sc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, body := range [][]byte{
		{0x0a, 0x05, 'a'},           // prompt claims 5 bytes, has 1
		{0x0a, 0x02, 0xff, 0xfe},    // prompt is not UTF-8, which proto3 strings must be
		{0x11, 0, 0, 0, 0, 0, 0, 0}, // prompt sent as fixed64: wrong wire type for field 1
	} {
		_, err := invokeRaw(ctx, conn, FullMethod, body)
		// gRPC-Go reports unmarshal failures as Internal, as it does for
		// llm-d's generated server.
		if status.Code(err) != codes.Internal {
			t.Errorf("%x: %v, want Internal", body, err)
		}
	}
	if c := sc.lastCall(); c.prompt != "" || c.model != "" {
		t.Errorf("scorer was called with %+v for malformed requests", c)
	}
}

func TestInterceptorRuns(t *testing.T) {
	var seen []string
	var mu sync.Mutex
	intercept := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		m := req.(proto.Message).ProtoReflect()
		mu.Lock()
		seen = append(seen, info.FullMethod+" "+string(m.Descriptor().FullName())+" "+m.Get(schema.prompt).String())
		mu.Unlock()
		if m.Get(schema.prompt).String() == "deny" {
			return nil, status.Error(codes.PermissionDenied, "denied")
		}
		return h(ctx, req)
	}
	sc := &fakeScorer{}
	conn := serve(t, sc, grpc.UnaryInterceptor(intercept))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if got, err := invoke(ctx, conn, newRequest("m", "ok", "pod-a")); err != nil || len(got) != 1 {
		t.Errorf("through interceptor: %v %v", got, err)
	}
	if _, err := invoke(ctx, conn, newRequest("m", "deny", "pod-a")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("interceptor's error: %v, want PermissionDenied", err)
	}
	want := "/indexer.v1.IndexerService/GetPodScores indexer.v1.GetPodScoresRequest ok|" +
		"/indexer.v1.IndexerService/GetPodScores indexer.v1.GetPodScoresRequest deny"
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(seen, "|"); got != want {
		t.Errorf("interceptor saw %q, want %q", got, want)
	}
	if sc.lastCall().prompt != "ok" {
		t.Error("scorer ran for a request the interceptor denied")
	}
}

// TestInterceptorSwapsRequest: a request of the wrong type reaching the
// handler is an Internal error, not a panic.
func TestInterceptorSwapsRequest(t *testing.T) {
	swap := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, dynamicpb.NewMessage(schema.score))
	}
	_, err := getPodScoresHandler(&fakeScorer{}, context.Background(), func(any) error { return nil }, swap)
	if status.Code(err) != codes.Internal {
		t.Errorf("swapped request: %v, want Internal", err)
	}
}

func TestRegisterNilScorerPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Register(s, nil) did not panic")
		}
	}()
	Register(grpc.NewServer(), nil)
}
