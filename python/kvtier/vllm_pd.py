"""Prefill/decode disaggregation for the vLLM connector (docs/disaggregation.md).

A *producer* (prefill instance, ``kv_role: kv_producer``) computes a prompt's
KV and saves its whole chunks into its daemon as usual. When the request's
``kv_transfer_params`` say ``do_remote_decode``, the chunks are also sent to
the consumer's daemon (``kvtier_push_to``), and ``request_finished`` keeps
the request's blocks (``delay_free``) until that push is done or
``pd_timeout`` passes, answering the parameters the decode side needs.

A *consumer* (decode instance, ``kv_role: kv_consumer``) receives the request
again with those parameters (``do_remote_prefill``): it reports the prompt's
whole chunks as loadable asynchronously, loads them as they arrive in its
daemon, reads the rest from its daemon's tiers (its P2P tier reaches the
producer's daemon when configured), and reports the chunks it could not get
as load errors (vLLM then applies ``kv_load_failure_policy``).

Addresses in the parameters come from HTTP clients; the connector dials only
those its configuration lists (:class:`PeerList`).

This module holds what is specific to that: the roles (and LMCache's
``enable_pd`` / ``pd_role``), the parameters exchanged through vLLM, and the
:class:`Transport` the connector moves chunks between daemons with.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Optional, Tuple

from . import protocol as p
from .client import BadRequest, ConnectionLost, KVTierError, NotFound, StatusError
from .link import Link
from .peer import Peer, parse_addr

log = logging.getLogger("kvtier.vllm")

PRODUCER, CONSUMER, BOTH = "kv_producer", "kv_consumer", "kv_both"
ROLES = (PRODUCER, CONSUMER, BOTH)

# LMCache's disaggregation settings and their older names, as LMCache's own
# configuration maps them (lmcache/v1/config.py, _CONFIG_ALIASES).
_LMCACHE_ALIASES = {
    "enable_xpyd": "enable_pd",
    "nixl_role": "pd_role",
    "nixl_peer_host": "pd_peer_host",
    "nixl_peer_init_port": "pd_peer_init_port",
}
_LMCACHE_KEYS = ("enable_pd", "pd_role", "pd_peer_host", "pd_peer_init_port")
# LMCache settings that only configure its own NIXL channel: kvtier moves
# chunks between daemons over their TCP port, so these are accepted and unused.
_LMCACHE_UNUSED = ("pd_buffer_size", "pd_buffer_device", "pd_peer_alloc_port", "pd_peer_query_port",
                   "pd_proxy_host", "pd_proxy_port", "nixl_buffer_size", "nixl_buffer_device",
                   "nixl_peer_alloc_port", "nixl_proxy_host", "nixl_proxy_port", "transfer_channel")
_PD_ROLES = {"sender": PRODUCER, "receiver": CONSUMER}

# Failures a transfer absorbs: a peer gone, a bad reply, a bad address.
_ABSORBED = (KVTierError, OSError, p.ProtocolError, ValueError, RuntimeError)
PUSH_BATCH_BYTES = 64 << 20  # a push copies and sends at most this much of its chunks at a time (or one chunk)


def _truthy(v: Any, key: str = "enable_pd") -> bool:
    """A boolean setting; anything but a bool, 0/1 or true/false, yes/no, on/off is an error."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    word = v.strip().lower() if isinstance(v, str) else None
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{key}: {v!r} is not a boolean (want true/false, yes/no, on/off or 1/0)")


