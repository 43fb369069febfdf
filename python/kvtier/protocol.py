"""Encoding and decoding of kvtier's binary cache protocol (docs/protocol.md).

This module is pure byte work with no sockets, so every layout rule of the
protocol lives in one place and can be tested without a daemon. The Go
package ``wire`` is the reference; field names here follow it.

All integers are little-endian. Decoders check every length and raise
:class:`ProtocolError` rather than returning half-parsed values, because the
bytes come from another process.
"""

from __future__ import annotations

import array
import struct
import sys
from dataclasses import dataclass, field
from typing import List, Sequence

HEADER = struct.Struct("<IBBHII")
HEADER_SIZE = HEADER.size  # 16
MAGIC = b"KVT1"
VERSION = 1
MAX_META_BODY = 8 << 20
MAX_CHUNK_BODY = 1 << 30
MAX_STRING = 1 << 10

FLAG_REPLY = 1
FLAG_MORE = 2

# Operations (values are part of the protocol).
OP_HELLO = 1
OP_PING = 2
OP_SCOPE = 3
OP_LOOKUP = 4
OP_PREPARE_STORE = 5
OP_COMMIT_STORE = 6
OP_PREPARE_RETRIEVE = 7
OP_RELEASE = 8
OP_RENEW = 9
OP_PREFETCH = 10
OP_CLEAR = 11
OP_STATS = 12
OP_FLUSH = 16
OP_PUSH = 17         # prefill/decode transfer, docs/disaggregation.md
OP_PUSH_STATUS = 18
OP_RECEIVE = 19      # daemon to daemon only
OP_WAIT = 20
OP_LOOKUP_BATCH = 21  # many LOOKUPs in one round trip
OP_REQUEST_BUFFER = 22  # shared memory for the token ids of lookups
OP_PREPARE_RETRIEVE_LAYERS = 23  # layer by layer, docs/layerwise.md
OP_LAYER_WAIT = 24
OP_STORE_LAYER = 26  # one-way: one layer of a store lease is final, docs/layerwise.md

ALL_LAYERS = 0xFFFFFFFF  # LAYER_WAIT: nothing loads in the background
MAX_LAYERS = 1 << 16

MAX_BATCH = 1024  # lookups in one LOOKUP_BATCH

TRANSFER_PENDING = 0
TRANSFER_DONE = 1
TRANSFER_FAILED = 2
TRANSFER_STATES = {TRANSFER_PENDING: "pending", TRANSFER_DONE: "done", TRANSFER_FAILED: "failed"}

# Key kinds.
KIND_TOKENS = 0
KIND_HASHES = 1
KIND_SHARED = 3  # token ids in the connection's request buffer

MIN_REQUEST_BUFFER = 4 << 10
MAX_REQUEST_BUFFER = MAX_META_BODY

# Slot states.
SLOT_WRITE = 0
SLOT_STORED = 1

STATUS_NAMES = {
    0: "OK", 1: "BAD_REQUEST", 2: "UNKNOWN_OP", 3: "NOT_FOUND", 4: "NO_SPACE",
    5: "UNAUTHORIZED", 6: "UNSUPPORTED", 7: "SHUTTING_DOWN", 8: "INTERNAL",
    9: "TOO_LARGE",
}


class ProtocolError(Exception):
    """The daemon sent bytes that do not follow the protocol."""


@dataclass
class Header:
    length: int
    op: int
    flags: int
    request_id: int
    status: int


def pack_header(length: int, op: int, request_id: int, flags: int = 0, status: int = 0) -> bytes:
    return HEADER.pack(length, op, flags, 0, request_id, status)


def unpack_header(b: bytes) -> Header:
    length, op, flags, reserved, rid, status = HEADER.unpack(b)
    if reserved != 0:
        raise ProtocolError("frame header: reserved bytes are not zero")
    if status not in STATUS_NAMES:
        raise ProtocolError(f"frame header: unknown status {status}")
    return Header(length, op, flags, rid, status)


def frame(op: int, request_id: int, body: bytes) -> bytes:
    """A whole request frame: header then body."""
    if len(body) > MAX_META_BODY:
        raise ValueError(f"{len(body)}-byte body is over the protocol's {MAX_META_BODY}-byte limit")
    return pack_header(len(body), op, request_id) + body


def pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > MAX_STRING:
        raise ValueError(f"string of {len(b)} bytes is over the protocol's {MAX_STRING}-byte limit")
    return struct.pack("<H", len(b)) + b


