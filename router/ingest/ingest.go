// Package ingest feeds vLLM's KV-cache events into kvtier's router block
// index: it is the glue between the ZMQ sockets the engines publish on and
// index.Index.
//
// A Subscriber runs one goroutine per configured pod endpoint. Each goroutine
// owns a ZMQ SUB socket (github.com/go-zeromq/zmq4, pure Go), decodes every
// three-frame message with kvevents and applies its events to the index:
//
//   - BlockStored adds the blocks to the pod in the tier named by the event's
//     medium (see TierOf) and the KV-cache group named by its group_idx
//     (none means group 0; see index.GroupKey); events on a medium that maps
//     to no tier, or with a group_idx out of range, are counted as Skipped
//     and ignored;
//   - BlockRemoved removes them from that tier and group;
//   - AllBlocksCleared clears what this endpoint announced for the pod.
//
// The pod is the one named by the topic ("kv@<pod>@<model>", llm-d's
// convention) or, when the topic does not follow it (vLLM's default topic is
// empty), the pod configured for the endpoint.
//
// Sequence numbers are followed per (pod, data-parallel rank). When messages
// were lost and the endpoint has a replay address, the missing range is
// fetched from vLLM's replay ROUTER socket over a DEALER socket and applied
// in order before the message that revealed the gap. Messages that stay
// lost (no replay address, a failed replay, a malformed payload) may have
// removed blocks, so the pod's entries are dropped and rebuilt from its
// next events: a pod is under-scored for a while rather than credited with
// KV it no longer holds. When the sequence goes backwards the publisher
// restarted: vLLM restarts with an empty GPU prefix cache and does not
// announce that with AllBlocksCleared, so the pod's entries are cleared.
//
// Clearing is per source: one pod can be reported by several endpoints —
// vLLM for its GPU blocks, the node's kvtier daemon for the chunks in its
// RAM and disk tiers (kv_events_endpoint) — and a clear, a loss or a
// restart on one endpoint drops only the tiers that endpoint announced.
// With data parallelism, ranks of one pod on one endpoint share those
// tiers, so a restart of one rank also clears what the other ranks
// announced; give ranks distinct pod names if that matters.
//
// Bad input never stops a stream: malformed frames, topics or payloads are
// counted per pod and skipped. Reconnection after a publisher restart is
// left to zmq4's automatic reconnect (tested in this package).
package ingest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvtier/router/index"
)

// Endpoint is one publisher to subscribe to.
type Endpoint struct {
	// Pod names the pod when a message's topic does not; required.
	Pod string
	// Model is the model the pod serves; scores for other models skip the
	// pod. A topic of the form kv@<pod>@<model> overrides it.
	Model string
	// Address is the PUB socket, e.g. "tcp://10.0.0.7:5557"; required.
	Address string
	// Replay is vLLM's replay ROUTER socket, e.g. "tcp://10.0.0.7:5558";
	// empty disables replay, and a gap drops the pod's entries.
	Replay string
	// Topic is the subscription prefix; empty subscribes to everything
	// (vLLM's default topic is empty; llm-d publishes under "kv@").
	Topic string
	// FixedPod credits every message to Pod without parsing its topic:
	// a kvtier daemon's chunk stream, whose topic is not llm-d's
	// convention, and whose pod a topic must not be able to change.
	FixedPod bool
	// Shared marks a FixedPod stream that is its pod's only source, in an
	// index shared with other controller replicas that follow the same
	// stream (docs/cluster.md, "High availability"). A clear, a loss or
	// a restart then drops every tier of the pod, including entries
	// written before this subscription (by another replica, or an
	// earlier process); and stopping the stream leaves the entries in
	// place, since the other replicas still follow it: whoever drops the
	// pod for good clears it.
	Shared bool
}

// Config configures a Subscriber.
type Config struct {
	Endpoints []Endpoint
	// ReplayTimeout bounds one replay request, from dialing to the end
	// marker; 0 means DefaultReplayTimeout.
	ReplayTimeout time.Duration
	// ReconnectInterval is the pause between dial attempts; 0 means
	// DefaultReconnectInterval.
	ReconnectInterval time.Duration
	// OnResync, when set, is told that what pod's stream announced is
	// unknown and a full inventory would rebuild it: the stream's first
	// message (the subscriber joined a publisher already running), a
	// loss that replay did not fill, or a publisher restart. It runs on
	// the stream's goroutine: it must return at once.
	OnResync func(pod string, reason string)
}

