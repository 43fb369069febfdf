// Package kvevents decodes the KV-cache events that vLLM publishes, the first
// step of kvtier's KV-aware router (the counterpart of llm-d's kv-cache
// indexer).
//
// vLLM's ZmqEventPublisher sends each batch as three ZMQ frames: a topic
// (llm-d's convention is "kv@<pod-id>@<model>"), an 8-byte big-endian
// sequence number and a msgpack-encoded EventBatch. This package works on
// those byte frames only; sockets live elsewhere. It provides:
//
//   - ParseTopic and DecodeMessage for the frames of one published message;
//   - Decoder, which turns a payload into a reusable, flat Batch (all block
//     hashes of all events in one []uint64, all token ids in one []uint32) so
//     that steady-state decoding allocates nothing per block;
//   - Sequencer, which watches the sequence numbers of one (pod, DP rank)
//     stream and reports gaps and publisher restarts;
//   - helpers for the frames of vLLM's replay ROUTER socket.
//
// The payload is parsed by a small hand-written msgpack reader rather than a
// general msgpack library: it reads straight from the payload slice, bounds
// every length prefix by the bytes that remain (a lying prefix cannot cause a
// huge allocation), compares field names without converting them to strings,
// and measured faster than github.com/vmihailenco/msgpack's low-level
// Decoder (see BenchmarkHashArray*). That library is used in the tests to
// build independent fixtures.
package kvevents