@dataclass
class Keys:
    """The key block of a keyed request: token ids (kind 0) or 16-byte hashes (kind 1)."""

    scope: int
    kind: int
    items: Sequence  # token ids (ints) or 16-byte hashes
    skip: int = 0

    def pack(self) -> bytes:
        head = struct.pack("<IB3xII", self.scope, self.kind, self.skip, len(self.items))
        if self.kind == KIND_TOKENS:
            return head + pack_u32_array(self.items)
        if self.kind == KIND_HASHES:
            for h in self.items:
                if len(h) != 16:
                    raise ValueError(f"hash key of {len(h)} bytes, want 16")
            return head + b"".join(bytes(h) for h in self.items)
        raise ValueError(f"unsupported key kind {self.kind}")


def pack_shared_keys(scope: int, offset: int, count: int, skip: int = 0) -> bytes:
    """Keys of kind 3: count token ids at byte offset of the request buffer."""
    if offset % 4:
        raise ValueError(f"shared tokens at offset {offset}, not a multiple of 4")
    return struct.pack("<IB3xIIQ", scope, KIND_SHARED, skip, count, offset)


def pack_u32_array(values: Sequence[int]) -> bytes:
    """Packs u32s without a count. An ``array('I')`` (as the vLLM connector keeps
    prompts) is used as is; anything else is converted once, range-checked."""
    if isinstance(values, array.array) and values.typecode == "I" and values.itemsize == 4:
        return values.tobytes() if sys.byteorder == "little" else _swapped(values)
    try:
        arr = array.array("I", values)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"token id out of the u32 range: {e}") from e
    if arr.itemsize != 4:
        raise ValueError("this platform's unsigned int is not 4 bytes")
    return arr.tobytes() if sys.byteorder == "little" else _swapped(arr)


def _swapped(arr: "array.array") -> bytes:
    other = array.array(arr.typecode, arr)
    other.byteswap()
    return other.tobytes()


def pack_counted_u32(values: Sequence[int]) -> bytes:
    return struct.pack("<I", len(values)) + pack_u32_array(values)


def pack_hello(name: str, token: str = "") -> bytes:
    return MAGIC + struct.pack("<HH", VERSION, 0) + pack_str(token) + pack_str(name)


def pack_scope(world_size: int, rank: int, model: str, fmt: str, namespace: str = "") -> bytes:
    return struct.pack("<II", world_size, rank) + pack_str(model) + pack_str(fmt) + pack_str(namespace)


def pack_lookup(keys: Keys, lease_ms: int) -> bytes:
    return struct.pack("<I", lease_ms) + keys.pack()


def pack_lookup_batch(lookups: Sequence) -> bytes:
    """A LOOKUP_BATCH body from (keys, lease_ms) pairs, 1 to MAX_BATCH of them."""
    if not 0 < len(lookups) <= MAX_BATCH:
        raise ValueError(f"a batch of {len(lookups)} lookups; 1 to {MAX_BATCH} are allowed")
    return struct.pack("<I", len(lookups)) + b"".join(pack_lookup(k, lease) for k, lease in lookups)


def pack_prepare_store(keys: Keys, sizes: Sequence[int], lease_ms: int) -> bytes:
    return struct.pack("<I", lease_ms) + keys.pack() + pack_counted_u32(sizes)


def pack_prepare_retrieve(keys: Keys, lease_ms: int) -> bytes:
    return struct.pack("<I", lease_ms) + keys.pack()


def pack_commit(lease: int, count: int) -> bytes:
    return struct.pack("<QI", lease, count)


def pack_release(lease: int) -> bytes:
    return struct.pack("<Q", lease)


def pack_renew(lease: int, ms: int) -> bytes:
    return struct.pack("<QI", lease, ms)


def pack_clear(scope: int) -> bytes:
    return struct.pack("<I", scope)


def pack_flush(timeout_ms: int) -> bytes:
    return struct.pack("<I", timeout_ms)


def pack_push(transfer: int, dest: str, keys: Keys, timeout_ms: int = 0, last: bool = False,
              store_lease: int = 0) -> bytes:
    if transfer <= 0:
        raise ValueError("transfer id must be above 0")
    flags = (1 if last else 0) | (2 if store_lease else 0)
    body = struct.pack("<QIB3x", transfer, timeout_ms, flags) + pack_str(dest) + keys.pack()
    return body + struct.pack("<Q", store_lease) if store_lease else body


