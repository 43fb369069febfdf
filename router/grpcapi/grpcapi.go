// Package grpcapi serves kvtier's KV-aware router over gRPC, wire-compatible
// with llm-d's KV-cache indexer (service indexer.v1.IndexerService, method
// GetPodScores), so that an llm-d-style scheduler built against llm-d's
// generated client can ask kvtier which pods hold a prompt's prefix without
// a change.
//
// There is no generated code here. The package builds indexer.proto's file
// descriptor in Go (schema.go), decodes requests into dynamicpb messages
// with gRPC's standard proto codec, and registers a hand-written
// grpc.ServiceDesc. What the wire sees — method path, field numbers, wire
// types, proto3 presence of data_parallel_rank — is therefore exactly what
// protoc would give, and the tests check it byte by byte.
//
// Scoring is not done here: a Scorer turns (model, prompt, pods) into
// scores, so this package only translates between protobuf and Go values
// and between Go errors and gRPC status codes. NewHandlerScorer is the
// Scorer over the router's HTTP handler (package router/api); it tokenizes
// the prompt as llm-d does, with the tokenizer's special tokens, so that
// the block keys are the engine's (ScorerOptions).
package grpcapi

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Server limits NewServer sets unless options override them.
const (
	// DefaultMaxRecvBytes bounds a request message. A prompt of a 128k-token
	// context is well under 1 MiB of text.
	DefaultMaxRecvBytes = 4 << 20
	// DefaultMaxConcurrentStreams bounds in-flight RPCs per connection, so
	// one client cannot queue unbounded work.
	DefaultMaxConcurrentStreams = 256
)

// ErrInvalid marks a request the Scorer rejects as malformed (unknown
// model, empty prompt, too many pods...). Scorers wrap it with %w; callers
// then get codes.InvalidArgument.
var ErrInvalid = errors.New("grpcapi: invalid request")

// Scorer scores pods for a prompt: how much of the prompt's KV each pod
// already holds. pods restricts the answer to those pods; empty means all
// pods the scorer knows. The lead's router implements it.
type Scorer interface {
	ScorePrompt(ctx context.Context, model, prompt string, pods []string) ([]PodScore, error)
}

// PodScore is one pod's score. DataParallelRank is sent only when HasRank
// is set, matching the proto3 optional field (absent means not a
// data-parallel deployment).
type PodScore struct {
	Pod              string
	Score            float64
	DataParallelRank int32
	HasRank          bool
}

// Register adds the IndexerService, backed by sc, to s (a *grpc.Server or
// any other registrar). It panics if sc is nil, like http.Handle.
func Register(s grpc.ServiceRegistrar, sc Scorer) {
	if sc == nil {
		panic("grpcapi: Register with nil Scorer")
	}
	s.RegisterService(&serviceDesc, sc)
}

// NewServer returns a gRPC server serving the IndexerService backed by sc,
// with DefaultMaxRecvBytes and DefaultMaxConcurrentStreams; opts come after
// those defaults and so override them.
func NewServer(sc Scorer, opts ...grpc.ServerOption) *grpc.Server {
	defaults := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(DefaultMaxRecvBytes),
		grpc.MaxConcurrentStreams(DefaultMaxConcurrentStreams),
	}
	s := grpc.NewServer(append(defaults, opts...)...)
	Register(s, sc)
	return s
}

// serviceDesc is what protoc-gen-go-grpc would generate for IndexerService,
// with the Scorer as the service implementation.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*Scorer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: MethodName, Handler: getPodScoresHandler}},
	Metadata:    protoPath,
}

// getPodScoresHandler is the grpc.MethodHandler: decode the request, run
// the interceptor chain if there is one, and return the response message
// for gRPC to encode.
func getPodScoresHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	req := dynamicpb.NewMessage(schema.request)
	// dec returns a gRPC status error already (size, I/O or unmarshal).
	if err := dec(req); err != nil {
		return nil, err
	}
	sc := srv.(Scorer)
	if interceptor == nil {
		return getPodScores(ctx, sc, req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: FullMethod}
	return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		return getPodScores(ctx, sc, req)
	})
}

func getPodScores(ctx context.Context, sc Scorer, req any) (any, error) {
	m, ok := req.(*dynamicpb.Message)
	if !ok || m.Descriptor() != schema.request {
		// Only an interceptor that swapped the request can cause this.
		return nil, status.Errorf(codes.Internal, "grpcapi: request is %T, want %s", req, schema.request.FullName())
	}
	model, prompt, pods := readRequest(m)
	scores, err := sc.ScorePrompt(ctx, model, prompt, pods)
	if err != nil {
		return nil, statusError(err)
	}
	return newResponse(scores), nil
}

// readRequest returns the request's fields; pods is nil when none are given.
func readRequest(m protoreflect.Message) (model, prompt string, pods []string) {
	list := m.Get(schema.podIdentifiers).List()
	if n := list.Len(); n > 0 {
		pods = make([]string, n)
		for i := range pods {
			pods[i] = list.Get(i).String()
		}
	}
	return m.Get(schema.modelName).String(), m.Get(schema.prompt).String(), pods
}

func newResponse(scores []PodScore) *dynamicpb.Message {
	resp := dynamicpb.NewMessage(schema.response)
	list := resp.Mutable(schema.scores).List()
	for _, s := range scores {
		ps := dynamicpb.NewMessage(schema.score)
		ps.Set(schema.pod, protoreflect.ValueOfString(s.Pod))
		ps.Set(schema.value, protoreflect.ValueOfFloat64(s.Score))
		if s.HasRank {
			// Setting a proto3 optional field marks it present, even at 0.
			ps.Set(schema.dataParallelRank, protoreflect.ValueOfInt32(s.DataParallelRank))
		}
		list.Append(protoreflect.ValueOfMessage(ps))
	}
	return resp
}

// statusError maps a Scorer error to a gRPC status: ErrInvalid to
// InvalidArgument, context errors to Canceled / DeadlineExceeded, anything
// else to Internal. The message is the error's own text and nothing more.
func statusError(err error) error {
	switch {
	case errors.Is(err, ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		return status.Error(codes.Internal, fmt.Sprintf("score prompt: %v", err))
	}
}