// Defaults for Config.
const (
	DefaultReplayTimeout     = 2 * time.Second
	DefaultReconnectInterval = 100 * time.Millisecond
)

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("ingest: bad config")

// PodStats are the counters of one pod. Messages and events are counted as
// received, including replayed ones.
type PodStats struct {
	Messages       uint64 // messages received (live and replayed)
	Events         uint64 // events applied
	BlocksAdded    uint64 // block hashes passed to Index.Add
	BlocksRemoved  uint64 // block hashes passed to Index.Remove
	Clears         uint64 // AllBlocksCleared events applied
	Malformed      uint64 // messages skipped as undecodable
	Skipped        uint64 // events ignored: unknown kind, medium or group
	Gaps           uint64 // sequence gaps seen
	Replays        uint64 // replay requests that completed
	ReplayFailures uint64 // replay requests that failed or timed out
	Lost           uint64 // messages missed and not recovered by replay
	Restarts       uint64 // publisher restarts seen (pod cleared)
	IndexErrors    uint64 // Add/Remove calls the index refused
}

// podCounters is the shared, atomically updated form of PodStats.
type podCounters struct {
	messages, events, blocksAdded, blocksRemoved, clears, malformed, skipped,
	gaps, replays, replayFailures, lost, restarts, indexErrors atomic.Uint64
}

func (c *podCounters) snapshot() PodStats {
	return PodStats{
		Messages: c.messages.Load(), Events: c.events.Load(),
		BlocksAdded: c.blocksAdded.Load(), BlocksRemoved: c.blocksRemoved.Load(),
		Clears: c.clears.Load(), Malformed: c.malformed.Load(), Skipped: c.skipped.Load(),
		Gaps: c.gaps.Load(), Replays: c.replays.Load(), ReplayFailures: c.replayFailures.Load(),
		Lost: c.lost.Load(), Restarts: c.restarts.Load(), IndexErrors: c.indexErrors.Load(),
	}
}

// counterSet maps pod names to their counters; streams cache the pointers.
type counterSet struct {
	mu   sync.Mutex
	pods map[string]*podCounters
}

func (s *counterSet) get(pod string) *podCounters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.pods[pod]
	if !ok {
		if s.pods == nil {
			s.pods = make(map[string]*podCounters)
		}
		c = new(podCounters)
		s.pods[pod] = c
	}
	return c
}

func (s *counterSet) snapshot() map[string]PodStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]PodStats, len(s.pods))
	for name, c := range s.pods {
		out[name] = c.snapshot()
	}
	return out
}

// TierOf maps an event's medium to an index tier: "" (nil, vLLM's default)
// and "GPU" → GPU, "CPU" → CPU, "DISK" → Disk, case-insensitively. Any
// other medium (a connector's own name) reports false: such events are
// skipped and counted rather than guessed into Remote, because a wrong tier
// would skew tier-weighted scoring.
func TierOf(medium string) (index.Tier, bool) {
	switch {
	case medium == "" || strings.EqualFold(medium, "GPU"):
		return index.GPU, true
	case strings.EqualFold(medium, "CPU"):
		return index.CPU, true
	case strings.EqualFold(medium, "DISK"):
		return index.Disk, true
	}
	return 0, false
}

func (c *Config) validate() error {
	for i, ep := range c.Endpoints {
		if ep.Pod == "" {
			return fmt.Errorf("%w: endpoint %d (%q) has no pod name", ErrConfig, i, ep.Address)
		}
		if ep.Address == "" {
			return fmt.Errorf("%w: endpoint %d (pod %q) has no address", ErrConfig, i, ep.Pod)
		}
		for _, addr := range []string{ep.Address, ep.Replay} {
			if _, err := guarded(addr); addr != "" && err != nil {
				return fmt.Errorf("pod %q: %w", ep.Pod, err)
			}
		}
	}
	if c.ReplayTimeout < 0 || c.ReconnectInterval < 0 {
		return fmt.Errorf("%w: negative duration", ErrConfig)
	}
	return nil
}
