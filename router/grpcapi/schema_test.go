package grpcapi

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// indexerProtoText is the interface part of llm-d's api/indexerpb/indexer.proto,
// normalised (one declaration per line, no comments, no empty option braces).
const indexerProtoText = `syntax = "proto3";
package indexer.v1;
service IndexerService {
  rpc GetPodScores(GetPodScoresRequest) returns (GetPodScoresResponse);
}
message GetPodScoresRequest {
  string prompt = 1;
  string model_name = 2;
  repeated string pod_identifiers = 3;
}
message GetPodScoresResponse {
  repeated PodScore scores = 1;
}
message PodScore {
  string pod = 1;
  double score = 2;
  optional int32 data_parallel_rank = 3;
}
`

// TestSchemaMatchesProtoText prints the built descriptor back as proto text
// and compares it with llm-d's declarations: names, numbers, types, labels,
// "optional" presence and the service signature.
func TestSchemaMatchesProtoText(t *testing.T) {
	if got := protoText(File()); got != indexerProtoText {
		t.Errorf("descriptor as proto text:\n%s\nwant:\n%s", got, indexerProtoText)
	}
}

// TestSyntheticOneof checks what protoc does for proto3 "optional": the
// field sits alone in a synthetic oneof "_data_parallel_rank", which is not
// a real oneof, and the field has explicit presence; the other fields have
// implicit presence.
func TestSyntheticOneof(t *testing.T) {
	score := File().Messages().ByName("PodScore")
	rank := score.Fields().ByName("data_parallel_rank")
	oneofs := score.Oneofs()
	if oneofs.Len() != 1 {
		t.Fatalf("PodScore has %d oneofs, want 1", oneofs.Len())
	}
	o := oneofs.Get(0)
	if o.Name() != "_data_parallel_rank" || !o.IsSynthetic() || o.Fields().Len() != 1 || o.Fields().Get(0) != rank {
		t.Errorf("oneof %s synthetic=%v fields=%d, want synthetic _data_parallel_rank holding only data_parallel_rank",
			o.Name(), o.IsSynthetic(), o.Fields().Len())
	}
	if rank.ContainingOneof() != o || !rank.HasPresence() || !rank.HasOptionalKeyword() {
		t.Errorf("data_parallel_rank: oneof=%v presence=%v optional=%v, want in synthetic oneof with explicit presence",
			rank.ContainingOneof(), rank.HasPresence(), rank.HasOptionalKeyword())
	}
	for _, name := range []protoreflect.Name{"pod", "score"} {
		if f := score.Fields().ByName(name); f.HasPresence() || f.ContainingOneof() != nil {
			t.Errorf("%s has presence or a oneof; proto3 singular fields have neither", name)
		}
	}
}

func TestSchemaNames(t *testing.T) {
	f := File()
	if f.Path() != "api/indexerpb/indexer.proto" || f.Syntax() != protoreflect.Proto3 {
		t.Errorf("file %s syntax %v", f.Path(), f.Syntax())
	}
	m := f.Services().ByName("IndexerService").Methods().ByName("GetPodScores")
	if got := "/" + string(m.Parent().FullName()) + "/" + string(m.Name()); got != FullMethod || FullMethod != "/indexer.v1.IndexerService/GetPodScores" {
		t.Errorf("method path %s, FullMethod %s", got, FullMethod)
	}
	if m.IsStreamingClient() || m.IsStreamingServer() {
		t.Error("GetPodScores must be unary")
	}
	if got := serviceDesc.ServiceName + "/" + serviceDesc.Methods[0].MethodName; "/"+got != FullMethod {
		t.Errorf("ServiceDesc names %s", got)
	}
}

// protoText renders a proto3 file descriptor the way indexerProtoText is
// written. It covers only what this file uses: scalar and message fields,
// repeated and optional labels, unary methods.
func protoText(f protoreflect.FileDescriptor) string {
	var b strings.Builder
	fmt.Fprintf(&b, "syntax = %q;\npackage %s;\n", f.Syntax(), f.Package())
	for i := 0; i < f.Services().Len(); i++ {
		s := f.Services().Get(i)
		fmt.Fprintf(&b, "service %s {\n", s.Name())
		for j := 0; j < s.Methods().Len(); j++ {
			m := s.Methods().Get(j)
			fmt.Fprintf(&b, "  rpc %s(%s) returns (%s);\n", m.Name(), m.Input().Name(), m.Output().Name())
		}
		b.WriteString("}\n")
	}
	for i := 0; i < f.Messages().Len(); i++ {
		m := f.Messages().Get(i)
		fmt.Fprintf(&b, "message %s {\n", m.Name())
		for j := 0; j < m.Fields().Len(); j++ {
			fd := m.Fields().Get(j)
			label := ""
			switch {
			case fd.Cardinality() == protoreflect.Repeated:
				label = "repeated "
			case fd.HasOptionalKeyword():
				label = "optional "
			}
			typ := fd.Kind().String()
			if fd.Kind() == protoreflect.MessageKind {
				typ = string(fd.Message().Name())
			}
			fmt.Fprintf(&b, "  %s%s %s = %d;\n", label, typ, fd.Name(), fd.Number())
		}
		b.WriteString("}\n")
	}
	return b.String()
}
