package kvevents

import (
	"errors"
	"fmt"
	"strings"
)

// ErrTopic reports a topic that does not follow llm-d's "kv@<pod>@<model>".
var ErrTopic = errors.New("kvevents: bad topic")

// topicPrefix is the first component of llm-d's topic convention.
const topicPrefix = "kv"

// ParseTopic splits a topic of the form "kv@<pod-id>@<model>". The pod id is
// what lies between the first and second '@'; everything after the second
// '@' is the model, which may itself contain '@' or '/'
// ("org/model@rev"). Pod and model must be non-empty.
func ParseTopic(topic string) (pod, model string, err error) {
	prefix, rest, ok := strings.Cut(topic, "@")
	if !ok {
		return "", "", fmt.Errorf("%w %q: want kv@<pod>@<model>, found no '@'", ErrTopic, topic)
	}
	if prefix != topicPrefix {
		return "", "", fmt.Errorf("%w %q: want prefix %q, got %q", ErrTopic, topic, topicPrefix, prefix)
	}
	pod, model, ok = strings.Cut(rest, "@")
	if !ok {
		return "", "", fmt.Errorf("%w %q: want kv@<pod>@<model>, found no '@' after the pod id", ErrTopic, topic)
	}
	if pod == "" {
		return "", "", fmt.Errorf("%w %q: empty pod id", ErrTopic, topic)
	}
	if model == "" {
		return "", "", fmt.Errorf("%w %q: empty model", ErrTopic, topic)
	}
	return pod, model, nil
}

// maxTopics bounds a Topics cache; a publisher fleet has a handful of topics.
const maxTopics = 4096

type parsedTopic struct{ pod, model string }

// Topics caches parsed topics so that the per-message lookup on a raw topic
// frame does not allocate once a topic has been seen. The zero value is
// ready to use; it is not safe for concurrent use.
type Topics struct {
	m map[string]parsedTopic
}

// Parse is ParseTopic for a topic frame, served from the cache when possible.
// Malformed topics are not cached.
func (t *Topics) Parse(topic []byte) (pod, model string, err error) {
	if p, ok := t.m[string(topic)]; ok {
		return p.pod, p.model, nil
	}
	s := string(topic)
	if pod, model, err = ParseTopic(s); err != nil {
		return "", "", err
	}
	if t.m == nil {
		t.m = make(map[string]parsedTopic)
	}
	if len(t.m) < maxTopics {
		t.m[s] = parsedTopic{pod, model}
	}
	return pod, model, nil
}
