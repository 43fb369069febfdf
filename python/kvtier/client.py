"""A client of kvtier's local cache protocol (docs/protocol.md).

The daemon shares its RAM arena, a memfd, in the HELLO reply. The client maps
it once and hands out slots as ``torch`` tensors that alias the mapping, so
chunk bytes are written and read in place: the socket only carries small
metadata frames.

Every socket operation has a timeout, so a daemon that died or hangs turns
into :class:`ConnectionLost` within ``timeout`` seconds instead of blocking
the serving engine. After ``ConnectionLost`` the client is closed; make a new
:class:`Client` to reconnect (leases held by the old connection are gone: the
daemon frees them when a connection closes).

A client is safe to share between threads: one request is in flight at a
time, guarded by a lock.
"""

from __future__ import annotations

import array
import ctypes
import json
import logging
import mmap
import os
import socket
import struct
import sys
import threading
from typing import Callable, List, Optional, Sequence, Union

import torch

from . import defaults
from . import protocol as p
from . import staged
from .protocol import Keys, LookupReply, Slot, Slots

DEFAULT_TIMEOUT = defaults.TIMEOUT

log = logging.getLogger("kvtier")
_logged: set = set()


def log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        log.warning(msg)


_libc = None


def _remap_private(addr: int, length: int) -> bool:
    """Maps a fresh memfd of this process's own over the range at addr (MAP_SHARED|MAP_FIXED),
    atomically: the range becomes zero pages no other process sees. A file mapping is not
    charged against the commit limit when mapped (an anonymous writable one of the arena's
    size can fail with ENOMEM under strict overcommit, and a failed MAP_FIXED may already
    have unmapped the range). False when that is not possible."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.mmap.restype = ctypes.c_void_p
            _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
        fd = os.memfd_create("kvtier-detached-arena")
    except (OSError, AttributeError):
        return False
    try:
        os.ftruncate(fd, length)
        got = _libc.mmap(addr, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
    except OSError:
        return False
    finally:
        os.close(fd)  # the mapping keeps the memfd alive
    return got == addr


_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)


class _Copies:
    """``with client.copies:`` around copies into or out of a client's arena slots. Raises
    ConnectionLost when the client is closed; otherwise holds the client's copy lock until
    the copies are issued, so close never starts its hooks in the middle of them."""

    __slots__ = ("_c",)

    def __init__(self, c: "Client"):
        self._c = c

    def __enter__(self) -> None:
        c = self._c
        c._copy_lock.acquire()
        if c.closed:
            c._copy_lock.release()
            raise ConnectionLost("kvtier: client is closed: no copy through its arena")

    def __exit__(self, exc_type, exc, tb) -> None:  # named, not *exc: no tuple per use
        self._c._copy_lock.release()


class KVTierError(Exception):
    """Base of every error this package raises."""


class ConnectionLost(KVTierError, ConnectionError):
    """The daemon is unreachable, closed the connection, or did not answer in time."""


class StatusError(KVTierError):
    """The daemon answered a request with an error status."""

    status = -1

    def __init__(self, op: int, status: int, message: str):
        self.op, self.status, self.message = op, status, message
        super().__init__(f"kvtier: op {op}: {p.STATUS_NAMES.get(status, status)}: {message}")


class BadRequest(StatusError):
    status = 1


class NotFound(StatusError):
    status = 3


class NoSpace(StatusError):
    status = 4


class Unauthorized(StatusError):
    status = 5


class Unsupported(StatusError):
    status = 6


class ShuttingDown(StatusError):
    status = 7


_STATUS_ERRORS = {c.status: c for c in (BadRequest, NotFound, NoSpace, Unauthorized, Unsupported, ShuttingDown)}


def status_error(op: int, status: int, body: bytes) -> StatusError:
    """The exception class matching a reply status, so callers can catch e.g. NotFound."""
    cls = _STATUS_ERRORS.get(status, StatusError)
    return cls(op, status, bytes(body).decode("utf-8", "replace"))


def default_socket_path() -> str:
    """The socket path the daemon uses when none is configured (docs/configuration.md)."""
    return defaults.socket_path()


class Client:
    """One connection to ``kvtier serve`` over its Unix socket, with the arena mapped."""

    def __init__(self, path: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT, name: str = "kvtier-python",
                 request_buffer: int = 0, token: str = ""):
        """request_buffer > 0 asks the daemon for a request buffer of that many
        bytes (REQUEST_BUFFER, docs/protocol.md): lookup() and lookup_batch()
        then copy token ids there instead of sending them through the socket.

        token is presented in HELLO: a daemon with tenants wants one on every
        connection (its tcp_token, or a tenant's). A tenant's connection gets
        no arena, and the client stages slots in its own memory (staged.py);
        ``staged`` says so. The token is not kept."""
        self.path = path or default_socket_path()
        self.timeout = timeout
        # Reentrant: a lookup holds it while it fills the request buffer and
        # then sends through _call, which takes it again.
        self._lock = threading.RLock()
        self._next_id = 1
        self._sock: Optional[socket.socket] = None
        self._arena: Optional[mmap.mmap] = None
        self._arena_bytes: Optional[torch.Tensor] = None
        self._detached = False  # set before the arena is detached: closed from then on
        # Copies into or out of the arena are issued under _copy_lock (``copies``), and close
        # sets _detached under it: once close holds it, no copy can start. _close_lock makes a
        # close from any thread run its steps once, in order (see close).
        self._copy_lock = threading.RLock()
        self._close_lock = threading.RLock()
        self._close_hooks: List[Callable[[], None]] = []
        self.copies = _Copies(self)
        self._reqbuf: Optional[mmap.mmap] = None
        self._staging: Optional[staged.Staging] = None
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(timeout)
            self._sock.connect(self.path)
            self.hello = self._handshake(name, token)
            if request_buffer:
                self._map_request_buffer(request_buffer)
        except OSError as e:
            self.close()
            raise ConnectionLost(f"kvtier: connecting to {self.path}: {e}") from e
        except BaseException:
            self.close()
            raise
        self._arena_bytes = torch.frombuffer(self._arena, dtype=torch.uint8) if self._arena is not None else None

    # ----- connection -------------------------------------------------------

    @property
    def chunk_tokens(self) -> int:
        """The daemon's chunk size in tokens."""
        return self.hello.chunk_tokens

    @property
    def closed(self) -> bool:
        # True from the moment close begins, before the arena is detached, so that a copy that
        # may have read a detached slot (zeros) always sees the client closed when it checks
        # afterwards, and no copy starts once close has taken the copy lock (``copies``).
        return self._sock is None or self._detached

    @property
    def staged(self) -> bool:
        """Whether slots are staged in this process (a tenant's connection, no arena)."""
        return self._staging is not None

    def close(self) -> None:
        """Closes the socket, which ends every lease of this connection on the daemon.

        Safe from any thread, any number of times. In order: no copy through the arena can
        start from here on (:attr:`copies` raises), the close hooks run (a CUDA copier waits
        for its queued copies and unpins the arena, see :meth:`on_close`), the arena is
        detached (:meth:`_detach_arena`) so views of its slots that outlive the connection
        neither crash nor reach the daemon's memory, and only then the socket closes and the
        daemon may hand this connection's slots to others."""
        self._shut()
        if self._staging is not None:
            self._staging.clear()
        if self._reqbuf is not None:
            self._reqbuf.close()
            self._reqbuf = None

    def on_close(self, hook: Callable[[], None]) -> bool:
        """Runs ``hook`` when the client closes, after copies through the arena are stopped and
        before the arena is detached and the socket closed. False, and never run, when the
        client is already closed. A hook's exception is logged, not raised from close."""
        with self._copy_lock:
            if self.closed:
                return False
            self._close_hooks.append(hook)
            return True

    def _shut(self) -> None:
        """Stops copies, runs the close hooks, detaches the arena, closes the socket — once."""
        with self._close_lock:
            with self._copy_lock:  # waits for a copy being issued on another thread
                self._detached = True
                hooks, self._close_hooks = self._close_hooks, []
            for hook in hooks:
                try:
                    hook()
                except Exception as e:  # noqa: BLE001 - close must finish: detach, then the socket
                    log.error("kvtier: closing a connection: %s", e)
            self._detach_arena()
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _detach_arena(self) -> None:
        """Replaces the arena's mapping in place with a fresh memfd of this process's own, of
        the same size (MAP_SHARED|MAP_FIXED over the same addresses, see
        :func:`_remap_private`). Runs only from :meth:`_shut`, after the close hooks (a CUDA
        copier's wait and unpin) and before the socket closes.

        Tensors from :meth:`slot_tensor` may outlive the connection (a save's slots gathered
        layer by layer, a load's chunks scattered while the connection broke). torch.frombuffer
        holds no buffer export that would stop ``mmap.close()``, so unmapping would leave them
        pointing at nothing (a segfault); keeping the shared mapping would let them write into
        slots the daemon reuses for other connections' chunks once this one's leases end. With
        the private mapping in place, stale views read zeros and write into memory of this
        process alone (the memfd is shared with no one). Each view keeps the mmap object alive;
        the last one unmaps the range."""
        self._detached = True
        arena, view = self._arena, self._arena_bytes
        self._arena, self._arena_bytes = None, None
        if arena is None or view is None or not len(arena):
            return
        addr = view.data_ptr()
        if _remap_private(addr, len(arena)):
            return
        # No private replacement (not Linux, or mmap refused): stale views keep the shared
        # mapping; callers must not touch a closed client's slots (the connector checks).
        log_once("kvtier: could not detach the arena of a closed connection; stale slot views still alias it")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _handshake(self, name: str, token: str = "") -> p.HelloReply:
        self._sock.sendall(p.frame(p.OP_HELLO, 0, p.pack_hello(name, token)))
        first, fds = self._recv_with_fd()
        try:
            header = p.unpack_header(first + self._recv_exact(p.HEADER_SIZE - len(first)))
            body = self._recv_exact(header.length)
            if header.status != 0:
                raise status_error(p.OP_HELLO, header.status, body)
            hello = p.unpack_hello_reply(body)
            if hello.version != p.VERSION:
                raise p.ProtocolError(f"daemon speaks protocol version {hello.version}, want {p.VERSION}")
            if not hello.has_arena and token:
                self._staging = staged.Staging()  # a tenant's connection: no arena
                return hello
            if not hello.has_arena or not fds:
                raise p.ProtocolError("the daemon did not share its arena (is this the local socket?)")
            self._arena = mmap.mmap(fds[0], hello.arena_bytes, flags=mmap.MAP_SHARED,
                                    prot=mmap.PROT_READ | mmap.PROT_WRITE)
            return hello
        finally:
            for fd in fds:
                os.close(fd)

    def _map_request_buffer(self, size: int) -> None:
        if not p.MIN_REQUEST_BUFFER <= size <= p.MAX_REQUEST_BUFFER:
            raise ValueError(f"a request buffer of {size} bytes; {p.MIN_REQUEST_BUFFER} to {p.MAX_REQUEST_BUFFER} are allowed")
        if sys.byteorder != "little":
            raise ValueError("a request buffer holds little-endian tokens; this host is not little-endian")
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self._sock.sendall(p.frame(p.OP_REQUEST_BUFFER, rid, struct.pack("<I", size)))
            first, fds = self._recv_with_fd()
            try:
                header = p.unpack_header(first + self._recv_exact(p.HEADER_SIZE - len(first)))
                body = self._recv_exact(header.length)
                if header.status != 0:
                    raise status_error(p.OP_REQUEST_BUFFER, header.status, body)
                if header.op != p.OP_REQUEST_BUFFER or header.request_id != rid or not fds:
                    raise p.ProtocolError("REQUEST_BUFFER: no memfd, or a reply to another request")
                granted = p.unpack_u32(body, "request buffer reply")
                if granted < size:
                    raise p.ProtocolError(f"REQUEST_BUFFER granted {granted} bytes for {size} asked")
                self._reqbuf = mmap.mmap(fds[0], granted, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                for fd in fds:
                    os.close(fd)

    @property
    def shares_tokens(self) -> bool:
        """Whether lookups leave their token ids in a request buffer."""
        return self._reqbuf is not None

    def _lookup_body(self, keys: Keys, lease_ms: int, at: int) -> tuple:
        """A LOOKUP body for keys, with their token ids written into the
        request buffer from byte at when they fit there (the caller holds the
        lock until the reply); returns the body and the next free byte."""
        if self._reqbuf is not None and keys.kind == p.KIND_TOKENS:
            data = p.pack_u32_array(keys.items)
            if at + len(data) <= len(self._reqbuf):
                self._reqbuf[at:at + len(data)] = data
                body = struct.pack("<I", lease_ms) + p.pack_shared_keys(keys.scope, at, len(data) // 4, keys.skip)
                return body, at + len(data)
        return p.pack_lookup(keys, lease_ms), at

    def _recv_with_fd(self) -> tuple:
        """Reads the start of a reply with recvmsg: a memfd rides on its first byte (HELLO, REQUEST_BUFFER)."""
        fds = array.array("i")
        data, ancdata, _flags, _addr = self._sock.recvmsg(p.HEADER_SIZE, socket.CMSG_SPACE(fds.itemsize))
        if not data:
            raise ConnectionLost("kvtier: the daemon closed the connection during HELLO")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        return data, list(fds)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionLost("kvtier: the daemon closed the connection")
            got += k
        return bytes(buf)

    def _call(self, op: int, body: bytes = b"", timeout: Optional[float] = None, flags: int = 0) -> bytes:
        """Sends one request and returns the body of its OK reply; timeout,
        when given, replaces the client's for this request alone."""
        with self._lock:
            if self._sock is None:
                raise ConnectionLost("kvtier: client is closed")
            rid = self._next_id
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF or 1
            try:
                if timeout is not None:
                    self._sock.settimeout(timeout)
                self._sock.sendall(p.frame(op, rid, body, flags))
                header = p.unpack_header(self._recv_exact(p.HEADER_SIZE))
                if header.length > p.MAX_META_BODY:
                    raise p.ProtocolError(f"reply body of {header.length} bytes")
                reply = self._recv_exact(header.length)
                if timeout is not None:
                    self._sock.settimeout(self.timeout)
            except (OSError, p.ProtocolError) as e:
                self._break()
                if isinstance(e, ConnectionLost):
                    raise
                raise ConnectionLost(f"kvtier: op {op}: {e}") from e
            if header.op != op or header.request_id != rid or not header.flags & p.FLAG_REPLY:
                self._break()
                raise ConnectionLost(f"kvtier: reply (op {header.op}, id {header.request_id}) does not match request (op {op}, id {rid})")
        if header.status != 0:
            raise status_error(op, header.status, reply)
        return reply

    def _break(self) -> None:
        """Drops a connection whose stream position can no longer be trusted (copies stopped,
        hooks run and arena detached first, as in :meth:`close`)."""
        self._shut()

    # ----- arena ------------------------------------------------------------

    def slot_tensor(self, slot: Slot) -> torch.Tensor:
        """The slot's bytes as a uint8 tensor aliasing the arena (no copy), or
        the client's staging buffer without the arena."""
        if self._staging is not None:
            return self._staging.view(slot)
        if self._arena_bytes is None:
            raise ConnectionLost("kvtier: client is closed")
        if slot.offset + slot.length > self.hello.arena_bytes:
            raise p.ProtocolError(f"slot [{slot.offset}, +{slot.length}) is outside the {self.hello.arena_bytes}-byte arena")
        return self._arena_bytes[slot.offset: slot.offset + slot.length]

    # ----- operations -------------------------------------------------------

    def ping(self, payload: bytes = b"") -> bytes:
        return self._call(p.OP_PING, payload)

    def scope(self, model: str, fmt: str, world_size: int = 1, rank: int = 0, namespace: str = "") -> int:
        """Registers a scope on this connection and returns its handle."""
        return p.unpack_u32(self._call(p.OP_SCOPE, p.pack_scope(world_size, rank, model, fmt, namespace)), "scope reply")

    def lookup(self, keys: Keys, lease_ms: int = 0) -> LookupReply:
        """How much of the keys' prefix is cached; with lease_ms, keeps the hit resident."""
        with self._lock:
            body, _ = self._lookup_body(keys, lease_ms, 0)
            return p.unpack_lookup_reply(self._call(p.OP_LOOKUP, body))

    def lookup_batch(self, keys: Sequence[Keys], lease_ms: int = 0) -> List[Union[LookupReply, StatusError]]:
        """Looks up several prompts in one round trip (LOOKUP_BATCH, at most
        protocol.MAX_BATCH). Item i answers keys[i]: its LookupReply, or, for a
        lookup that failed alone, the StatusError (returned, not raised) that
        lookup() would have raised."""
        if not 0 < len(keys) <= p.MAX_BATCH:
            raise ValueError(f"a batch of {len(keys)} lookups; 1 to {p.MAX_BATCH} are allowed")
        with self._lock:
            parts, at = [struct.pack("<I", len(keys))], 0
            for k in keys:
                part, at = self._lookup_body(k, lease_ms, at)
                parts.append(part)
            results = p.unpack_lookup_batch_reply(self._call(p.OP_LOOKUP_BATCH, b"".join(parts)))
        if len(results) != len(keys):
            raise p.ProtocolError(f"LOOKUP_BATCH of {len(keys)} lookups answered with {len(results)} results")
        return [r.reply if r.status == 0 else status_error(p.OP_LOOKUP, r.status, r.message.encode("utf-8"))
                for r in results]

    def prepare_store(self, keys: Keys, sizes: Sequence[int], lease_ms: int = 0) -> Slots:
        if self._staging is not None:
            return staged.prepare_store(self, keys, sizes)
        return p.unpack_slots(self._call(p.OP_PREPARE_STORE, p.pack_prepare_store(keys, sizes, lease_ms)))

    def commit_store(self, lease: int, count: int) -> int:
        if self._staging is not None:
            return staged.commit_store(self, lease, count)
        return p.unpack_u32(self._call(p.OP_COMMIT_STORE, p.pack_commit(lease, count)), "commit reply")

    def prepare_retrieve(self, keys: Keys, lease_ms: int = 0) -> Slots:
        if self._staging is not None:
            return staged.prepare_retrieve(self, keys)
        return p.unpack_slots(self._call(p.OP_PREPARE_RETRIEVE, p.pack_prepare_retrieve(keys, lease_ms)))

    def prepare_retrieve_layers(self, keys: Keys, layers: int = 0, parts: int = 0, lease_ms: int = 0) -> Slots:
        """PREPARE_RETRIEVE that answers before the daemon has read chunks
        from its lower tiers: it fills their slots layer by layer behind the
        reply, and ``layer_wait`` says when a layer is in (docs/layerwise.md).
        A chunk is ``parts`` (2: K then V; 1: MLA) × ``layers`` equal spans;
        0 and 0 take the geometry from the scope's format tag. A staged
        client (a tenant's connection, which the daemon gives no arena) reads
        the chunks whole, as ``prepare_retrieve`` does."""
        if self._staging is not None:
            return staged.prepare_retrieve(self, keys)
        body = p.pack_prepare_retrieve_layers(keys, layers, parts, lease_ms)
        return p.unpack_slots(self._call(p.OP_PREPARE_RETRIEVE_LAYERS, body))

    def layer_wait(self, lease: int, layer: int, timeout: Optional[float] = None) -> p.LayerReady:
        """Waits until ``layer`` of every usable slot of a
        ``prepare_retrieve_layers`` lease is in place (at most until the
        lease's deadline). Slots from ``usable`` on failed to load: recompute
        them. ``ready`` fewer than layer+1 means the wait ran out."""
        if self._staging is not None:  # staged slots are whole once prepared
            n = self._staging.count(lease)
            if n is None:
                raise p.ProtocolError(f"layer wait: lease {lease} is not one of this client's staged leases")
            return p.LayerReady(n, p.ALL_LAYERS)
        body = self._call(p.OP_LAYER_WAIT, p.pack_layer_wait(lease, layer), timeout=timeout)
        return p.unpack_layer_ready(body)

    def store_layer(self, lease: int, layer: int, layers: int = 0, parts: int = 0) -> None:
        """Tells the daemon that ``layer`` of every slot of store lease ``lease`` is final, so it
        may write that layer to disk before the commit (docs/layerwise.md). One-way: it returns
        once the frame is sent and the daemon never answers; a notice it cannot use is dropped.
        ``layers``/``parts`` describe the chunks (0, 0: the scope's format tag)."""
        body = p.pack_store_layer(lease, layer, layers, parts)
        with self._lock:
            if self._sock is None:
                raise ConnectionLost("kvtier: client is closed")
            rid = self._next_id
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF or 1
            try:
                self._sock.sendall(p.frame(p.OP_STORE_LAYER, rid, body))
            except OSError as e:
                self._break()
                raise ConnectionLost(f"kvtier: op {p.OP_STORE_LAYER}: {e}") from e

    def release(self, lease: int) -> None:
        if self._staging is not None:
            return staged.release(self, lease)
        self._call(p.OP_RELEASE, p.pack_release(lease))

    def renew(self, lease: int, ms: int) -> None:
        if self._staging is not None:
            return  # staged leases are the client's own and do not lapse
        self._call(p.OP_RENEW, p.pack_renew(lease, ms))

    def prefetch(self, keys: Keys) -> bool:
        body = self._call(p.OP_PREFETCH, keys.pack())
        if len(body) != 1:
            raise p.ProtocolError(f"prefetch reply of {len(body)} bytes")
        return body[0] == 1

    def clear(self, scope: int = 0) -> int:
        """Drops a scope's chunks (every scope's with 0; a tenant's own with 0 on
        a tenant connection) from RAM and the disk tier, and returns how many
        left RAM. Remote stores keep theirs: they cannot list a scope's chunks."""
        return p.unpack_u64(self._call(p.OP_CLEAR, p.pack_clear(scope)), "clear reply")

    def stats(self) -> dict:
        return json.loads(self._call(p.OP_STATS).decode("utf-8"))

    def flush(self, timeout_ms: int = 0) -> p.FlushReply:
        """Waits until every chunk stored before it, by any client, is in the
        daemon's tiers below RAM (durable on disk), or the daemon's wait ends:
        ``timeout_ms``, or with 0 its default of one minute. Returns what each
        tier still lacks; ``reply.durable`` says whether that is nothing."""
        wait = (timeout_ms or 60_000) / 1000.0
        body = self._call(p.OP_FLUSH, p.pack_flush(timeout_ms), timeout=wait + self.timeout)
        return p.unpack_flush_reply(body)

    # ----- prefill/decode transfer (docs/disaggregation.md) ------------------------------

    def push(self, transfer: int, dest: str, keys: Keys, timeout_ms: int = 0, last: bool = False,
             store_lease: int = 0) -> int:
        """Asks the daemon to push the chunks ``keys`` names (after the skip),
        which it must hold, to the daemon whose TCP protocol is at ``dest``
        (host:port), as transfer ``transfer``. Calls with the same id add
        chunks in order; ``last`` says none follow. ``timeout_ms`` bounds the
        whole transfer (0: the daemon's default, one minute). Returns how many
        chunks the transfer has queued in all. A chunk the daemon lacks raises
        NotFound and fails the transfer. With ``store_lease`` (a ``prepare_store``
        lease of this connection, still being filled) the daemon sends each layer
        of those chunks as ``store_layer`` says it is final; a daemon older than
        that answers BadRequest (an unknown flag)."""
        body = p.pack_push(transfer, dest, keys, timeout_ms, last, store_lease)
        return p.unpack_u32(self._call(p.OP_PUSH, body), "push reply")

    def push_status(self, transfer: int) -> p.PushStatus:
        """Where a transfer stands: pending, done (every chunk is in the
        destination) or failed (``message`` says why). NotFound for an id the
        daemon does not know."""
        return p.unpack_push_status(self._call(p.OP_PUSH_STATUS, p.pack_push_status(transfer)))

    def wait(self, keys: Keys, timeout_ms: int, least: int = 0, in_progress: bool = False) -> p.WaitReply:
        """Waits until at least ``least`` of the chunks ``keys`` names (after
        the skip; 0 means all) are in the daemon's RAM as a leading run, or
        ``timeout_ms`` passes; returns how many leading ones are there. A
        consumer calls it before loading pushed chunks. With ``in_progress``
        a chunk still arriving by ``RECEIVE_LAYERS`` counts as there (a
        layerwise reader can take it); a daemon older than that flag refuses
        the header and closes the connection (ConnectionLost or BadRequest)."""
        body = self._call(p.OP_WAIT, p.pack_wait(keys, timeout_ms, least),
                          timeout=timeout_ms / 1000.0 + self.timeout,
                          flags=p.FLAG_IN_PROGRESS if in_progress else 0)
        return p.unpack_wait_reply(body)

    # ----- conveniences -----------------------------------------------------

    def tokens(self, scope: int, tokens: Sequence[int], skip: int = 0) -> Keys:
        """Token keys (kind 0) of a prompt from its first token."""
        return Keys(scope, p.KIND_TOKENS, tokens, skip)

    def hashes(self, scope: int, hashes: Sequence[bytes]) -> Keys:
        """Hash keys (kind 1), one 16-byte hash per chunk."""
        return Keys(scope, p.KIND_HASHES, hashes)

    def store(self, keys: Keys, chunks: List[torch.Tensor], lease_ms: int = 0) -> int:
        """Copies whole chunks into the arena and commits them; returns how many were committed."""
        sizes = [c.numel() * c.element_size() for c in chunks]
        slots = self.prepare_store(keys, sizes, lease_ms)
        try:
            for s, c in zip(slots.slots, chunks):
                if s.state == p.SLOT_WRITE:
                    self.slot_tensor(s).copy_(c.contiguous().view(-1).view(torch.uint8))
        except BaseException:
            if slots.lease:
                self.commit_store(slots.lease, 0)
            raise
        return self.commit_store(slots.lease, len(slots.slots)) if slots.lease else 0
