"""Reads one EventBatch payload (hex on stdin) with Debian's msgpack and
checks it against the shape vLLM's msgspec structs decode
(vllm/distributed/kv_events.py): the batch as the array
[ts, events, data_parallel_rank], each event either a tagged array whose
positions follow the struct's field order (releases before PR 42892) or a
map with the tag under "type" (since PR 42892, vLLM 0.26).

On success it prints the events as JSON objects keyed by field name, so the
caller can compare values; on a mismatch it exits 1 naming it.
"""

import json
import sys

import msgpack

# Field order and, for the map form, which fields have no default (msgspec
# refuses a map without them). Old array releases required only the fields
# the first release had; later ones are trailing and may be absent.
STRUCTS = {
    "BlockStored": {
        "fields": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                   "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                   "kv_cache_spec_kind", "kv_cache_spec_sliding_window"],
        "array_required": 5,
        "map_required": {"block_hashes", "parent_block_hash", "token_ids",
                         "block_size", "lora_id", "medium", "lora_name"},
    },
    "BlockRemoved": {
        "fields": ["block_hashes", "medium", "group_idx"],
        "array_required": 1,
        "map_required": {"block_hashes", "medium"},
    },
    "AllBlocksCleared": {"fields": [], "array_required": 0, "map_required": set()},
}


def is_hash(v):
    return (isinstance(v, int) and 0 <= v < 2**64) or isinstance(v, bytes)


def is_opt(kind):
    return lambda v: v is None or isinstance(v, kind)


TYPES = {
    "block_hashes": lambda v: isinstance(v, list) and all(is_hash(h) for h in v),
    "parent_block_hash": lambda v: v is None or is_hash(v),
    "token_ids": lambda v: isinstance(v, list) and all(isinstance(t, int) for t in v),
    "block_size": lambda v: isinstance(v, int),
    "lora_id": is_opt(int),
    "medium": is_opt(str),
    "lora_name": is_opt(str),
    "extra_keys": is_opt(list),
    "group_idx": is_opt(int),
    "kv_cache_spec_kind": is_opt(str),
    "kv_cache_spec_sliding_window": is_opt(int),
}


def fail(msg):
    sys.stderr.write(msg + "\n")
    sys.exit(1)


def event(raw, i):
    if isinstance(raw, list):
        if not raw or raw[0] not in STRUCTS:
            fail(f"event {i}: no known tag first: {raw!r}")
        s = STRUCTS[raw[0]]
        values = raw[1:]
        if len(values) > len(s["fields"]):
            fail(f"event {i}: {len(values)} fields, {raw[0]} has {len(s['fields'])}")
        if len(values) < s["array_required"]:
            fail(f"event {i}: {len(values)} fields, {raw[0]} needs {s['array_required']}")
        fields = dict(zip(s["fields"], values))
        tag = raw[0]
    elif isinstance(raw, dict):
        tag = raw.get("type")
        if tag not in STRUCTS:
            fail(f"event {i}: no known type: {raw!r}")
        s = STRUCTS[tag]
        fields = {k: v for k, v in raw.items() if k != "type"}
        unknown = set(fields) - set(s["fields"])
        if unknown:
            fail(f"event {i}: {tag} has no fields {sorted(unknown)}")
        missing = s["map_required"] - set(fields)
        if missing:
            fail(f"event {i}: {tag} lacks {sorted(missing)}")
    else:
        fail(f"event {i}: neither array nor map: {raw!r}")
    for name, value in fields.items():
        if not TYPES[name](value):
            fail(f"event {i}: {tag}.{name} has the wrong type: {value!r}")
    out = {"type": tag}
    out.update({k: (v.hex() if isinstance(v, bytes) else v) for k, v in fields.items()})
    return out


def main():
    payload = bytes.fromhex(sys.stdin.read().strip())
    batch = msgpack.unpackb(payload, raw=False)
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        fail(f"batch is not [ts, events, data_parallel_rank]: {batch!r}")
    if not isinstance(batch[0], float):
        fail(f"ts is not a float: {batch[0]!r}")
    if not isinstance(batch[1], list):
        fail(f"events is not a list: {batch[1]!r}")
    dp = batch[2] if len(batch) == 3 else None
    if dp is not None and not isinstance(dp, int):
        fail(f"data_parallel_rank is not an int: {dp!r}")
    events = [event(e, i) for i, e in enumerate(batch[1])]
    json.dump({"ts": batch[0], "data_parallel_rank": dp, "events": events}, sys.stdout)


main()
