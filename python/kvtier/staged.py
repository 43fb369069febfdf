"""Slots without the shared arena, for a tenant's connection (docs/security.md#tenants).

A daemon with tenants gives a connection that presents a tenant's token no
arena: the shared memory holds every tenant's chunks. The connectors are
written against slots (PREPARE_STORE, COMMIT_STORE, PREPARE_RETRIEVE,
RELEASE), so a client without the arena keeps that interface and stages the
bytes in its own memory instead: a store's slots are private buffers that
COMMIT sends with STORE, and a retrieve reads the chunks with RETRIEVE into
private buffers that RELEASE drops. Leases are the client's own; the bytes
are copied once more than through the arena, and nothing else changes.
"""

from __future__ import annotations

import struct
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import protocol as p

OP_STORE = 13
OP_RETRIEVE = 14


class Staging:
    """The staged leases of one client: lease id -> (keys, buffers)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next_lease = 1
        self._next_offset = 0
        self._leases: Dict[int, Tuple[Optional[p.Keys], List[torch.Tensor], List[int]]] = {}
        self._views: Dict[int, torch.Tensor] = {}

    def hold(self, keys: Optional[p.Keys], buffers: List[torch.Tensor]) -> Tuple[int, List[p.Slot]]:
        """A new lease over buffers; each gets a slot whose offset names it."""
        if not buffers:
            return 0, []
        with self._lock:
            lease = self._next_lease
            self._next_lease += 1
            slots, offsets = [], []
            for b in buffers:
                off = self._next_offset
                self._next_offset += max(1, b.numel())
                self._views[off] = b
                offsets.append(off)
                slots.append(p.Slot(off, b.numel(), p.SLOT_WRITE))
            self._leases[lease] = (keys, buffers, offsets)
            return lease, slots

    def view(self, slot: p.Slot) -> torch.Tensor:
        with self._lock:
            b = self._views.get(slot.offset)
        if b is None or b.numel() != slot.length:
            raise p.ProtocolError(f"slot at {slot.offset} is not one of this client's staged slots")
        return b

    def take(self, lease: int):
        """Ends lease and returns (keys, buffers), or None when it is unknown."""
        with self._lock:
            held = self._leases.pop(lease, None)
            if held is None:
                return None
            for off in held[2]:
                self._views.pop(off, None)
            return held[0], held[1]

    def count(self, lease: int) -> Optional[int]:
        """How many slots lease holds, or None when it is unknown."""
        with self._lock:
            held = self._leases.get(lease)
            return None if held is None else len(held[1])

    def clear(self) -> None:
        with self._lock:
            self._leases.clear()
            self._views.clear()


def prepare_store(client, keys: p.Keys, sizes: Sequence[int]) -> p.Slots:
    lease, slots = client._staging.hold(keys, [torch.empty(int(s), dtype=torch.uint8) for s in sizes])
    return p.Slots(lease, 0, slots)


def commit_store(client, lease: int, count: int) -> int:
    held = client._staging.take(lease)
    if held is None:
        from .client import NotFound
        raise NotFound(p.OP_COMMIT_STORE, 3, f"lease {lease} is unknown or released")
    keys, buffers = held
    chunks = buffers[:max(0, min(count, len(buffers)))]
    if not chunks:
        return 0
    meta = keys.pack() + p.pack_counted_u32([c.numel() for c in chunks])
    frames = [(meta, p.FLAG_MORE)]
    frames += [(memoryview(c.numpy()), p.FLAG_MORE if i + 1 < len(chunks) else 0) for i, c in enumerate(chunks)]
    body, _ = exchange(client, OP_STORE, frames)
    return p.unpack_u32(body, "store reply")


def prepare_retrieve(client, keys: p.Keys) -> p.Slots:
    body, data = exchange(client, OP_RETRIEVE, [(keys.pack(), 0)], read_data=len(keys.items))
    if len(body) < 8:
        raise p.ProtocolError(f"retrieve reply of {len(body)} bytes")
    tokens, n = struct.unpack_from("<II", body)
    if len(body) != 8 + 4 * n or n != len(data):
        client._break()
        raise p.ProtocolError(f"retrieve reply: {n} sizes in {len(body)} bytes for {len(data)} chunks")
    sizes = struct.unpack_from(f"<{n}I", body, 8)
    if any(len(d) != s for d, s in zip(data, sizes)):
        client._break()
        raise p.ProtocolError("retrieve: a chunk's length differs from its announced size")
    lease, slots = client._staging.hold(None, [torch.frombuffer(d, dtype=torch.uint8) if len(d) else
                                               torch.empty(0, dtype=torch.uint8) for d in data])
    return p.Slots(lease, tokens, slots)


def release(client, lease: int) -> None:
    if client._staging.take(lease) is None:
        from .client import NotFound
        raise NotFound(p.OP_RELEASE, 3, f"lease {lease} is unknown or released")


def exchange(client, op: int, frames: Sequence[Tuple[bytes, int]], read_data: int = 0):
    """Sends request frames ((body, flags) each) on client's socket, then
    reads the reply and, when it says MORE, up to read_data data frames.
    Returns (body, data). A broken or confused stream closes the client."""
    from .client import ConnectionLost, status_error
    with client._lock:
        sock = client._sock
        if sock is None:
            raise ConnectionLost("kvtier: client is closed")
        rid = client._next_id
        client._next_id = (client._next_id + 1) & 0xFFFFFFFF or 1
        try:
            for body, flags in frames:
                sock.sendall(p.pack_header(len(body), op, rid, flags))
                if len(body):
                    sock.sendall(body)
            h, body = _read_frame(client, op, rid, p.MAX_META_BODY)
            if h.status != 0:
                raise status_error(op, h.status, body)
            data: List[bytearray] = []
            more = bool(h.flags & p.FLAG_MORE)
            while more:
                if len(data) >= read_data:
                    raise p.ProtocolError("the daemon sent more data frames than it announced")
                dh, chunk = _read_frame(client, op, rid, p.MAX_CHUNK_BODY)
                data.append(chunk)
                more = bool(dh.flags & p.FLAG_MORE)
            return body, data
        except (OSError, p.ProtocolError) as e:
            client._break()
            if isinstance(e, ConnectionLost):
                raise
            raise ConnectionLost(f"kvtier: op {op}: {e}") from e


def _read_frame(client, op: int, rid: int, limit: int):
    h = p.unpack_header(client._recv_exact(p.HEADER_SIZE))
    if h.length > limit:
        raise p.ProtocolError(f"reply frame of {h.length} bytes, limit {limit}")
    if h.op != op or h.request_id != rid or not h.flags & p.FLAG_REPLY:
        raise p.ProtocolError(f"reply (op {h.op}, id {h.request_id}) does not match request (op {op}, id {rid})")
    return h, bytearray(client._recv_exact(h.length))
