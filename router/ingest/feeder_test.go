package ingest_test

import (
	"strconv"
	"testing"

	"kvtier/internal/msgpacktest"
	"kvtier/router/index"
	"kvtier/router/ingest"
)

// TestFeederLearnsModelsFromTopics: a kv@<pod>@<model> topic names the
// pod's model, which scoring uses to keep models apart.
func TestFeederLearnsModelsFromTopics(t *testing.T) {
	ix, err := index.New(index.Config{MaxBlocks: 1024})
	if err != nil {
		t.Fatal(err)
	}
	pods := index.NewPods()
	f := ingest.NewFeeder(ix, pods, "fallback")
	payload, err := msgpacktest.Encode([]any{1.0, []any{[]any{"BlockStored", []uint64{1, 2}, nil, []uint32{}, 16, nil, nil}}, nil}, false)
	if err != nil {
		t.Fatal(err)
	}
	f.Handle([]byte("kv@pod-1@meta-llama/Llama-3.1-8B@v2"), 1, payload)
	f.Handle([]byte(""), 1, payload) // vLLM's default empty topic: the fallback pod, model unknown
	id, ok := pods.ID("pod-1")
	if !ok || pods.Model(id) != "meta-llama/Llama-3.1-8B@v2" {
		t.Fatalf("pod-1 model %q (registered %v)", pods.Model(id), ok)
	}
	fb, _ := pods.ID("fallback")
	if pods.Model(fb) != "" {
		t.Errorf("fallback pod got model %q", pods.Model(fb))
	}
	if st := f.Stats()["pod-1"]; st.BlocksAdded != 2 || st.Malformed != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestTopicsCannotInventUnboundedPods(t *testing.T) {
	ix, _ := index.New(index.Config{MaxBlocks: 1024})
	pods := index.NewPods()
	f := ingest.NewFeeder(ix, pods, "fallback")
	payload, _ := msgpacktest.Encode([]any{1.0, []any{[]any{"AllBlocksCleared"}}, nil}, false)
	for i := range ingest.MaxPodsPerEndpoint + 50 {
		f.Handle([]byte("kv@made-up-"+strconv.Itoa(i)+"@m"), 1, payload)
	}
	if n := pods.Len(); n > ingest.MaxPodsPerEndpoint+1 {
		t.Errorf("%d pods registered from one endpoint's topics", n)
	}
}

// TestSourcesOfOnePodAreIndependent: vLLM announces a pod's GPU blocks and
// the node's kvtier daemon its RAM chunks, on two streams under one pod
// name; a restart or a clear on one stream leaves the other's entries.
func TestSourcesOfOnePodAreIndependent(t *testing.T) {
	ix, _ := index.New(index.Config{MaxBlocks: 1024})
	pods := index.NewPods()
	vllm := ingest.NewFeeder(ix, pods, "x")
	kvtier := ingest.NewFeeder(ix, pods, "y")
	enc := func(events ...any) []byte {
		b, err := msgpacktest.Encode([]any{1.0, events, nil}, false)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	topic := []byte("kv@pod-a@m")
	vllm.Handle(topic, 1, enc([]any{"BlockStored", []uint64{1, 2}, nil, []uint32{}, 16, nil, nil}))
	kvtier.Handle(topic, 1, enc([]any{"BlockStored", []uint64{1, 2, 3}, nil, []uint32{}, 16, nil, "CPU"}))
	kvtier.Handle(topic, 2, enc([]any{"AllBlocksCleared"}))
	id, _ := pods.ID("pod-a")
	if hs := ix.Holders(2, nil); len(hs) != 1 || hs[0].Pod != id || hs[0].Tier != index.GPU {
		t.Fatalf("after kvtier's clear, block 2 holders %+v: vLLM's GPU entry must stay", hs)
	}
	// kvtier restarts (sequence goes back): only its tiers are dropped.
	kvtier.Handle(topic, 1, enc([]any{"BlockStored", []uint64{3}, nil, []uint32{}, 16, nil, "CPU"}))
	kvtier.Handle(topic, 10, enc([]any{"BlockStored", []uint64{4}, nil, []uint32{}, 16, nil, "CPU"}))
	vllm.Handle(topic, 1, enc([]any{"BlockStored", []uint64{5}, nil, []uint32{}, 16, nil, nil})) // vLLM restarted
	if hs := ix.Holders(4, nil); len(hs) != 1 || hs[0].Tier != index.CPU {
		t.Errorf("vLLM's restart dropped kvtier's CPU entry: %+v", hs)
	}
	if hs := ix.Holders(1, nil); len(hs) != 0 {
		t.Errorf("vLLM's restart kept its old GPU entries: %+v", hs)
	}
}