def take_lmcache_settings(extra: Dict[str, Any], environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Removes LMCache's disaggregation keys from ``extra`` and returns them by their current names.

    Read, later ones winning: ``LMCACHE_<KEY>`` environment variables, the
    keys in ``kv_connector_extra_config``, the same keys prefixed
    ``lmcache.`` (how LMCache's own vLLM connector takes overrides).
    """
    env = os.environ if environ is None else environ
    out: Dict[str, Any] = {}
    for key in tuple(_LMCACHE_ALIASES) + _LMCACHE_KEYS:  # current names over old ones
        value = env.get("LMCACHE_" + key.upper())
        if value is not None:
            out[_LMCACHE_ALIASES.get(key, key)] = value
    for key in sorted(extra, key=lambda k: k.startswith("lmcache.")):  # prefixed keys last: they win
        name = key[len("lmcache."):] if key.startswith("lmcache.") else key
        if name in _LMCACHE_UNUSED:
            log.info("kvtier: %s is LMCache's NIXL setting; kvtier transfers between daemons over TCP", key)
            del extra[key]
        elif name in _LMCACHE_KEYS or name in _LMCACHE_ALIASES:
            out[_LMCACHE_ALIASES.get(name, name)] = extra.pop(key)
    return out


def resolve_role(kv_role: Optional[str], lmcache: Dict[str, Any]) -> str:
    """The connector's role from vLLM's ``kv_role`` and LMCache's ``enable_pd`` / ``pd_role``.

    ``pd_role`` (``sender`` = producer, ``receiver`` = consumer) decides when
    ``kv_role`` is ``kv_both`` or unset; naming opposite roles is an error.
    """
    role = kv_role or BOTH
    if role not in ROLES:
        raise ValueError(f"kv_role {kv_role!r}: want kv_producer, kv_consumer or kv_both")
    if not _truthy(lmcache.get("enable_pd", False)):
        if lmcache.get("pd_role") is not None:
            log.info("kvtier: pd_role is ignored without enable_pd")
        return role
    pd_role = str(lmcache.get("pd_role") or "").lower()
    if pd_role not in _PD_ROLES:
        raise ValueError(f"enable_pd needs pd_role sender (prefill) or receiver (decode), got {pd_role or 'none'!r}")
    mapped = _PD_ROLES[pd_role]
    if role not in (BOTH, mapped):
        raise ValueError(f"kv_role {role} contradicts LMCache's pd_role {pd_role} (= {mapped})")
    return mapped


def lmcache_push_to(lmcache: Dict[str, Any]) -> str:
    """The receiver's daemon as LMCache names its peer: ``pd_peer_host`` and the first ``pd_peer_init_port``."""
    host = lmcache.get("pd_peer_host")
    ports = lmcache.get("pd_peer_init_port")
    if not host or ports in (None, "", []):
        return ""
    if isinstance(ports, str):
        ports = [x for x in ports.replace("[", "").replace("]", "").split(",") if x.strip()]
    if not isinstance(ports, (list, tuple)):
        ports = [ports]
    return f"{host}:{int(ports[0])}"


# ------------------------------------------------------------ trust


class PeerList:
    """The daemons this instance may push to or hear from (the ``pd_peers`` setting).

    Addresses in a request's ``kv_transfer_params`` come from HTTP clients:
    the connector dials one only if configuration names it, so a client can
    neither make this node send its ``tcp_token`` to an address of its choice
    nor point the consumer at a daemon of its own. ``*`` trusts any address
    (a deployment whose HTTP clients are all trusted).
    """

    def __init__(self, addrs: FrozenSet[Tuple[str, int]] = frozenset(), any_addr: bool = False):
        self.addrs, self.any = addrs, any_addr

    @classmethod
    def parse(cls, value: Any) -> "PeerList":
        """From a list or a comma-separated string; ValueError names a bad entry."""
        items = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
        items = [str(x).strip() for x in items if str(x).strip()]
        if "*" in items:
            return cls(frozenset(), True)
        return cls(frozenset(parse_addr(x) for x in items))

    def allows(self, addr: str, *also: str) -> bool:
        """Whether ``addr`` is listed (or one of ``also``, other configured addresses)."""
        if not addr:
            return False
        if self.any:
            return True
        try:
            want = parse_addr(addr)
        except ValueError:
            return False
        return want in self.addrs or any(x and _same_addr(x, want) for x in also)


def _same_addr(addr: str, want: Tuple[str, int]) -> bool:
    try:
        return parse_addr(addr) == want
    except ValueError:
        return False


_NO_PEERS = PeerList()
_last_warned: Dict[str, float] = {}
_WARN_EVERY = 60.0  # seconds between two warnings of one kind: a client can repeat a request at will


def _warn_limited(kind: str, msg: str, *args: Any) -> None:
    """Logs a warning at most once a minute per kind, so requests cannot flood the log."""
    now = time.monotonic()
    if now - _last_warned.get(kind, float("-inf")) >= _WARN_EVERY:
        _last_warned[kind] = now
        log.warning(msg + " (logged once a minute)", *args)


# ------------------------------------------------------------ parameters


@dataclass
class PushRequest:
    """What a prefill request's ``kv_transfer_params`` ask of the producer."""

    transfer_id: str
    push_to: str  # the consumer daemon's TCP address; "" = the consumer pulls

    @classmethod
    def of(cls, params: Any, request_id: str, default_push_to: str = "",
           peers: PeerList = _NO_PEERS) -> Optional["PushRequest"]:
        """The push a request asks for; ``kvtier_push_to`` counts only when ``peers`` or
        ``default_push_to`` (the configured ``push_to``) name it, else nothing is pushed."""
        if not isinstance(params, dict) or not params.get("do_remote_decode"):
            return None
        tid = str(params.get("kvtier_transfer_id") or request_id)
        push_to = str(params.get("kvtier_push_to") or default_push_to or "")
        if push_to:
            try:
                parse_addr(push_to)
            except ValueError as e:
                _warn_limited("push_to_bad", "kvtier: request %s: kvtier_push_to: %s; nothing is pushed",
                              request_id, e)
                push_to = ""
        if push_to and not peers.allows(push_to, default_push_to):
            _warn_limited("push_to_denied", "kvtier: request %s: kvtier_push_to %r is not in pd_peers; "
                          "nothing is pushed", request_id, push_to)
            push_to = ""
        return cls(tid, push_to)


@dataclass
class RemotePrefill:
    """What a decode request's ``kv_transfer_params`` tell the consumer (what the producer answered)."""

    transfer_id: str
    source: str       # the producer daemon's TCP address ("" = no pull possible)
    tokens: int       # prompt tokens whose chunks the producer saved
    pushed: bool      # the producer pushes them here; else only a pull brings them

    @classmethod
    def of(cls, params: Any, scope: Tuple[str, str, int, int], namespace: str, chunk: int,
           request_id: str, peers: PeerList = _NO_PEERS) -> Optional["RemotePrefill"]:
        """The remote prefill a request asks for, or None (no params, params for another
        engine, or params without the scope a producer always sends).

        ``kvtier_source`` is kept only when ``peers`` names it: the consumer asks
        that daemon how the push goes, and nothing else."""
        if not isinstance(params, dict) or not params.get("do_remote_prefill"):
            return None
        if "kvtier_transfer_id" not in params:
            return None  # another connector's parameters: nothing kvtier can load
        model, fmt, world, rank = scope
        want = {"kvtier_model": model, "kvtier_format": fmt, "kvtier_world_size": world,
                "kvtier_chunk_size": chunk, "kvtier_namespace": namespace}
        for key, mine in want.items():
            theirs = params.get(key)
            if theirs is None:
                _warn_limited("scope_missing", "kvtier: request %s: do_remote_prefill without %s: "
                              "not a producer's answer; recomputing the prompt", request_id, key)
                return None
            if theirs != mine:
                log.warning("kvtier: request %s: the producer's %s is %r, this engine's %r: recomputing the prompt",
                            request_id, key, theirs, mine)
                return None
        try:
            tokens = int(params.get("kvtier_tokens", 0))
        except (TypeError, ValueError):
            log.warning("kvtier: request %s: kvtier_tokens %r is not a number", request_id, params.get("kvtier_tokens"))
            return None
        source = str(params.get("kvtier_source") or "")
        if source:
            try:
                parse_addr(source)
            except ValueError as e:
                _warn_limited("source_bad", "kvtier: request %s: kvtier_source: %s", request_id, e)
                source = ""
        if source and not peers.allows(source):
            _warn_limited("source_denied", "kvtier: request %s: kvtier_source %r is not in pd_peers; "
                          "it is not asked", request_id, source)
            source = ""
        return cls(str(params["kvtier_transfer_id"]), source, max(tokens, 0), bool(params.get("kvtier_pushed")))


def decode_params(push: PushRequest, scope: Tuple[str, str, int, int], namespace: str, chunk: int,
                  tokens: int, source: str, pushed: bool) -> Dict[str, Any]:
    """The ``kv_transfer_params`` a finished prefill returns, for the decode request.

    ``do_remote_prefill`` / ``do_remote_decode`` are vLLM's own markers; the
    ``kvtier_`` fields name the transfer, where the chunks are, and what the
    consumer checks before trusting them (same model, format, parallel
    layout, chunk size and namespace give the same keys).
    """
    model, fmt, world, rank = scope
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "kvtier_transfer_id": push.transfer_id,
        "kvtier_source": source,
        "kvtier_pushed": pushed,
        "kvtier_tokens": tokens,
        "kvtier_chunks": tokens // chunk if chunk else 0,
        "kvtier_chunk_size": chunk,
        "kvtier_model": model,
        "kvtier_format": fmt,
        "kvtier_world_size": world,
        "kvtier_rank": rank,
        "kvtier_namespace": namespace,
    }


# ------------------------------------------------------------- transfers


@dataclass
class Job:
    """One request's chunks, as both daemons key them."""

    transfer_id: str
    namespace: str
    keys: Any   # TokenKeys or HashKeys of the prompt
    tokens: int  # chunks [0, tokens) are the transfer
    peer: str   # push: the consumer's daemon; fetch: the producer's ("" = none)


PENDING, DONE, FAILED = "pending", "done", "failed"


class Transport:
    """What the connector asks of the daemons to move a request's chunks.

    ``push`` starts sending chunks ``[start, job.tokens)`` the producer's
    daemon holds to the consumer's and returns at once (calls for one
    transfer add chunks in order, ``last`` on the final one); ``state`` says
    how it went. ``fetch`` (consumer, run on a background thread) returns
    once the pushed chunks are in the consumer's daemon or ``deadline``
    passed, with the leading tokens it has, handing runs to ``on_ready`` as
    they come. It never pulls itself: chunks that did not come are read by
    the consumer's daemon from its own tiers, whose P2P reads are
    checksummed and go only to the peers its configuration names.
    """

    def push(self, job: Job, start: int = 0, last: bool = True) -> None:
        raise NotImplementedError

    def state(self, transfer_id: str) -> str:
        raise NotImplementedError

    def forget(self, transfer_id: str) -> None:
        raise NotImplementedError

    def fetch(self, job: Job, link: Link, deadline: float, wait_push: bool, start: int = 0,
              on_ready: Optional[Callable[[int], None]] = None) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PeerTransport(Transport):
    """Moves chunks with the daemons' existing operations: the producer reads
    them from its daemon's arena and stores them in the consumer's daemon
    over TCP (``STORE``); the consumer polls its daemon (``LOOKUP``).

    Pushes run one at a time on a background thread with their own daemon
    connection, so a push never holds up a forward pass.
    """

    def __init__(self, link: Link, token: str = "", timeout: float = 5.0, poll: float = 0.005):
        self.link, self.token, self.timeout, self.poll = link, token, timeout, poll
        self._states: Dict[str, str] = {}
        self._lock = threading.Lock()
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._peers: Dict[str, Peer] = {}

    # ----- push (producer)

    def push(self, job: Job, start: int = 0, last: bool = True) -> None:
        """Pushes the whole transfer once its last part is named (chunks are not streamed this way)."""
        if not last:
            return
        with self._lock:
            self._states[job.transfer_id] = PENDING
            if self._thread is None:
                self._thread = threading.Thread(target=self._pusher, name="kvtier-push", daemon=True)
                self._thread.start()
        self._queue.put(job)

    def state(self, transfer_id: str) -> str:
        with self._lock:
            return self._states.get(transfer_id, FAILED)

    def forget(self, transfer_id: str) -> None:
        with self._lock:
            self._states.pop(transfer_id, None)

    def _pusher(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            ok = False
            try:
                ok = self._push_one(job)
            except _ABSORBED as e:
                log.warning("kvtier: push %s to %s: %s", job.transfer_id, job.peer, e)
                self._drop_peer(job.peer)
            except Exception as e:  # noqa: BLE001 - the thread must keep serving later pushes
                log.error("kvtier: push %s: %s", job.transfer_id, e)
            with self._lock:
                if job.transfer_id in self._states:
                    self._states[job.transfer_id] = DONE if ok else FAILED

    def _push_one(self, job: Job) -> bool:
        c = self.link.get()
        chunk = c.chunk_tokens
        n = job.tokens // chunk
        if n == 0:
            return True
        model, fmt, world, rank = self.link.scope_args
        local = c.scope(model, fmt, world_size=world, rank=rank, namespace=job.namespace)
        slots = c.prepare_retrieve(job.keys.build(c, local, n * chunk, 0), 60000)
        try:
            if len(slots.slots) < n:
                log.warning("kvtier: push %s: the daemon holds %d of %d chunks", job.transfer_id, len(slots.slots), n)
            stored, i, peer, remote = 0, 0, None, 0
            while i < len(slots.slots):
                # A batch of chunks at a time (at least one), so a push never holds a second
                # copy of the whole transfer. Copied out under the copy lock: a close on another
                # thread would otherwise turn the slots into zeros mid-read (the detached
                # arena), and the peer would keep them.
                j, size = i + 1, slots.slots[i].length
                while j < len(slots.slots) and size + slots.slots[j].length <= PUSH_BATCH_BYTES:
                    size += slots.slots[j].length
                    j += 1
                try:
                    with c.copies:
                        views = [bytes(memoryview(c.slot_tensor(s).numpy())) for s in slots.slots[i:j]]
                except ConnectionLost:  # this side's connection closed, not the peer's
                    log.warning("kvtier: push %s: the local connection closed; %d of %d chunks pushed",
                                job.transfer_id, stored, n)
                    return False
                if peer is None:
                    peer = self._peer(job.peer)
                    remote = peer.scope(model, fmt, world, rank, job.namespace)
                kept = peer.store(job.keys.build(peer, remote, j * chunk, i * chunk), views)
                del views
                stored += kept
                if kept < j - i:  # the peer kept no more: later chunks would have no parent
                    break
                i = j
        finally:
            if slots.lease and not c.closed:  # closed: the lease ended with the connection
                c.release(slots.lease)
        return stored == n

    def _peer(self, addr: str) -> Peer:
        peer = self._peers.get(addr)
        if peer is None or peer.closed:
            peer = self._peers[addr] = Peer(addr, self.token, self.timeout)
        return peer

    def _drop_peer(self, addr: str) -> None:
        peer = self._peers.pop(addr, None)
        if peer is not None:
            peer.close()

    # ----- fetch (consumer)

    def fetch(self, job: Job, link: Link, deadline: float, wait_push: bool, start: int = 0,
              on_ready: Optional[Callable[[int], None]] = None) -> int:
        c = link.get()
        chunk = c.chunk_tokens
        want = job.tokens // chunk * chunk
        model, fmt, world, rank = link.scope_args
        local = c.scope(model, fmt, world_size=world, rank=rank, namespace=job.namespace)
        have = self._have(c, job, local, want)
        delay = self.poll
        while wait_push and have < want and time.monotonic() < deadline:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)
            have = self._have(c, job, local, want)
        if on_ready is not None and have > start:
            on_ready(have)
        return have

    @staticmethod
    def _have(c: Any, job: Job, scope: int, want: int) -> int:
        return min(c.lookup(job.keys.build(c, scope, want, 0)).tokens, want)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=self.timeout * 2)
        for addr in list(self._peers):
            self._drop_peer(addr)