def pack_push_status(transfer: int) -> bytes:
    return struct.pack("<Q", transfer)


def pack_wait(keys: Keys, timeout_ms: int, least: int = 0) -> bytes:
    return struct.pack("<II", timeout_ms, least) + keys.pack()


class _Reader:
    """Reads fixed fields off a body, failing loudly on short or long bodies."""

    def __init__(self, body: bytes, what: str):
        self.body, self.pos, self.what = memoryview(body), 0, what

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.body):
            raise ProtocolError(f"{self.what}: body of {len(self.body)} bytes is too short")
        p = self.body[self.pos:self.pos + n]
        self.pos += n
        return p

    def unpack(self, fmt: str):
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size))

    def string(self) -> str:
        (n,) = self.unpack("H")
        if n > MAX_STRING:
            raise ProtocolError(f"{self.what}: string of {n} bytes, limit {MAX_STRING}")
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"{self.what}: string is not UTF-8: {e}") from None

    def end(self) -> None:
        if self.pos != len(self.body):
            raise ProtocolError(f"{self.what}: {len(self.body) - self.pos} trailing bytes")


@dataclass
class HelloReply:
    version: int
    has_arena: bool
    chunk_tokens: int
    arena_bytes: int
    lease_ms: int
    max_chunk: int


def unpack_hello_reply(body: bytes) -> HelloReply:
    r = _Reader(body, "hello reply")
    version, flags, chunk, arena, lease, max_chunk = r.unpack("HHIQII")
    r.end()
    if flags & ~1:
        raise ProtocolError(f"hello reply: unknown flags {flags:#x}")
    return HelloReply(version, bool(flags & 1), chunk, arena, lease, max_chunk)


@dataclass
class LookupReply:
    tokens: int
    chunks: int
    lease: int
    by_tier: List[int] = field(default_factory=list)


def unpack_lookup_reply(body: bytes) -> LookupReply:
    r = _Reader(body, "lookup reply")
    reply = _lookup_reply_fields(r)
    r.end()
    return reply


@dataclass
class LookupResult:
    """One lookup of a LOOKUP_BATCH: status 0 and the reply, or the error status and message."""
    status: int
    message: str = ""
    reply: LookupReply = None


def _lookup_reply_fields(r: "_Reader") -> LookupReply:
    tokens, chunks, lease, n = r.unpack("IIQB")
    if n > 8:
        raise ProtocolError(f"lookup reply: {n} tiers, limit 8")
    by_tier = list(r.unpack(f"{n}I")) if n else []
    return LookupReply(tokens, chunks, lease, by_tier)


def unpack_lookup_batch_reply(body: bytes) -> List[LookupResult]:
    r = _Reader(body, "lookup batch reply")
    (n,) = r.unpack("I")
    if n > MAX_BATCH or n * 6 > len(body) - 4:
        raise ProtocolError(f"lookup batch reply: {n} results in {len(body)} bytes")
    results = []
    for _ in range(n):
        (status,) = r.unpack("I")
        if status not in STATUS_NAMES:
            raise ProtocolError(f"lookup batch reply: unknown status {status}")
        if status == 0:
            results.append(LookupResult(0, reply=_lookup_reply_fields(r)))
        else:
            results.append(LookupResult(status, message=r.string()))
    r.end()
    return results


@dataclass
class Slot:
    offset: int
    length: int
    state: int


@dataclass
class Slots:
    lease: int
    tokens: int
    slots: List[Slot]


def unpack_slots(body: bytes) -> Slots:
    r = _Reader(body, "slots")
    lease, tokens, n = r.unpack("QII")
    if n * 16 != len(body) - 16:
        raise ProtocolError(f"slots: {n} slots in a body of {len(body)} bytes")
    slots = []
    for _ in range(n):
        off, length, state, _r1, _r2 = r.unpack("QIBBH")
        if _r1 or _r2:
            raise ProtocolError("slot: reserved bytes are not zero")
        if state > SLOT_STORED:
            raise ProtocolError(f"slot: unknown state {state}")
        slots.append(Slot(off, length, state))
    r.end()
    return Slots(lease, tokens, slots)


def unpack_u32(body: bytes, what: str) -> int:
    r = _Reader(body, what)
    (v,) = r.unpack("I")
    r.end()
    return v


