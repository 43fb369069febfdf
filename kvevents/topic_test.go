package kvevents

import (
	"errors"
	"testing"
)

func TestParseTopic(t *testing.T) {
	good := []struct{ topic, pod, model string }{
		{"kv@pod-1@meta-llama/Llama-3.1-8B", "pod-1", "meta-llama/Llama-3.1-8B"},
		{"kv@10.0.0.7:8000@Qwen/Qwen3@rev-2", "10.0.0.7:8000", "Qwen/Qwen3@rev-2"},
		{"kv@p@@", "p", "@"},
		{"kv@p@m", "p", "m"},
	}
	for _, c := range good {
		pod, model, err := ParseTopic(c.topic)
		if err != nil || pod != c.pod || model != c.model {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want %q, %q", c.topic, pod, model, err, c.pod, c.model)
		}
	}
	bad := []string{"", "kv", "kv@", "kv@pod", "kv@pod@", "kv@@model", "KV@pod@model", "xkv@pod@model", "@pod@model", "vllm-events"}
	for _, topic := range bad {
		pod, model, err := ParseTopic(topic)
		if !errors.Is(err, ErrTopic) {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want ErrTopic", topic, pod, model, err)
		}
	}
}

func FuzzParseTopic(f *testing.F) {
	f.Add("kv@pod@org/model@x")
	f.Fuzz(func(t *testing.T, topic string) {
		pod, model, err := ParseTopic(topic)
		if err != nil {
			return
		}
		if pod == "" || model == "" || "kv@"+pod+"@"+model != topic {
			t.Fatalf("ParseTopic(%q) = %q, %q: does not rebuild the topic", topic, pod, model)
		}
	})
}

func TestTopicsCache(t *testing.T) {
	var c Topics
	frame := []byte("kv@pod-3@org/m@v1")
	for range 2 {
		pod, model, err := c.Parse(frame)
		if err != nil || pod != "pod-3" || model != "org/m@v1" {
			t.Fatalf("Parse = %q, %q, %v", pod, model, err)
		}
	}
	if allocs := testing.AllocsPerRun(50, func() { _, _, _ = c.Parse(frame) }); allocs != 0 {
		t.Errorf("cached Parse allocates %v times", allocs)
	}
	if _, _, err := c.Parse([]byte("kv@only-pod")); !errors.Is(err, ErrTopic) {
		t.Errorf("bad topic: err = %v", err)
	}
	if len(c.m) != 1 {
		t.Errorf("cache holds %d topics, want 1 (bad ones are not cached)", len(c.m))
	}
}
