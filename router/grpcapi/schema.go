package grpcapi

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Names from llm-d's api/indexerpb/indexer.proto. They are part of the wire
// contract: a generated client sends FullMethod as the HTTP/2 :path.
const (
	ServiceName = "indexer.v1.IndexerService"
	MethodName  = "GetPodScores"
	FullMethod  = "/" + ServiceName + "/" + MethodName

	// protoPath is the file name llm-d's generated code registers; kvtier
	// never registers it globally, so it cannot clash with that code when
	// both are linked into one binary.
	protoPath = "api/indexerpb/indexer.proto"
)

// schema holds the descriptors of the service's messages and the fields
// the handler reads and writes, resolved once at init.
var schema = mustSchema()

type messageSchema struct {
	request  protoreflect.MessageDescriptor
	response protoreflect.MessageDescriptor
	score    protoreflect.MessageDescriptor

	prompt, modelName, podIdentifiers protoreflect.FieldDescriptor // request
	scores                            protoreflect.FieldDescriptor // response
	pod, value, dataParallelRank      protoreflect.FieldDescriptor // score

	file protoreflect.FileDescriptor
}

// File returns the descriptor of indexer.proto as kvtier builds it: the
// same messages and service as llm-d's file, so tools that need a schema
// (gRPC reflection, dynamic clients, tests) can use it.
func File() protoreflect.FileDescriptor { return schema.file }

func mustSchema() *messageSchema {
	fd, err := protodesc.NewFile(indexerProto(), nil)
	if err != nil {
		// The input is a constant, so this is a bug the tests catch.
		panic(fmt.Sprintf("grpcapi: build %s descriptor: %v", protoPath, err))
	}
	msgs := fd.Messages()
	s := &messageSchema{
		file:     fd,
		request:  msgs.ByName("GetPodScoresRequest"),
		response: msgs.ByName("GetPodScoresResponse"),
		score:    msgs.ByName("PodScore"),
	}
	s.prompt = s.request.Fields().ByNumber(1)
	s.modelName = s.request.Fields().ByNumber(2)
	s.podIdentifiers = s.request.Fields().ByNumber(3)
	s.scores = s.response.Fields().ByNumber(1)
	s.pod = s.score.Fields().ByNumber(1)
	s.value = s.score.Fields().ByNumber(2)
	s.dataParallelRank = s.score.Fields().ByNumber(3)
	return s
}

// indexerProto spells out, as a descriptor, this proto3 file:
//
//	package indexer.v1;
//	service IndexerService { rpc GetPodScores(GetPodScoresRequest) returns (GetPodScoresResponse) {} }
//	message GetPodScoresRequest { string prompt = 1; string model_name = 2; repeated string pod_identifiers = 3; }
//	message GetPodScoresResponse { repeated PodScore scores = 1; }
//	message PodScore { string pod = 1; double score = 2; optional int32 data_parallel_rank = 3; }
//
// protoc would produce the same from the .proto text; there is no protoc
// here, and a dozen lines of descriptor beat vendoring generated code.
func indexerProto() *descriptorpb.FileDescriptorProto {
	const (
		str      = descriptorpb.FieldDescriptorProto_TYPE_STRING
		dbl      = descriptorpb.FieldDescriptorProto_TYPE_DOUBLE
		i32      = descriptorpb.FieldDescriptorProto_TYPE_INT32
		msg      = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		optional = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL // proto3's implicit "singular"
		repeated = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
	)
	// A proto3 "optional" field is, in a descriptor, a member of a synthetic
	// oneof named "_<field>" that must come after the message's real oneofs.
	rank := field("data_parallel_rank", 3, i32, optional, "")
	rank.OneofIndex = proto.Int32(0)
	rank.Proto3Optional = proto.Bool(true)

	return &descriptorpb.FileDescriptorProto{
		Name:    proto.String(protoPath),
		Package: proto.String("indexer.v1"),
		Syntax:  proto.String("proto3"),
		Options: &descriptorpb.FileOptions{
			GoPackage: proto.String("github.com/llm-d/llm-d-kv-cache/api/indexerpb;indexerpb"),
		},
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("GetPodScoresRequest"),
			Field: []*descriptorpb.FieldDescriptorProto{
				field("prompt", 1, str, optional, ""),
				field("model_name", 2, str, optional, ""),
				field("pod_identifiers", 3, str, repeated, ""),
			},
		}, {
			Name: proto.String("GetPodScoresResponse"),
			Field: []*descriptorpb.FieldDescriptorProto{
				field("scores", 1, msg, repeated, ".indexer.v1.PodScore"),
			},
		}, {
			Name: proto.String("PodScore"),
			Field: []*descriptorpb.FieldDescriptorProto{
				field("pod", 1, str, optional, ""),
				field("score", 2, dbl, optional, ""),
				rank,
			},
			OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: proto.String("_data_parallel_rank")}},
		}},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("IndexerService"),
			Method: []*descriptorpb.MethodDescriptorProto{{
				Name:       proto.String(MethodName),
				InputType:  proto.String(".indexer.v1.GetPodScoresRequest"),
				OutputType: proto.String(".indexer.v1.GetPodScoresResponse"),
			}},
		}},
	}
}

func field(name string, number int32, typ descriptorpb.FieldDescriptorProto_Type,
	label descriptorpb.FieldDescriptorProto_Label, typeName string) *descriptorpb.FieldDescriptorProto {
	f := &descriptorpb.FieldDescriptorProto{
		Name:   proto.String(name),
		Number: proto.Int32(number),
		Type:   typ.Enum(),
		Label:  label.Enum(),
	}
	if typeName != "" {
		f.TypeName = proto.String(typeName)
	}
	return f
}