def unpack_u64(body: bytes, what: str) -> int:
    r = _Reader(body, what)
    (v,) = r.unpack("Q")
    r.end()
    return v


@dataclass
class FlushTier:
    """One tier below RAM in a FLUSH reply: what of the chunks stored before
    the FLUSH it does not hold yet."""
    name: str
    pending: int  # writes still queued when the daemon's wait ended
    redone: int   # dropped or refused writes the daemon wrote again
    missing: int  # chunks the tier lacks for good


@dataclass
class FlushReply:
    tiers: List[FlushTier]

    @property
    def durable(self) -> bool:
        """Every chunk stored before the FLUSH is in every tier below RAM."""
        return all(t.pending == 0 and t.missing == 0 for t in self.tiers)


def unpack_flush_reply(body: bytes) -> FlushReply:
    r = _Reader(body, "flush reply")
    (n,) = r.unpack("B")
    if n > 8:
        raise ProtocolError(f"flush reply: {n} tiers, limit 8")
    tiers = []
    for _ in range(n):
        name = r.string()
        pending, redone, missing = r.unpack("III")
        tiers.append(FlushTier(name, pending, redone, missing))
    r.end()
    return FlushReply(tiers)


@dataclass
class PushStatus:
    """Where a transfer stands on the daemon pushing it."""
    state: int    # TRANSFER_PENDING, TRANSFER_DONE or TRANSFER_FAILED
    queued: int   # chunks queued in all
    pushed: int   # chunks the destination has stored
    message: str  # why it failed, else empty

    @property
    def done(self) -> bool:
        return self.state == TRANSFER_DONE

    @property
    def failed(self) -> bool:
        return self.state == TRANSFER_FAILED


def unpack_push_status(body: bytes) -> PushStatus:
    r = _Reader(body, "push status reply")
    state, r1, r2, queued, pushed = r.unpack("BBHII")
    if r1 or r2:
        raise ProtocolError("push status reply: reserved bytes are not zero")
    if state not in TRANSFER_STATES:
        raise ProtocolError(f"push status reply: unknown state {state}")
    message = r.string()
    r.end()
    return PushStatus(state, queued, pushed, message)


@dataclass
class WaitReply:
    chunks: int  # leading chunks (after the skip) in the daemon's RAM
    tokens: int  # tokens they cover (token keys; else 0)


def unpack_wait_reply(body: bytes) -> WaitReply:
    r = _Reader(body, "wait reply")
    chunks, tokens = r.unpack("II")
    r.end()
    return WaitReply(chunks, tokens)


def pack_prepare_retrieve_layers(keys: "Keys", layers: int, parts: int, lease_ms: int = 0) -> bytes:
    if not 0 <= layers < MAX_LAYERS or parts not in (0, 1, 2) or (layers == 0) != (parts == 0):
        raise ValueError(f"{layers} layers of {parts} parts: want both 0, or layers and 1 or 2 parts")
    return struct.pack("<IHBB", lease_ms, layers, parts, 0) + keys.pack()


def pack_store_layer(lease: int, layer: int, layers: int = 0, parts: int = 0) -> bytes:
    if (layers == 0) != (parts == 0) or parts not in (0, 1, 2) or not 0 <= layers < MAX_LAYERS:
        raise ValueError(f"{layers} layers of {parts} parts: want both 0, or layers and 1 or 2 parts")
    if not 0 <= layer < (layers or MAX_LAYERS):
        raise ValueError(f"layer {layer} of {layers or MAX_LAYERS}")
    return struct.pack("<QIHBx", lease, layer, layers, parts)


def pack_layer_wait(lease: int, layer: int) -> bytes:
    if not 0 <= layer < MAX_LAYERS:
        raise ValueError(f"layer {layer}: want 0..{MAX_LAYERS - 1}")
    return struct.pack("<QI", lease, layer)


@dataclass
class LayerReady:
    """LAYER_WAIT's reply: the lease's usable slots (from the first) and the
    layers ready in all of them; ``ALL_LAYERS`` when nothing loads in the
    background."""
    usable: int
    ready: int


def unpack_layer_ready(body: bytes) -> LayerReady:
    if len(body) != 8:
        raise ProtocolError(f"layer wait reply of {len(body)} bytes, want 8")
    usable, ready = struct.unpack("<II", body)
    return LayerReady(usable, ready)