def transfer_number(transfer_id: str) -> int:
    """The daemon's u64 transfer id for the proxy's: a decimal id as it is, any other string hashed."""
    if transfer_id.isdigit() and 0 < int(transfer_id) < 1 << 64:
        return int(transfer_id)
    n = int.from_bytes(hashlib.blake2b(transfer_id.encode(), digest_size=8).digest(), "little")
    return n or 1


def rank_transfer(transfer_id: str, rank: int) -> int:
    """The daemon's transfer id for one tensor-parallel rank's part of a transfer.

    Ranks of one instance share a daemon and the request's parameters; each
    pushes its own chunks, so each needs a transfer of its own (one rank's
    ``last`` must not close another's)."""
    return transfer_number(f"{transfer_id}/{rank}")


_UNKNOWN_OP = 2  # a daemon from before the transfer operations


def refuses_in_progress(e: BaseException) -> bool:
    """Whether a WAIT failed because the daemon is older than its ``IN_PROGRESS`` flag: it
    answers ``BAD_REQUEST`` naming the header's unknown flags (then closes the connection).
    A timeout, a closed connection or a restarted daemon says nothing about the flag."""
    return isinstance(e, BadRequest) and "unknown flags" in e.message


def _old_daemon(e: BaseException) -> bool:
    return isinstance(e, StatusError) and e.status in (_UNKNOWN_OP, 6)


