"""A client of another node's daemon over its TCP port (docs/protocol.md).

The vLLM connector talks to its own daemon through the local socket, where
chunk bytes never leave shared memory. Prefill/decode disaggregation also
needs the *other* node's daemon: a producer stores the chunks it saved into
the consumer's daemon, and a consumer fetches chunks from the producer's.
Over TCP the bytes travel in data frames (``STORE`` and ``RETRIEVE``), one
chunk per frame.

Every socket operation has a timeout, and every reply is checked: a peer that
dies, stalls or sends garbage becomes :class:`~kvtier.client.ConnectionLost`
or :class:`~kvtier.protocol.ProtocolError`, never a hang.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import List, Optional, Sequence, Tuple

from . import protocol as p
from .client import ConnectionLost, status_error

OP_STORE = 13
OP_RETRIEVE = 14


def parse_addr(addr: str) -> Tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a tuple; ValueError names what is wrong."""
    host, sep, port = str(addr).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"daemon address {addr!r}: want host:port")
    return host.strip("[]"), int(port)


class Peer:
    """One TCP connection to a daemon: HELLO, SCOPE, LOOKUP, STORE, RETRIEVE, PUSH_STATUS.

    Safe to share between threads: one request is in flight at a time.
    """

    def __init__(self, addr: str, token: str = "", timeout: float = 5.0, name: str = "kvtier-python-peer"):
        self.addr, self.timeout = addr, timeout
        self._lock = threading.Lock()
        self._next_id = 1
        self._scopes: dict = {}
        self._sock: Optional[socket.socket] = None  # close() works whatever fails below
        host, port = parse_addr(addr)
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            body = self._call(p.OP_HELLO, p.pack_hello(name, token))
        except OSError as e:
            self.close()
            raise ConnectionLost(f"kvtier: connecting to daemon {addr}: {e}") from e
        except BaseException:
            self.close()
            raise
        self.hello = p.unpack_hello_reply(body)
        if self.hello.version != p.VERSION:
            self.close()
            raise p.ProtocolError(f"daemon {addr} speaks protocol version {self.hello.version}, want {p.VERSION}")

    @property
    def chunk_tokens(self) -> int:
        return self.hello.chunk_tokens

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- framing

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionLost(f"kvtier: daemon {self.addr} closed the connection")
            got += k
        return buf

    def _read_frame(self, op: int, rid: int, limit: int) -> Tuple[p.Header, bytearray]:
        h = p.unpack_header(bytes(self._recv_exact(p.HEADER_SIZE)))
        if h.length > limit:
            raise p.ProtocolError(f"reply frame of {h.length} bytes, limit {limit}")
        if h.op != op or h.request_id != rid or not h.flags & p.FLAG_REPLY:
            raise p.ProtocolError(f"reply (op {h.op}, id {h.request_id}) does not match request (op {op}, id {rid})")
        return h, self._recv_exact(h.length)

    def _exchange(self, op: int, frames: Sequence[Tuple[bytes, int]], read_data: int = 0):
        """Sends request frames ((body, flags) each), reads the reply and up to
        ``read_data`` data frames if the reply says MORE. Returns (body, data)."""
        with self._lock:
            if self._sock is None:
                raise ConnectionLost(f"kvtier: connection to {self.addr} is closed")
            rid = self._next_id
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF or 1
            try:
                for body, flags in frames:
                    self._sock.sendall(p.pack_header(len(body), op, rid, flags))
                    if len(body):
                        self._sock.sendall(body)
                h, body = self._read_frame(op, rid, p.MAX_META_BODY)
                if h.status != 0:
                    raise status_error(op, h.status, bytes(body))
                data: List[bytearray] = []
                more = bool(h.flags & p.FLAG_MORE)
                while more:
                    if len(data) >= read_data:
                        raise p.ProtocolError(f"daemon {self.addr} sent more data frames than it announced")
                    dh, chunk = self._read_frame(op, rid, p.MAX_CHUNK_BODY)
                    data.append(chunk)
                    more = bool(dh.flags & p.FLAG_MORE)
                return body, data
            except (OSError, p.ProtocolError) as e:
                self.close()
                if isinstance(e, ConnectionLost):
                    raise
                raise ConnectionLost(f"kvtier: daemon {self.addr}: op {op}: {e}") from e

    def _call(self, op: int, body: bytes) -> bytearray:
        return self._exchange(op, [(body, 0)])[0]

    # ----- operations

    def scope(self, model: str, fmt: str, world_size: int = 1, rank: int = 0, namespace: str = "") -> int:
        key = (model, fmt, world_size, rank, namespace)
        handle = self._scopes.get(key)
        if handle is None:
            body = self._call(p.OP_SCOPE, p.pack_scope(world_size, rank, model, fmt, namespace))
            handle = self._scopes[key] = p.unpack_u32(bytes(body), "scope reply")
        return handle

    def tokens(self, scope: int, tokens: Sequence[int], skip: int = 0) -> p.Keys:
        return p.Keys(scope, p.KIND_TOKENS, tokens, skip)

    def hashes(self, scope: int, hashes: Sequence[bytes]) -> p.Keys:
        return p.Keys(scope, p.KIND_HASHES, hashes)

    def lookup(self, keys: p.Keys) -> p.LookupReply:
        return p.unpack_lookup_reply(bytes(self._call(p.OP_LOOKUP, p.pack_lookup(keys, 0))))

    def store(self, keys: p.Keys, chunks: Sequence[memoryview]) -> int:
        """Stores whole chunks (bytes-like, one per key after the skip); returns how many the daemon kept."""
        meta = keys.pack() + p.pack_counted_u32([len(c) for c in chunks])
        frames = [(meta, p.FLAG_MORE if chunks else 0)]
        frames += [(c, p.FLAG_MORE if i + 1 < len(chunks) else 0) for i, c in enumerate(chunks)]
        return p.unpack_u32(bytes(self._exchange(OP_STORE, frames)[0]), "store reply")

    def push_status(self, transfer: int) -> p.PushStatus:
        """Where a transfer this daemon pushes stands (NotFound: it never saw it, or forgot it)."""
        return p.unpack_push_status(bytes(self._call(p.OP_PUSH_STATUS, p.pack_push_status(transfer))))

    def retrieve(self, keys: p.Keys) -> Tuple[int, List[bytearray]]:
        """(tokens covered, chunk bytes) of the leading cached chunks after the skip."""
        body, data = self._exchange(OP_RETRIEVE, [(keys.pack(), 0)], read_data=len(keys.items))
        tokens, sizes = _unpack_sizes(body)
        if len(sizes) != len(data) or any(len(d) != s for d, s in zip(data, sizes)):
            self.close()
            raise ConnectionLost(f"kvtier: daemon {self.addr}: retrieve sent {len(data)} chunks "
                                 f"not matching the {len(sizes)} sizes it announced")
        return tokens, data


def _unpack_sizes(body: bytes) -> Tuple[int, List[int]]:
    if len(body) < 8:
        raise p.ProtocolError(f"retrieve reply of {len(body)} bytes")
    tokens, n = struct.unpack_from("<II", body)
    if len(body) != 8 + 4 * n:
        raise p.ProtocolError(f"retrieve reply: {n} sizes in a body of {len(body)} bytes")
    return tokens, list(struct.unpack_from(f"<{n}I", body, 8))
