// Package kvevents is vLLM's KV-cache event format: the messages a serving
// engine publishes when blocks enter or leave its prefix cache, which
// kvtier's router reads (the counterpart of llm-d's kv-cache indexer) and
// kvtier's daemon writes for what its RAM and disk tiers hold. Encoder and
// decoder live together so that they cannot drift apart.
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
//   - Encoder, which writes a Batch back as a payload in either event
//     encoding vLLM has used (Map, current; Array, before mid-2026), in the
//     shape vLLM's msgspec structs and llm-d's decoder expect;
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
// build independent fixtures and to read payloads the way llm-d does.
package kvevents