def _unknown_push_flag(e: BadRequest) -> bool:
    """Whether a PUSH's BAD_REQUEST is a daemon's older than the store-lease flag: its PUSH
    decoder refuses the flag ("push: unknown flags 0x2"). A current daemon answers BAD_REQUEST
    for a transfer's own state too (ended, marked last, refused by pd_push_allow)."""
    return "push: unknown flags" in e.message


class DaemonTransport(PeerTransport):
    """Moves chunks with the daemons' transfer operations (docs/disaggregation.md): ``PUSH`` makes
    the producer's daemon stream them to the consumer's (checksummed, within the
    consumer's receive budget), ``PUSH_STATUS`` says how it went, and the consumer
    ``WAIT``s for them, asking the producer's daemon meanwhile whether the push
    failed, so it stops waiting early. A daemon without these operations gets
    :class:`PeerTransport`'s behaviour instead."""

    slice_s = 0.1  # one WAIT at most this long: the connection is shared with other loads
    ask_s = 0.5    # how often a waiting consumer asks the producer's daemon about the push
    unreachable_grace_s = 5.0  # how long the producer's daemon may not answer before the wait ends

    def __init__(self, link: Link, token: str = "", timeout: float = 5.0, push_timeout: float = 60.0):
        super().__init__(link, token, timeout)
        self.push_timeout_ms = int(min(max(push_timeout, 0.001), 600.0) * 1000)
        self._fallback: set = set()  # transfers pushed by PeerTransport (old daemon)
        self._old = False
        self._no_store_push = False  # the daemon refused a PUSH of a save in progress
        self._no_in_progress = False  # the daemon refused WAIT's IN_PROGRESS flag
        self.connector_pushes = 0  # transfers pushed that way, for tests and logs

    def push(self, job: Job, start: int = 0, last: bool = True) -> None:
        with self._lock:
            if self._states.get(job.transfer_id) == FAILED:
                return  # an earlier part failed: the transfer is over, the consumer pulls or recomputes
        if not self._old:
            try:
                self._push_daemon(job, start, last)
                return
            except _ABSORBED as e:
                if not _old_daemon(e):
                    log.warning("kvtier: push %s to %s: %s", job.transfer_id, job.peer, e)
                    if not isinstance(e, StatusError):
                        self.link.fail(e)
                    with self._lock:
                        self._states[job.transfer_id] = FAILED
                    return
                log.info("kvtier: the daemon has no PUSH; the connector pushes chunks itself")
                self._old = True
        if not last:
            return
        with self._lock:
            self._fallback.add(job.transfer_id)
            self.connector_pushes += 1
        super().push(job)

    def push_store(self, job: Job, start: int, lease: int, client: Any) -> bool:
        """Pushes the chunks of a save still in progress (store lease ``lease``, chunks from
        ``start`` to ``job.tokens``): the daemon sends each layer as ``store_layer`` reports it
        (docs/disaggregation.md). ``client`` is the connection that holds the lease: the daemon
        pushes only a connection's own store leases. False when that is not possible here — a daemon older than
        the store-lease PUSH, an old transport, a failed transfer — and the chunks are then
        pushed after the commit, as without it."""
        with self._lock:
            if self._old or self._no_store_push or self._states.get(job.transfer_id) == FAILED:
                return False
        try:
            self._push_daemon(job, start, False, store_lease=lease, client=client)
            return True
        except BadRequest as e:
            if not _unknown_push_flag(e):  # this transfer's own refusal (ended, marked last, pd_push_allow)
                log.warning("kvtier: push %s of a save in progress: %s", job.transfer_id, e)
                return False
            log.info("kvtier: the daemon cannot push a save in progress (%s); chunks go after the commit", e)
            with self._lock:
                self._no_store_push = True
        except _ABSORBED as e:
            log.warning("kvtier: push %s of a save in progress: %s", job.transfer_id, e)
        return False

    def _push_daemon(self, job: Job, start: int, last: bool, store_lease: int = 0, client: Any = None) -> None:
        c = client if client is not None else self.link.get()
        chunk = c.chunk_tokens
        end, skip = job.tokens // chunk * chunk, start // chunk * chunk
        with self._lock:
            self._states[job.transfer_id] = PENDING
            if end == 0:  # nothing was ever saved: nothing to send
                self._states[job.transfer_id] = DONE if last else PENDING
                return
        if skip >= end and not last:
            return
        model, fmt, world, rank = self.link.scope_args
        scope = c.scope(model, fmt, world_size=world, rank=rank, namespace=job.namespace)
        c.push(rank_transfer(job.transfer_id, rank), job.peer, job.keys.build(c, scope, end, min(skip, end)),
               timeout_ms=self.push_timeout_ms, last=last, store_lease=store_lease)

    def state(self, transfer_id: str) -> str:
        with self._lock:
            local = self._states.get(transfer_id, FAILED)
            fallback = transfer_id in self._fallback
        if fallback or local != PENDING:
            return local
        try:
            st = self.link.get().push_status(rank_transfer(transfer_id, self.link.scope_args[3]))
        except NotFound:
            return FAILED
        except _ABSORBED as e:
            if not isinstance(e, StatusError):
                self.link.fail(e)
            return PENDING  # the daemon is unreachable: ask again, until the connector's deadline
        if st.failed:
            log.warning("kvtier: push %s failed: %s", transfer_id, st.message)
        return DONE if st.done else FAILED if st.failed else PENDING

    def forget(self, transfer_id: str) -> None:
        super().forget(transfer_id)
        with self._lock:
            self._fallback.discard(transfer_id)

    def fetch(self, job: Job, link: Link, deadline: float, wait_push: bool, start: int = 0,
              on_ready: Optional[Callable[[int], None]] = None) -> int:
        """WAITs for the pushed chunks from ``start`` (tokens, on a chunk boundary) and hands
        each leading run to ``on_ready`` (the tokens now here) as soon as it arrives: reading
        a chunk frees its bytes in the receive budget, so a prompt larger than the budget
        still streams through. Returns the tokens that arrived."""
        if self._old:
            return super().fetch(job, link, deadline, wait_push, start, on_ready)
        c = link.get()
        chunk = c.chunk_tokens
        want = job.tokens // chunk * chunk
        if want <= start:
            return start
        model, fmt, world, rank = link.scope_args
        local = c.scope(model, fmt, world_size=world, rank=rank, namespace=job.namespace)
        try:
            return self._wait(c, job, local, want, start // chunk * chunk, rank,
                              deadline if wait_push else time.monotonic(), on_ready)
        except StatusError as e:
            if not _old_daemon(e):
                raise
            self._old = True
            return super().fetch(job, link, deadline, wait_push, start, on_ready)

    def started(self, job: Job, link: Link, deadline: float, start: int = 0) -> int:
        """Waits only until the pushed chunks from ``start`` are here or on their way (WAIT with
        ``IN_PROGRESS``: a chunk whose first ranges have arrived by ``RECEIVE_LAYERS`` counts),
        so a layerwise reader can take them while their later layers are still arriving
        (docs/disaggregation.md). Ends early as ``fetch`` does: the deadline, or the producer's
        daemon saying the push failed. Returns the leading tokens counted. A daemon older than
        the flag (it refuses the header and closes the connection) gets a wait for whole chunks."""
        if self._old:
            return super().fetch(job, link, deadline, True, start)
        c = link.get()
        chunk = c.chunk_tokens
        want = job.tokens // chunk * chunk
        if want <= start:
            return start
        model, fmt, world, rank = link.scope_args
        local = c.scope(model, fmt, world_size=world, rank=rank, namespace=job.namespace)
        in_progress = not self._no_in_progress
        try:
            return self._wait(c, job, local, want, start // chunk * chunk, rank, deadline, None, in_progress)
        except BadRequest as e:
            # Only the daemon's own refusal of the flag means it is older than the flag; a
            # timeout or a restart is this wait's failure alone (the caller's to handle).
            if not in_progress or not refuses_in_progress(e):
                raise
            with self._lock:
                first, self._no_in_progress = not self._no_in_progress, True
            if first:
                log.info("kvtier: the daemon does not count chunks in progress (%s); waiting for whole chunks", e)
            link.close()  # it closes the connection after refusing a header
            return self.fetch(job, link, deadline, True, start)

    def _wait(self, c: Any, job: Job, local: int, want: int, done: int, rank: int, deadline: float,
              on_ready: Optional[Callable[[int], None]], in_progress: bool = False) -> int:
        """WAITs in short slices for the next chunk (``least`` 1) until all are here, the
        deadline, or the producer's daemon says the push failed (asked every ``ask_s``)."""
        number = rank_transfer(job.transfer_id, rank)
        chunk = c.chunk_tokens
        next_ask = time.monotonic() + self.ask_s
        asker = _PushAsker(self, job.peer, number)
        while done < want:
            left = deadline - time.monotonic()
            keys = job.keys.build(c, local, want, done)
            got = c.wait(keys, int(max(0.0, min(left, self.slice_s)) * 1000), least=1,
                         in_progress=in_progress).chunks
            if got:
                done += got * chunk
                if on_ready is not None:
                    on_ready(done)
                continue
            if left <= self.slice_s:
                break
            if job.peer and time.monotonic() >= next_ask:
                if not asker.pushing():
                    break
                next_ask = time.monotonic() + self.ask_s
        return done


class _PushAsker:
    """Asks a producer's daemon how a push goes, for a consumer that waits for it.

    Only an answer ends the wait — the push failed — or the daemon staying
    unreachable for ``unreachable_grace_s``: one timeout or refused connection
    is a hiccup, not a failed push."""

    def __init__(self, transport: "DaemonTransport", source: str, number: int):
        self.t, self.source, self.number = transport, source, number
        self.unreachable_since: Optional[float] = None
        self.failures = 0  # asks that got no answer, for tests and logs

    def pushing(self) -> bool:
        try:
            with Peer(self.source, self.t.token, self.t.timeout) as peer:
                st = peer.push_status(self.number)
        except NotFound:
            self.unreachable_since = None
            return True  # not started yet: the producer pushes after its step
        except _ABSORBED as e:
            self.failures += 1
            now = time.monotonic()
            if self.unreachable_since is None:
                self.unreachable_since = now
            if now - self.unreachable_since < self.t.unreachable_grace_s:
                return True
            log.warning("kvtier: the producer's daemon %s unreachable for %.1f s: %s",
                        self.source, now - self.unreachable_since, e)
            return False
        self.unreachable_since = None
        if st.failed:
            log.warning("kvtier: push %d from %s failed: %s", self.number, self.source, st.message)
        return not st.failed
