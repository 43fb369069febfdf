"""kvtier as a vLLM v1 KV connector.

Enable it with::

    --kv-transfer-config '{"kv_connector": "KVTierConnector",
                           "kv_connector_module_path": "kvtier.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket_path": "/run/kvtier/kvtier.sock"}}'

Targets vLLM's ``KVConnectorBase_V1`` as on vLLM main in November 2026
(``resumed_req_ids``, packed and standardized KV layouts, cross-layer blocks)
and keeps the older shapes that are still deployed (``resumed_from_preemption``,
5-D block-first / KV-first KV, constructor without ``kv_cache_config``);
docs/vllm.md lists the versions and the call order this class relies on.

Principles:

- Chunks are kvtier's: ``chunk_size`` tokens (the daemon's, from HELLO), keyed
  by the prompt's token ids under a scope (model, KV dtype and format,
  parallel rank, namespace). LoRA adapter, cache salt and multimodal inputs
  separate keys as vLLM's block hashes do (see :mod:`kvtier.vllm_keys`).
  Only whole chunks are stored and loaded.
- A request's blocks are the scheduler's latest word: a request resumed after
  preemption gets new blocks that *replace* the old ones; saves and loads
  always use the current list, so KV is never read from or written to a
  block the request no longer owns.
- Tokens vLLM already holds (``num_computed_tokens``) are never written.
- Loads from RAM are synchronous (``layerwise`` overlaps them with compute);
  a hit that is partly on disk or remote is loaded asynchronously
  (``load_async``), finished in ``get_finished``.
- The daemon is an optimisation, never a dependency: a failure becomes a miss
  (scheduler) or load errors for the affected blocks (worker, through
  ``get_block_ids_with_load_errors``; vLLM then applies
  ``kv_load_failure_policy``), never an exception into vLLM and never a hang.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from . import defaults
from . import protocol as p
from . import vllm_kv as kvl
from . import vllm_pd as pd
from ._vllm_compat import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorStats
from .auth import resolve_token
from .client import Client, ConnectionLost, KVTierError, default_socket_path
from .link import Link
import os

from .vllm_keys import HashKeys, TokenKeys, key_tokens, mm_items, namespace_of

log = logging.getLogger("kvtier.vllm")

# Failures the connector absorbs: daemon gone or misbehaving, or bytes that
# do not fit the engine's geometry (another model wrote under this scope).
_ABSORBED = (KVTierError, OSError, p.ProtocolError, ValueError, RuntimeError)


@dataclass
class ReqMeta:
    """What the worker does for one request in one step (plain data, shipped to workers)."""

    req_id: str
    namespace: str
    keys: Any              # TokenKeys or HashKeys of the prompt
    block_ids: List[int]
    load_start: int = 0  # first token to write: vLLM holds the ones before
    load_end: int = 0    # tokens the request has once the load is done (0: no load)
    load_async: bool = False  # load in the background, report in get_finished
    save_start: int = 0  # chunks [save_start, save_end) are to be stored
    save_end: int = 0
    remote: Optional[pd.RemotePrefill] = None  # a decode request's prompt, computed by a producer
    push: Optional[pd.PushRequest] = None  # a prefill decoded elsewhere: push its chunks once saved


@dataclass
class SendMeta:
    """A finished prefill whose blocks vLLM keeps until the worker reports it in finished_sending."""

    req_id: str
    job: pd.Job


@dataclass
class KVTierConnectorMetadata(KVConnectorMetadata):
    requests: List[ReqMeta] = field(default_factory=list)
    sends: List[SendMeta] = field(default_factory=list)


@dataclass
class Settings:
    """``kv_connector_extra_config`` keys understood by the connector (docs/vllm.md)."""

    socket_path: str = ""
    timeout: float = defaults.TIMEOUT  # seconds any one daemon call may take
    lease_ms: int = defaults.LEASE_MS  # how long a lookup keeps hit chunks resident
    # How long reserved store slots wait for their commit: a whole forward
    # pass runs between PREPARE_STORE (layer 0) and COMMIT_STORE. The daemon
    # caps leases at 10 minutes; a dead worker's connection frees them anyway.
    save_lease_ms: int = 600000
    layerwise: bool = False       # overlap loading layer i+1 with computing layer i
    # Layerwise hits streamed from a lower tier: copy each layer in wait_for_layer_load, on
    # the forward pass's thread, instead of on a copier thread (docs/layerwise.md: no gain
    # measured with the CPU model; kept to measure the two on other hardware).
    layer_inline: bool = False
    # In layerwise mode, tell the daemon when each saved layer is in the arena (STORE_LAYER)
    # so it writes that layer to its disk tier during the pass (docs/layerwise.md).
    layer_saves: bool = True
    load_async: bool = True       # load hits that are not in RAM in the background
    cross_layer: bool = False     # ask vLLM for cross-layer blocks (one copy per block run)
    kv_layout: str = ""           # force the per-layer form: packed, block_first, kv_first, mla
    reconnect_interval: float = defaults.RECONNECT_INTERVAL  # least seconds between reconnection attempts
    namespace: str = ""
    # "tokens": keys from token ids (reproducible everywhere); "block_hashes":
    # vLLM's own block hashes (cheaper for long prompts; needs PYTHONHASHSEED).
    key_mode: str = "tokens"
    # Disaggregation (docs/disaggregation.md). pd_timeout bounds both how long a producer
    # keeps a finished prefill's blocks for its transfer and how long a
    # consumer waits for pushed chunks before pulling or giving up.
    pd_timeout: float = 30.0
    # Decode side in layerwise mode: load a pushed prompt inside the decode's first step, layer
    # by layer while the producer's per-layer push is still arriving (WAIT IN_PROGRESS, then
    # PREPARE_RETRIEVE_LAYERS), instead of asynchronously once every chunk is here. Off by
    # default: the step that loads it waits on the push, and so does every request batched with
    # it (docs/disaggregation.md, "Reading a push in progress").
    pd_layerwise: bool = False
    tcp_addr: str = ""   # this node's daemon TCP address, handed to consumers (kvtier_source)
    tcp_token: str = ""  # the token other daemons' TCP ports want
    push_to: str = ""    # the consumer daemon when a request names none (LMCache: pd_peer_host:pd_peer_init_port)
    # The daemons a request's kvtier_push_to / kvtier_source may name (comma-separated
    # host:port, or "*" for any): others are ignored, so HTTP clients cannot choose
    # where this node connects. push_to is allowed without being listed.
    pd_peers: str = ""
    # The token this connector presents to its daemon, for a daemon with
    # tenants (docs/security.md#tenants): token, token_file, or KVTIER_TOKEN /
    # KVTIER_TOKEN_FILE (auth.py). Kept out of the settings' repr.
    token: str = field(default="", repr=False)
    token_file: str = ""

    @classmethod
    def from_extra(cls, extra: Dict[str, Any]) -> "Settings":
        s = cls()
        known = set(cls.__dataclass_fields__)
        for key, value in extra.items():
            if key not in known:
                log.warning("kvtier: unknown kv_connector_extra_config key %r ignored", key)
                continue
            if value is None:  # unset: the default stands
                continue
            default = getattr(s, key)
            if key == "pd_peers" and isinstance(value, (list, tuple)):
                value = ",".join(str(x) for x in value)
            setattr(s, key, _truthy(value, key) if isinstance(default, bool) else type(default)(value))
        s.socket_path = s.socket_path or default_socket_path()
        s.token = resolve_token(s.token, s.token_file)
        if s.key_mode not in ("tokens", "block_hashes"):
            raise ValueError(f"key_mode {s.key_mode!r}: want tokens or block_hashes")
        if s.key_mode == "block_hashes" and not os.environ.get("PYTHONHASHSEED"):
            raise ValueError("key_mode block_hashes needs vLLM started with a fixed PYTHONHASHSEED: without it "
                             "vLLM's block hashes are random per process and no other engine could reuse a chunk")
        if s.kv_layout and s.kv_layout not in (kvl.PACKED, kvl.BLOCK_FIRST, kvl.KV_FIRST, kvl.MLA):
            raise ValueError(f"kv_layout {s.kv_layout!r}: want packed, block_first, kv_first or mla")
        return s

    @classmethod
    def from_config(cls, vllm_config: Any) -> "Settings":
        return cls.with_role(vllm_config)[0]

    @classmethod
    def with_role(cls, vllm_config: Any) -> Tuple["Settings", str]:
        """The settings and the connector's role: vLLM's kv_role, or LMCache's enable_pd / pd_role."""
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        lmcache = pd.take_lmcache_settings(extra)
        use_layerwise = _take_use_layerwise(extra)
        s = cls.from_extra(extra)
        if use_layerwise is not None and extra.get("layerwise") is None:
            s.layerwise = use_layerwise
        role = pd.resolve_role(getattr(ktc, "kv_role", None), lmcache)
        s.push_to = s.push_to or pd.lmcache_push_to(lmcache)
        if s.pd_timeout <= 0:
            raise ValueError(f"pd_timeout {s.pd_timeout}: want seconds > 0")
        s.peer_list()  # a bad pd_peers entry is an error at start
        return s, role

    def peer_list(self) -> pd.PeerList:
        """``pd_peers`` parsed (once per value)."""
        cached = getattr(self, "_peer_list", None)
        if cached is None or cached[0] != self.pd_peers:
            try:
                cached = (self.pd_peers, pd.PeerList.parse(self.pd_peers))
            except ValueError as e:
                raise ValueError(f"pd_peers: {e}") from None
            object.__setattr__(self, "_peer_list", cached)
        return cached[1]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _truthy(v: Any, key: str = "") -> bool:
    """A boolean setting: a bool, 0 or 1, or one of 1/true/yes/on, 0/false/no/off (any case;
    empty is false). Anything else is an error, not a silent false."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    raise ValueError(f"{key or 'a boolean setting'}: {v!r} is not a boolean (want true/false, yes/no, on/off or 1/0)")


def _take_use_layerwise(extra: Dict[str, Any], environ: Optional[Dict[str, str]] = None) -> Optional[bool]:
    """LMCache's ``use_layerwise``, which is the connector's ``layerwise``: removed from
    ``extra`` (plain or ``lmcache.``-prefixed, the prefixed one winning) or read from
    ``LMCACHE_USE_LAYERWISE``; None when none is set. An explicit ``layerwise`` wins over it."""
    env = os.environ if environ is None else environ
    value: Any = env.get("LMCACHE_USE_LAYERWISE")
    name = "LMCACHE_USE_LAYERWISE"
    for key in ("use_layerwise", "lmcache.use_layerwise"):
        if key in extra:
            value, name = extra.pop(key), key
    return None if value is None else _truthy(value, name)


_warned: Set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.warning(msg)


def _use_mla(vllm_config: Any) -> bool:
    return bool(getattr(getattr(vllm_config, "model_config", None), "use_mla", False))


def scope_of(vllm_config: Any, fmt_tag: str = "") -> Tuple[str, str, int, int]:
    """(model, format, world size, rank) — what keys are computed under.

    The format names the KV dtype and the chunk format so chunks of
    differently typed or shaped caches never match.
    """
    model_config = vllm_config.model_config
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    dtype = model_config.dtype if cache_dtype in (None, "auto") else cache_dtype
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).replace("torch.", "")
    parallel = vllm_config.parallel_config
    world = int(getattr(parallel, "tensor_parallel_size", 1)) * int(getattr(parallel, "pipeline_parallel_size", 1))
    rank = int(getattr(parallel, "rank", 0))
    tag = fmt_tag or ("KV_MLA_FMT" if _use_mla(vllm_config) else "KV_2LTD")
    return model_config.model, f"{dtype}/{tag}", world, rank


def chunk_floor(n: int, chunk: int) -> int:
    return n // chunk * chunk


# ------------------------------------------------------------- scheduler state


@dataclass
class _Lookup:
    """The answer to one get_num_new_matched_tokens, kept until the request is allocated."""

    hit: int          # tokens kvtier holds from the prompt's start
    lease: int
    local: int        # tokens vLLM holds itself
    in_ram: bool      # every hit chunk is in the daemon's RAM


@dataclass
class _Tracked:
    """Scheduler-side memory of a running request."""

    request: Any            # vLLM's Request, for live fields (publishable blocks)
    namespace: str
    tokens: Any             # TokenKeys or HashKeys of the prompt
    block_ids: List[int]
    saved_upto: int         # tokens [0, saved_upto) are in kvtier
    computed: int           # tokens computed once this step has run


@dataclass
class _Stats:
    """Counters in the shape of vLLM's KVConnectorStats.data."""

    queries: int = 0
    hit_tokens: int = 0
    load_bytes: int = 0
    save_bytes: int = 0
    load_seconds: float = 0.0
    save_seconds: float = 0.0
    load_errors: int = 0

    def take(self) -> Dict[str, Any]:
        data = dict(self.__dict__)
        self.__init__()  # type: ignore[misc]
        return data


class KVTierStats(KVConnectorStats):
    """vLLM's per-interval connector stats: plain counters that add up across workers."""

    def reset(self) -> None:
        self.data = {}

    def is_empty(self) -> bool:
        return not any(self.data.values()) if self.data else True

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        for k, v in (getattr(other, "data", None) or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        d = self.data
        out = {k: d.get(k, 0) for k in ("queries", "hit_tokens", "load_bytes", "save_bytes", "load_errors")}
        for what in ("load", "save"):
            secs = d.get(f"{what}_seconds", 0.0)
            out[f"{what}_GBps"] = round(d.get(f"{what}_bytes", 0) / secs / 1e9, 3) if secs else 0.0
        return out


@dataclass
class _Load:
    """A worker-side load in flight: arena chunks to scatter and where."""

    req: ReqMeta
    lease: int
    parts: List[Tuple[torch.Tensor, Any, int]]  # (chunk view, index on the KV's device, first token)
    nbytes: int
    skip: int = 0          # the first token of parts[0]'s chunk
    layered: bool = False  # PREPARE_RETRIEVE_LAYERS: wait for each layer (docs/layerwise.md)
    ready: int = 0         # layers the daemon said are in place in every usable chunk
    # The connection holding the lease: once it is closed the daemon has ended the lease and
    # may reuse the slots, so what is left of the load becomes load errors (_lost).
    client: Optional[Client] = None


@dataclass
class _Stream:
    """A step's layered loads still streaming in: ``wait_for_layer_load`` copies layer by layer."""

    loads: List[_Load]
    link: Link
    t0: float
    next: int = 0  # the first layer not copied yet


@dataclass
class _Save:
    req: ReqMeta
    lease: int
    parts: List[Tuple[torch.Tensor, Any]]  # (chunk view, index on the KV's device)
    count: int
    nbytes: int
    layers_done: int = 0
    # The connection holding the lease: once it is closed the save is dropped (its slots
    # may already hold other connections' chunks; the client detached them, see client.py).
    client: Optional[Client] = None

    def lost(self) -> bool:
        return self.client is not None and self.client.closed


class KVTierConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector backed by a node-local kvtier daemon."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        if kv_cache_config is not None:
            super().__init__(vllm_config, role, kv_cache_config)
        else:
            super().__init__(vllm_config, role)
        _refuse_hybrid(kv_cache_config)
        self.settings, self.kv_role = Settings.with_role(vllm_config)
        self.vllm_config = vllm_config
        self.use_mla = _use_mla(vllm_config)
        self.link = self._new_link(scope_of(vllm_config, self._format_tag()))
        self.can_save = self.kv_role in (pd.BOTH, pd.PRODUCER)
        self.can_load = self.kv_role in (pd.BOTH, pd.CONSUMER)
        s = self.settings
        if s.pd_layerwise and (not s.layerwise or self.prefer_cross_layer_blocks):
            _warn_once("kvtier: pd_layerwise has no effect %s: pushed prompts load asynchronously"
                       % ("without layerwise" if not s.layerwise else "with cross-layer blocks"))
        self.block_size = int(vllm_config.cache_config.block_size)
        self._chunk = 0
        self._scopes: Dict[Tuple[int, str], int] = {}
        self.stats = _Stats()
        # scheduler side
        self._lookups: Dict[str, _Lookup] = {}
        self._requests: Dict[str, Any] = {}  # req id -> vLLM Request, from lookup until finished
        self._token_cache: Dict[str, Any] = {}  # req id -> chunk keys, until finished
        self._loads: Dict[str, Tuple[int, int, bool]] = {}  # req id -> (load_start, load_end, async), this step
        self._tracked: Dict[str, _Tracked] = {}
        self._async_loaded: Set[str] = set()  # loaded in the background; vLLM resumes them with the tokens counted
        self._remotes: Dict[str, pd.RemotePrefill] = {}  # decode requests matched to a producer's chunks
        self._layered_remotes: Set[str] = set()  # of those, loaded in the step, layer by layer (pd_layerwise)
        # pd_layerwise: req id -> (first asked, last WAIT sent), while their pushes have not started
        self._deferred: Dict[str, Tuple[float, float]] = {}
        self._no_in_progress = False  # the daemon refused WAIT's IN_PROGRESS flag
        self._new_sends: List[SendMeta] = []  # finished prefills to hand to the workers next step
        self._sending: Set[str] = set()  # finished prefills whose blocks vLLM keeps for us
        # worker side
        self._layer_index: Dict[str, int] = {}
        self._kv: List[torch.Tensor] = []
        self._layout: Optional[kvl.Layout] = None
        self._cross: Optional[kvl.CrossLayer] = None
        self.copier: kvl.HostCopier = kvl.HostCopier()
        self._device = torch.device("cpu")
        self._load_errors: Set[int] = set()
        self._layer_ready: List[threading.Event] = []
        self._layer_loads: List[_Load] = []  # the loads the copier thread streams in this step
        self._stream: Optional[_Stream] = None  # this step's streamed loads, copied in wait_for_layer_load
        self._loader: Optional[threading.Thread] = None
        self._saves: List[_Save] = []
        self._noticed = 0  # layers of this step's saves announced with STORE_LAYER
        self._lock = threading.Lock()
        self._async_link: Optional[Link] = None
        self._layer_link: Optional[Link] = None  # PREPARE_RETRIEVE_LAYERS and LAYER_WAIT
        self._async_copier: Optional[kvl.HostCopier] = None
        self._async_copy_lock = threading.Lock()
        self._async_threads: List[threading.Thread] = []
        self._done_recving: Set[str] = set()
        self._transport: Optional[pd.Transport] = None
        self._sends: Dict[str, Tuple[pd.Job, float, bool]] = {}  # req id -> (job, deadline, pushing)
        self._pushed: Dict[str, int] = {}  # req id -> tokens pushed as they were saved
        self.send_outcomes: Dict[str, str] = {}  # req id -> pushed / failed / expired (last 1024)

    def _new_link(self, scope: Tuple[str, str, int, int]) -> Link:
        s = self.settings
        return Link(s.socket_path, scope, timeout=s.timeout, reconnect_interval=s.reconnect_interval,
                    namespace=s.namespace, name="vllm", token=s.token)

    def _format_tag(self) -> str:
        """Per-layer chunks are KV_2LTD (any layout, any block size); cross-layer chunks are raw blocks."""
        if self.prefer_cross_layer_blocks:
            name = kvl.resolved_layout_name(self.vllm_config.cache_config) or kvl.PREFERRED_CROSS_LAYER_LAYOUT
            return f"{name}/blocks{int(self.vllm_config.cache_config.block_size)}"
        return "KV_MLA_FMT" if self.use_mla else "KV_2LTD"

    # ------------------------------------------------------------ class hooks

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        """kvtier reads any layout through strides; with cross-layer blocks it prefers BLHNC."""
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        if _truthy(extra.get("cross_layer", False), "cross_layer") and not _use_mla(vllm_config):
            return kvl.PREFERRED_CROSS_LAYER_LAYOUT
        return None

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return self.settings.cross_layer and not self.use_mla

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        """Layer-by-layer waits and saves cannot be captured in a whole-model CUDA graph."""
        return True

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Optional[KVConnectorStats]:
        return KVTierStats(data=dict(data)) if data is not None else None

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: Any, per_engine_labelvalues: Any):
        """kvtier's own metrics are on the daemon's /metrics; vLLM logs the connector stats."""
        return None

    # ------------------------------------------------------------ helpers

    def _loads_async(self) -> bool:
        """Hits not in RAM load in the background unless layerwise, which streams them
        into the step layer by layer instead (docs/layerwise.md)."""
        return self.settings.load_async and not self.settings.layerwise

    def _client(self, link: Optional[Link] = None) -> Client:
        c = (link or self.link).get()
        self._chunk = c.chunk_tokens
        if link is None or link is self.link:
            self.copier.pin(c)  # a CUDA copier pins the arena saves are gathered into; else a no-op
        return c

    def _scope(self, c: Client, link: Link, namespace: str) -> int:
        if namespace == self.settings.namespace:
            return link.scope
        key = (id(c), namespace)
        handle = self._scopes.get(key)
        if handle is None:
            model, fmt, world, rank = link.scope_args
            handle = c.scope(model, fmt, world_size=world, rank=rank, namespace=namespace)
            self._scopes[key] = handle
        return handle

    def _keys(self, c: Client, link: Link, namespace: str, keys: Any, end: int, skip: int) -> p.Keys:
        return keys.build(c, self._scope(c, link, namespace), end, skip)

    # ------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """Whole cached chunks beyond ``num_computed_tokens``, never the request's last token."""
        self._release_lookup(request.request_id)
        self._requests[request.request_id] = request
        namespace = namespace_of(self.settings.namespace, request)
        self._remotes.pop(request.request_id, None)
        try:
            c = self._client()
            tokens = self._key_tokens(request)
            if tokens is None or not self.can_load:  # prompt embeddings: nothing to key by
                return 0, False
            remote = pd.RemotePrefill.of(getattr(request, "kv_transfer_params", None), self.link.scope_args,
                                         namespace, self._chunk, request.request_id, self.settings.peer_list())
            if remote is not None:
                return self._match_remote(request, remote, num_computed_tokens, len(tokens))
            skip = chunk_floor(num_computed_tokens, self._chunk)
            if isinstance(tokens, HashKeys):
                skip = 0  # hash keys always start at the prompt's first chunk
            reply = c.lookup(self._keys(c, self.link, namespace, tokens, len(tokens), skip),
                             lease_ms=self.settings.lease_ms)
        except _ABSORBED as e:
            self.link.fail(e)
            return 0, False
        in_ram = not reply.by_tier or reply.by_tier[0] >= reply.chunks
        hit = tokens.hit_tokens(reply, self._chunk)
        self._lookups[request.request_id] = _Lookup(hit, reply.lease, num_computed_tokens, in_ram)
        total = int(getattr(request, "num_tokens", 0) or len(tokens))
        usable = min(hit, chunk_floor(total - 1, self._chunk))
        self.stats.queries += 1
        n = max(0, usable - num_computed_tokens)
        self.stats.hit_tokens += n
        return n, bool(n and not in_ram and self._loads_async())

    def _match_remote(self, request: Any, remote: pd.RemotePrefill, num_computed_tokens: int,
                      prompt_len: int) -> Tuple[Optional[int], bool]:
        """A decode request: the producer's whole chunks beyond what vLLM holds, loaded
        asynchronously — or, with ``pd_layerwise`` and a push coming, in the step itself,
        layer by layer (:meth:`_pd_layered`)."""
        total = int(getattr(request, "num_tokens", 0) or prompt_len)
        usable = min(chunk_floor(remote.tokens, self._chunk), chunk_floor(total - 1, self._chunk))
        n = max(0, usable - num_computed_tokens)
        self._layered_remotes.discard(request.request_id)
        if n == 0:
            self.stats.queries += 1
            return 0, False
        layered = False
        if self._pd_layered(remote):
            started = self._push_started(request, num_computed_tokens, usable)
            if started is None:
                return None, False  # not yet: vLLM leaves the request waiting and asks again next step
            layered = started
        self.stats.queries += 1  # an answer; "ask again later" is not one
        self._remotes[request.request_id] = remote
        self._lookups[request.request_id] = _Lookup(usable, 0, num_computed_tokens, False)
        self.stats.hit_tokens += n
        if layered:
            self._layered_remotes.add(request.request_id)
        return n, not layered

    def _push_started(self, request: Any, num_computed_tokens: int, usable: int) -> Optional[bool]:
        """Whether every pushed chunk of a decode request is in this daemon or arriving
        (``WAIT`` with ``IN_PROGRESS`` that answers at once). None while it is not and the
        request has waited less than ``pd_timeout``: the step is not held for a push that has
        not started. False after that, or when the daemon cannot tell: the request is then
        loaded asynchronously, which waits for the push and asks the producer's daemon."""
        rid = request.request_id
        now = time.monotonic()
        first, last = self._deferred.get(rid, (now, float("-inf")))
        if now - last < self._recheck_s and now - first < self.settings.pd_timeout:
            return None  # asked a moment ago: the scheduler spins faster than pushes start
        self._deferred[rid] = (first, now)
        tokens = self._key_tokens(request)
        skip = 0 if isinstance(tokens, HashKeys) else chunk_floor(num_computed_tokens, self._chunk)
        want = (usable - skip) // self._chunk
        if self._no_in_progress:
            got = -1
        else:
            try:
                c = self._client()
                keys = self._keys(c, self.link, namespace_of(self.settings.namespace, request), tokens, usable, skip)
                got = c.wait(keys, 0, in_progress=True).chunks
            except _ABSORBED as e:
                if pd.refuses_in_progress(e):  # a daemon older than the flag: asynchronous loads
                    log.info("kvtier: the daemon does not count chunks in progress (%s); pd_layerwise "
                             "loads pushed prompts asynchronously", e)
                    self._no_in_progress = True
                    self.link.close()  # the daemon closes the connection after refusing a header
                else:  # a timeout, a restart: this request's check failed, the next one asks again
                    self.link.fail(e)
                got = -1
        if 0 <= got < want and now - first < self.settings.pd_timeout:
            return None
        self._deferred.pop(rid, None)
        return got >= want

    # The least time between two WAITs for one deferred request: vLLM asks for every waiting
    # request at each scheduler pass, which with decodes only can be every few milliseconds,
    # and many deferred requests would otherwise each send a WAIT on every pass.
    _recheck_s = 0.01

    def _pd_layered(self, remote: pd.RemotePrefill) -> bool:
        """Whether a decode request's pushed prompt is read in the step, layer by layer, as
        its push arrives: ``pd_layerwise`` in layerwise mode, per-layer KV (not cross-layer
        blocks), and a push announced (without one there is nothing to overlap with)."""
        s = self.settings
        return s.pd_layerwise and s.layerwise and not self.prefer_cross_layer_blocks and remote.pushed

    def _key_tokens(self, request: Any) -> Any:
        """The request's chunk keys (TokenKeys or HashKeys), computed once per request; None if it has none."""
        rid = getattr(request, "request_id", None) or getattr(request, "req_id", None)
        cached = self._token_cache.get(rid)
        if cached is not None:
            return cached
        prompt = getattr(request, "prompt_token_ids", None)
        if prompt is None:
            return None
        if self.settings.key_mode == "block_hashes":
            hashes = getattr(request, "block_hashes", None)
            if hashes is None or not self._chunk:
                return None
            n = len(prompt) // self.block_size  # prompt blocks only: outputs are not stored
            keys: Any = HashKeys.of(list(hashes[:n]), self.block_size, self._chunk)
        else:
            items = mm_items(request)
            keys = TokenKeys(array.array("I", key_tokens(prompt, items) if items else prompt))
        self._token_cache[rid] = keys
        return keys

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Records the load decided for this step; vLLM has not yet updated num_computed_tokens.

        For an asynchronous load vLLM calls this twice: first with the tokens
        to load (the load is planned now, into the blocks allocated for it),
        then with 0 once the load has finished.
        """
        rid = request.request_id
        params = getattr(request, "kv_transfer_params", None)
        if self.can_load and isinstance(params, dict) and params.get("do_remote_prefill"):
            # One transfer per request: if the load fails and vLLM asks
            # again, the request is served from what is here (or recomputed).
            params["do_remote_prefill"] = False
        if num_external_tokens <= 0:
            self._remotes.pop(rid, None)
            self._layered_remotes.discard(rid)
            self._release_lookup(rid, keep_hit=True)
            return
        look = self._lookups.get(rid) or _Lookup(0, 0, 0, True)
        layered_remote = rid in self._layered_remotes
        is_async = (rid in self._remotes and not layered_remote) or (not look.in_ram and self._loads_async())
        self._loads[rid] = (look.local, look.local + num_external_tokens, is_async)
        if is_async:
            self._plan_async(request, blocks, look)

    def _plan_async(self, request: Any, blocks: Any, look: _Lookup) -> None:
        """An asynchronous load is not scheduled this step: remember it to ship with this step's metadata."""
        tokens = self._key_tokens(request)
        block_ids = _first_group(_block_ids_of(blocks))
        state = _Tracked(request, namespace_of(self.settings.namespace, request), tokens, block_ids,
                         chunk_floor(look.hit, self._chunk or 1), look.local)
        self._tracked[request.request_id] = state
        self._async_loaded.add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = KVTierConnectorMetadata()
        for req_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._forget(req_id)
        meta.sends, self._new_sends = self._new_sends, []
        self._ship_async_loads(meta)
        for new in scheduler_output.scheduled_new_reqs:
            self._track_new(new, scheduler_output.num_scheduled_tokens[new.req_id], meta)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_blocks, computed, resumed in _cached_requests(cached):
            self._track_cached(req_id, new_blocks, computed, resumed,
                               scheduler_output.num_scheduled_tokens[req_id], meta)
        self._loads.clear()
        return meta

    def _ship_async_loads(self, meta: KVTierConnectorMetadata) -> None:
        for rid, (start, end, is_async) in list(self._loads.items()):
            state = self._tracked.get(rid)
            if not is_async or state is None:
                continue
            meta.requests.append(ReqMeta(rid, state.namespace, state.tokens, list(state.block_ids),
                                         start, end, load_async=True, remote=self._remotes.pop(rid, None)))
            del self._loads[rid]

    def _track_new(self, new: Any, scheduled: int, meta: KVTierConnectorMetadata) -> None:
        state = self._tracked.get(new.req_id)
        block_ids = _first_group(new.block_ids)
        if new.req_id in self._async_loaded and state is not None:
            # Loaded in the background: vLLM now counts those tokens as computed.
            self._async_loaded.discard(new.req_id)
            state.block_ids, state.computed = block_ids, new.num_computed_tokens + scheduled
            # Chunks whose load failed are recomputed now: let them be saved again.
            state.saved_upto = min(state.saved_upto, chunk_floor(new.num_computed_tokens, self._chunk or 1))
            self._lookups.pop(new.req_id, None)
        else:
            request = self._request_of(new)
            tokens = self._key_tokens(request)
            if tokens is None:
                return  # prompt embeddings are not cached
            look = self._lookups.get(new.req_id) or _Lookup(0, 0, 0, True)
            state = _Tracked(request, namespace_of(self.settings.namespace, request), tokens, block_ids,
                             chunk_floor(max(look.hit, 0), self._chunk or 1), new.num_computed_tokens + scheduled)
            self._tracked[new.req_id] = state
        self._emit(new.req_id, state, meta)

    def _request_of(self, new: Any) -> Any:
        """The vLLM Request seen by get_num_new_matched_tokens (it has cache_salt), else the NewRequestData."""
        req = self._requests.get(new.req_id)
        return req if req is not None else new

    def _track_cached(self, req_id: str, new_blocks: Optional[List[int]], computed: int, resumed: bool,
                      scheduled: int, meta: KVTierConnectorMetadata) -> None:
        state = self._tracked.get(req_id)
        if state is None:
            return
        if resumed:
            # Preempted and scheduled again: the old blocks were freed and may
            # hold another request's KV now. The new list replaces them.
            state.block_ids = list(new_blocks or [])
            self._async_loaded.discard(req_id)
        elif new_blocks:
            state.block_ids.extend(new_blocks)
        if computed < state.computed:
            # vLLM rewound the request (a failed load or preemption): what
            # was computed beyond this point is being recomputed, so save it again.
            state.saved_upto = min(state.saved_upto, chunk_floor(computed, self._chunk or 1))
        if resumed:
            look = self._lookups.pop(req_id, None)
            if look is not None:
                state.saved_upto = max(state.saved_upto, chunk_floor(min(look.hit, computed), self._chunk or 1))
        state.computed = computed + scheduled
        self._emit(req_id, state, meta)

    def _emit(self, req_id: str, state: _Tracked, meta: KVTierConnectorMetadata) -> None:
        load_start, load_end, is_async = self._loads.get(req_id, (0, 0, False))
        if is_async:
            load_start = load_end = 0  # shipped already
        remote = None
        if req_id in self._layered_remotes:  # a pushed prompt read in this step, layer by layer
            self._layered_remotes.discard(req_id)
            remote = self._remotes.pop(req_id, None) if load_end > load_start else None
        req = ReqMeta(req_id, state.namespace, state.tokens, list(state.block_ids), load_start, load_end,
                      remote=remote)
        self._add_save(req, state)
        if req.save_end > req.save_start:
            push = pd.PushRequest.of(getattr(state.request, "kv_transfer_params", None), req_id,
                                     self.settings.push_to, self.settings.peer_list())
            req.push = push if push is not None and push.push_to else None
        if req.load_end or req.save_end:
            meta.requests.append(req)

    def _add_save(self, req: ReqMeta, state: _Tracked) -> None:
        if not self.can_save or not self._chunk:
            return
        limit = min(state.computed, len(state.tokens))
        publishable = getattr(state.request, "num_publishable_block_hashes", None)
        if isinstance(publishable, int):
            limit = min(limit, publishable * self.block_size)
        end = chunk_floor(limit, self._chunk)
        if end > state.saved_upto:
            req.save_start, req.save_end = state.saved_upto, end
            state.saved_upto = end

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[dict]]:
        """Saves happen inside the step (wait_for_save), so blocks can be freed at once — except
        for a prefill to be decoded elsewhere (``do_remote_decode``).

        That request's chunks are sent to the consumer's daemon after this
        step; vLLM keeps its blocks until the worker reports it in
        ``finished_sending`` (the push is done, failed, or ``pd_timeout``
        passed), and the answer tells the decode side where the chunks are.
        """
        rid = request.request_id
        state = self._tracked.get(rid)
        self._forget(rid)
        push = pd.PushRequest.of(getattr(request, "kv_transfer_params", None), rid, self.settings.push_to,
                                 self.settings.peer_list())
        if push is None or not self.can_save or _aborted(request):
            return False, None
        namespace = namespace_of(self.settings.namespace, request)
        saved = state.saved_upto if state is not None else 0
        # kvtier_pushed: a push will come. None does for a prompt under one chunk.
        params = pd.decode_params(push, self.link.scope_args, namespace, self._chunk, saved,
                                  self.settings.tcp_addr, bool(push.push_to) and saved > 0)
        if saved <= 0:
            return False, params  # nothing stored (a prompt under one chunk): the consumer computes it
        self._new_sends.append(SendMeta(rid, pd.Job(push.transfer_id, namespace, state.tokens, saved,
                                                    push.push_to)))
        self._sending.add(rid)
        return True, params

    def update_connector_output(self, connector_output: Any) -> None:
        """vLLM passes the workers' finished transfers; sends reported done no longer keep the engine stepping."""
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self._sending.discard(rid)

    def has_pending_push_work(self) -> bool:
        """True while a finished prefill's transfer is unreported: vLLM keeps stepping so get_finished runs."""
        return bool(self._sending or self._new_sends)

    def _forget(self, req_id: str) -> None:
        self._release_lookup(req_id)
        self._layered_remotes.discard(req_id)
        self._remotes.pop(req_id, None)
        self._deferred.pop(req_id, None)
        self._tracked.pop(req_id, None)
        self._async_loaded.discard(req_id)
        self._requests.pop(req_id, None)
        self._token_cache.pop(req_id, None)

    def _release_lookup(self, req_id: str, keep_hit: bool = False) -> None:
        """Ends the lookup's lease; ``keep_hit`` remembers how much kvtier holds (it need not be saved)."""
        look = self._lookups.get(req_id)
        if look is None:
            return
        lease = look.lease
        if keep_hit:
            look.lease = 0
        else:
            del self._lookups[req_id]
        c = self.link.client
        if lease and c is not None and not c.closed:
            try:
                c.release(lease)
            except _ABSORBED as e:  # an expired lease is not worth more than a log line
                if isinstance(e, ConnectionError):
                    self.link.fail(e)

    def reset_cache(self) -> Optional[bool]:
        """vLLM reset its own prefix cache; kvtier's chunks stay valid (they are keyed by content)."""
        return True

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        data = self.stats.take()
        if not any(data.values()):
            return None
        return KVTierStats(data=data)

    # --------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}
        self._kv = list(kv_caches.values())
        first = self._kv[0]
        form = self.settings.kv_layout or self._configured_form(first)
        self._layout = kvl.Layout.detect(first, use_mla=self.use_mla, form=form, block_size=self.block_size)
        self._set_device(first.device)

    def register_cross_layers_kv_cache(self, kv_cache: torch.Tensor, attn_backend: Any = None) -> None:
        name = kvl.resolved_layout_name(self.vllm_config.cache_config) or kvl.PREFERRED_CROSS_LAYER_LAYOUT
        num_layers = self._num_attention_layers(kv_cache)
        self._cross = kvl.CrossLayer.of(kv_cache, name, num_layers, use_mla=self.use_mla)
        if not self.link.scope_args[1].endswith(f"/{name}/blocks{self.block_size}"):
            raise ValueError(f"cross-layer KV in layout {name}, but the scheduler keys chunks as "
                             f"{self.link.scope_args[1]}: set the same layout for both")
        self._kv = list(self._cross.per_layer)
        self._layout = self._cross.layer
        if self._layout.block_size != self.block_size:
            raise ValueError(f"cross-layer KV block size {self._layout.block_size} != {self.block_size}")
        self._set_device(kv_cache.device)

    def _num_attention_layers(self, kv_cache: torch.Tensor) -> int:
        groups = getattr(getattr(self, "_kv_cache_config", None), "kv_cache_groups", None)
        if groups:
            return sum(len(getattr(g, "layer_names", ())) for g in groups)
        name = kvl.resolved_layout_name(self.vllm_config.cache_config) or kvl.PREFERRED_CROSS_LAYER_LAYOUT
        return kv_cache.shape[name.index("L")] if kv_cache.is_contiguous() else kv_cache.shape[0]

    def _configured_form(self, t: torch.Tensor) -> str:
        """The per-layer form from vLLM's config: a resolved standard layout means packed."""
        if self.use_mla:
            return kvl.MLA
        if kvl.resolved_layout_name(self.vllm_config.cache_config) in kvl.STANDARD_LAYOUTS:
            return kvl.PACKED
        return ""

    def _set_device(self, device: torch.device) -> None:
        self._device = device
        self.copier = kvl.copier_for(device)
        if device.type == "cuda":  # pragma: no cover - needs a GPU
            try:
                self._client()  # connects now, so the arena is pinned before the first step
            except _ABSORBED as e:
                self.link.fail(e)

    @property
    def _layers(self) -> int:
        return len(self._kv)

    def _layer_of(self, layer_name: str) -> int:
        i = self._layer_index.get(layer_name)
        if i is None:
            if self._cross is None:
                raise KeyError(f"kvtier: unknown attention layer {layer_name!r}")
            # Cross-layer registration names no layers: they arrive in order the first time through.
            i = self._layer_index[layer_name] = len(self._layer_index)
        return i

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Leases the chunks of every loading request and copies them in (or starts the copier)."""
        self._saves = []
        self._finish_stream()
        self._layer_ready, self._layer_loads = [], []
        meta = self._get_connector_metadata()
        for send in meta.sends:
            self._start_send(send)
        reqs = [r for r in meta.requests if r.load_end > r.load_start]
        for r in reqs:
            if r.load_async:
                self._start_async_load(r)
        layered = self.settings.layerwise and self._cross is None
        # Layered loads have a connection of their own: LAYER_WAIT blocks it while the
        # forward pass saves through the main one.
        link = self._layered_link() if layered else self.link
        prepare = (lambda r: self._prepare_load(r, link, True)) if layered else (lambda r: self._prepare_load(r, link))
        if layered:
            for r in reqs:
                if not r.load_async and r.remote is not None:
                    self._await_push_start(r, link)
        loads = [l for l in (prepare(r) for r in reqs if not r.load_async) if l]
        if not loads:
            return
        if layered:
            # A prefix all in RAM answers the first LAYER_WAIT with every layer: it is copied
            # here, as without layerwise, rather than by a thread racing the forward pass.
            for load in loads:
                self._await_layer(link, load, 0)
            layered = any(load.ready != p.ALL_LAYERS for load in loads)
        # Once, on this thread, whose stream made the index tensors: the load stream waits
        # for it here, and the scatters (here, on the loader thread or inline) only enter it.
        self.copier.begin_loads()
        if not layered:
            self._copy_layers(loads, link, self.copier, [])
            return
        if self.settings.layer_inline:
            # Streamed from a lower tier: wait_for_layer_load waits for each layer (the
            # daemon reads them in the background, no Python thread involved) and copies it
            # on the forward pass's own thread, so no copier thread contends for the GIL.
            self._stream = _Stream(loads, link, time.perf_counter())
            return
        self._layer_ready = [threading.Event() for _ in range(self._layers)]
        self._layer_loads = loads
        self._loader = threading.Thread(target=self._copy_layers, args=(loads, link, self.copier,
                                                                         self._layer_ready),
                                        name="kvtier-load", daemon=True)
        self._loader.start()

    def _layered_link(self) -> Link:
        if self._layer_link is None:
            self._layer_link = self._new_link(self.link.scope_args)
        return self._layer_link

    def _prepare_load(self, req: ReqMeta, link: Link, layered: bool = False) -> Optional[_Load]:
        """PREPARE_RETRIEVE (or, layered, PREPARE_RETRIEVE_LAYERS) for one request;
        unavailable chunks become load errors."""
        got_end, slots, skip = req.load_start, None, 0
        try:
            c = self._client(link)
            skip = chunk_floor(req.load_start, self._chunk)
            keys = self._keys(c, link, req.namespace, req.keys, req.load_end, skip)
            if layered:
                slots = c.prepare_retrieve_layers(keys, self._layers, self._layout.parts, self.settings.lease_ms)
            else:
                slots = c.prepare_retrieve(keys, self.settings.lease_ms)
            parts, nbytes = [], 0
            for i, s in enumerate(slots.slots):
                begin = skip + i * self._chunk
                first = max(0, req.load_start - begin)
                parts.append(self._load_part(c.slot_tensor(s), req.block_ids, begin, first))
                nbytes += s.length
            got_end = max(req.load_start, skip + len(slots.slots) * self._chunk)
        except _ABSORBED as e:
            link.fail(e)
            got_end = req.load_start
        self._fail_blocks(req, got_end, req.load_end)
        if slots is None or not slots.slots or got_end <= req.load_start:
            self._release_quietly(link, slots.lease if slots else 0)
            return None
        return _Load(req, slots.lease, parts, nbytes, skip=skip, layered=layered, client=c)

    def _load_part(self, raw: torch.Tensor, block_ids: List[int], begin: int, first: int):
        if self._cross is not None:
            view = self._cross.chunk_view(raw)
            if view.shape[0] * self.block_size != self._chunk:
                raise ValueError(f"chunk of {view.shape[0]} blocks, want {self._chunk // self.block_size}")
            if first % self.block_size:
                raise ValueError("cross-layer load starting inside a block")
            b0 = (begin + first) // self.block_size
            nb = self._chunk // self.block_size - first // self.block_size
            index = torch.as_tensor(block_ids[b0:b0 + nb], dtype=torch.int64).to(self._device)
            return view, index, first // self.block_size
        view = kvl.chunk_view(raw, self._layout, self._layers)
        if view.shape[2] != self._chunk:
            raise ValueError(f"chunk of {view.shape[2]} tokens, want {self._chunk}")
        index = kvl.token_index(block_ids, self.block_size, begin + first, begin + self._chunk, self._device)
        return view, index, first

    def _fail_blocks(self, req: ReqMeta, start: int, end: int) -> None:
        if start >= end:
            return
        first, last = start // self.block_size, (end - 1) // self.block_size
        with self._lock:
            self._load_errors.update(req.block_ids[first:last + 1])
            self.stats.load_errors += last + 1 - first

    def _copy_layers(self, loads: List[_Load], link: Link, copier: kvl.HostCopier,
                     ready: List[threading.Event]) -> None:
        """Scatters every layer of every load, in layer order, signalling each layer as it lands.

        ``ready`` holds this step's per-layer events (layerwise loads); an
        asynchronous load passes none and its own copier, so it can never
        signal, or be waited on as, the step's layers.
        """
        t0 = time.perf_counter()
        try:
            if self._cross is not None:
                for load in loads:
                    self._scatter(copier, load)
            else:
                for layer, kv in enumerate(self._kv):
                    for load in loads:
                        self._await_layer(link, load, layer)
                        self._scatter(copier, load, layer, kv)
                    copier.layer_done(layer)
                    if ready:
                        ready[layer].set()
            # The loads alone: this may be the loader thread, and the forward pass's saves
            # (and their fence) belong to the forward pass's thread. Past this the load
            # stream is idle: the slots may be released and the KV used by any stream.
            copier.sync_loads()
            for load in loads:
                self._lost(load)
            with self._lock:
                self.stats.load_bytes += sum(l.nbytes for l in loads)
                self.stats.load_seconds += time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - must not escape a background thread
            log.error("kvtier: copying loaded KV: %s", e)
            for load in loads:
                self._fail_blocks(load.req, load.req.load_start, load.req.load_end)
            _sync_loads_quietly(copier)  # scatters issued before the error still read the slots
        finally:
            for ev in ready:
                ev.set()
            for load in loads:
                self._release_quietly(link, load.lease)

    def _scatter(self, copier: kvl.HostCopier, load: _Load, layer: int = -1, kv: Any = None) -> None:
        """Copies one layer (cross-layer: every block) of a load out of its slots, issued under
        its client's copy lock so that a close on another thread waits for the copies and the
        load's slots are never read once the client has closed.

        On CUDA the whole scatter (staging tensor, host copy, index write into the paged KV)
        goes on the copier's load stream, in order, after what the calling thread's stream
        had queued; the compute stream waits for it through the layer's event
        (``wait_layer``) or, once the loads are all issued, ``sync_loads``."""
        try:
            with _copies(load.client), copier.on_load_stream(*_indexes(load.parts)):
                for view, index, first in load.parts:
                    if kv is None:
                        self._cross.scatter(copier, view, index, first)
                    else:
                        kvl.scatter_layer(copier, view, layer, self._layout, kv, index, first)
        except ConnectionLost:
            pass  # closed: _lost turns the load into load errors
        self._lost(load)

    def _lost(self, load: _Load) -> bool:
        """Whether the load's connection closed (its lease ended, its slots free for other
        connections' chunks): checked after each scatter from its slots, so nothing read
        from them once the lease may have ended is trusted. Its blocks become load errors
        (layers already copied are overwritten by the recompute) and it copies nothing more."""
        if load.client is None or not load.client.closed:
            return False
        if load.parts or load.nbytes:
            log.warning("kvtier: the connection of %s's load closed mid-copy; its blocks are recomputed",
                        load.req.req_id)
            self._fail_blocks(load.req, load.req.load_start, load.req.load_end)
            load.parts.clear()
            load.nbytes = 0
        return True

    def _await_layer(self, link: Link, load: _Load, layer: int) -> None:
        """LAYER_WAIT for a layered load, unless the daemon already said the layer is in.

        Chunks the daemon could not load (a damaged layer, a tier that failed
        mid-stream) and chunks whose layer did not come in time leave the load
        here: their blocks become load errors and are recomputed. Layers of
        them already copied are overwritten by the recompute."""
        if not load.layered or load.ready > layer:
            return
        usable = 0
        try:
            r = link.get().layer_wait(load.lease, layer,
                                      timeout=self.settings.lease_ms / 1000.0 + self.settings.timeout)
            usable, load.ready = r.usable, r.ready
        except _ABSORBED as e:
            if isinstance(e, ConnectionError):
                link.fail(e)
        if load.ready <= layer:  # the wait ran out or failed: trust no more of it
            usable, load.ready = 0, p.ALL_LAYERS
        if usable < len(load.parts):
            start = max(load.req.load_start, load.skip + usable * self._chunk)
            self._fail_blocks(load.req, start, load.req.load_end)
            del load.parts[usable:]
            load.nbytes = 0 if not load.parts else load.nbytes

    def _stream_upto(self, end: int) -> None:
        """Copies the streamed loads' layers up to ``end`` (exclusive), each after its
        LAYER_WAIT; after the last layer, or on an error, the step's stream is done."""
        st = self._stream
        if st is None:
            return
        # On CUDA the whole scatter goes on the copier's load stream (_scatter), whose
        # per-layer event the compute stream then waits for, as it does for the copier
        # thread: this thread's current stream is the compute one.
        try:
            while st.next < min(end, self._layers):
                layer, kv = st.next, self._kv[st.next]
                for load in st.loads:
                    self._await_layer(st.link, load, layer)
                    self._scatter(self.copier, load, layer, kv)
                self.copier.layer_done(layer)
                st.next += 1
            if st.next < self._layers:
                return
            self.copier.sync_loads()
            for load in st.loads:
                self._lost(load)
            with self._lock:
                self.stats.load_bytes += sum(l.nbytes for l in st.loads)
                self.stats.load_seconds += time.perf_counter() - st.t0
        except Exception as e:  # noqa: BLE001 - a failed load is a recompute, not a failed step
            log.error("kvtier: copying loaded KV: %s", e)
            for load in st.loads:
                self._fail_blocks(load.req, load.req.load_start, load.req.load_end)
            _sync_loads_quietly(self.copier)  # scatters issued before the error still read the slots
        self._stream = None
        for load in st.loads:
            self._release_quietly(st.link, load.lease)

    def _finish_stream(self) -> None:
        """Copies whatever layers of the step's streamed loads the pass did not wait for,
        and releases their leases."""
        self._stream_upto(self._layers)

    def _release_quietly(self, link: Link, lease: int) -> None:
        c = link.client
        if not lease or c is None or c.closed:
            return
        try:
            c.release(lease)
        except _ABSORBED as e:
            if isinstance(e, ConnectionError):
                link.fail(e)

    # ----- asynchronous loads

    def _start_async_load(self, req: ReqMeta) -> None:
        if self._async_link is None:
            self._async_link = self._new_link(self.link.scope_args)
        t = threading.Thread(target=self._async_load, args=(req,), name=f"kvtier-async-{req.req_id}", daemon=True)
        self._async_threads.append(t)
        t.start()

    def _async_load(self, req: ReqMeta) -> None:
        """Promotes the request's chunks (PREPARE_RETRIEVE waits for disk or remote), copies them in."""
        link = self._async_link
        try:
            if req.remote is not None:
                self._fetch_remote(req, link)
            else:
                self._load_async_part(req, link)
        except Exception as e:  # noqa: BLE001 - vLLM must hear back, or the request waits forever
            log.error("kvtier: asynchronous load of %s: %s", req.req_id, e)
            self._fail_blocks(req, req.load_start, req.load_end)
        finally:
            with self._lock:
                self._done_recving.add(req.req_id)

    def _load_async_part(self, req: ReqMeta, link: Link) -> None:
        """Leases ``[req.load_start, req.load_end)`` and copies it in; what is missing becomes load errors."""
        load = self._prepare_load(req, link)
        if load is not None:
            if self._async_copier is None:
                self._async_copier = kvl.copier_for(self._device)
            with self._async_copy_lock:  # one asynchronous load copies at a time through its copier
                self._async_copier.begin_loads()  # after this thread's index tensors
                self._copy_layers([load], link, self._async_copier, [])

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        with self._lock:
            done, self._done_recving = self._done_recving, set()
        self._async_threads = [t for t in self._async_threads if t.is_alive()]
        for rid in finished_req_ids or ():
            self._pushed.pop(rid, None)  # finished without a send (aborted): its push just times out
        return (self._finished_sends() or None), (done or None)

    # ----- disaggregation (docs/disaggregation.md)

    def _pd(self) -> pd.Transport:
        with self._lock:  # asynchronous loads may ask first, from their own threads
            if self._transport is None:
                s = self.settings
                self._transport = pd.DaemonTransport(self._new_link(self.link.scope_args), s.tcp_token, s.timeout,
                                                     push_timeout=s.pd_timeout)
            return self._transport

    def _push_saved(self, req: ReqMeta) -> None:
        """Pushes chunks as soon as they are committed, so the transfer overlaps the rest of the prefill."""
        start = self._pushed.get(req.req_id, 0)
        job = pd.Job(req.push.transfer_id, req.namespace, req.keys, req.save_end, req.push.push_to)
        try:
            self._pd().push(job, start=start, last=False)
        except _ABSORBED as e:  # the last push, at request_finished, settles the transfer
            log.warning("kvtier: pushing %s: %s", req.req_id, e)
            return
        self._pushed[req.req_id] = req.save_end

    def _start_send(self, send: SendMeta) -> None:
        """Ends a finished prefill's push (its last chunks, flagged last); without a consumer
        address its chunks wait in this daemon to be pulled."""
        job = send.job
        pushing = bool(job.peer)
        start = self._pushed.pop(send.req_id, 0)
        if pushing:
            self._pd().push(job, start=start, last=True)
        self._sends[send.req_id] = (job, time.monotonic() + self.settings.pd_timeout, pushing)

    def _finished_sends(self) -> Set[str]:
        """Sends whose blocks vLLM may free: pushed, failed (nobody will read them), or past pd_timeout."""
        out: Set[str] = set()
        now = time.monotonic()
        for rid, (job, deadline, pushing) in list(self._sends.items()):
            state = self._pd().state(job.transfer_id) if pushing else pd.PENDING
            if state == pd.PENDING and now < deadline:
                continue
            outcome = {pd.DONE: "pushed", pd.FAILED: "failed"}.get(state, "expired")
            if outcome != "pushed":
                log.warning("kvtier: transfer %s of %s %s; its blocks are freed", job.transfer_id, rid, outcome)
            if pushing:
                self._pd().forget(job.transfer_id)
            del self._sends[rid]
            if len(self.send_outcomes) >= 1024:
                self.send_outcomes.pop(next(iter(self.send_outcomes)))
            self.send_outcomes[rid] = outcome
            out.add(rid)
        return out

    def _fetch_remote(self, req: ReqMeta, link: Link) -> None:
        """Loads a producer's chunks as they arrive in this daemon, each run as soon as it is
        there (reading frees the receive budget the push needs for the next chunks), then the
        rest from wherever the daemon finds it (its own tiers: disk, remote, P2P peers it is
        configured with); what is still missing becomes load errors."""
        r = req.remote
        job = pd.Job(r.transfer_id, req.namespace, req.keys, req.load_end, r.source)
        loaded = [req.load_start]  # tokens copied in so far

        def ready(upto: int) -> None:
            upto = min(upto, req.load_end)
            if upto > loaded[0]:
                self._load_async_part(dataclasses.replace(req, load_start=loaded[0], load_end=upto, remote=None),
                                      link)
                loaded[0] = upto

        try:
            self._pd().fetch(job, link, time.monotonic() + self.settings.pd_timeout, r.pushed, req.load_start, ready)
        except _ABSORBED as e:
            link.fail(e)
        if loaded[0] < req.load_end:
            if r.pushed:
                log.warning("kvtier: transfer %s of %s: %d of %d tokens arrived; the rest is read from this "
                            "daemon's tiers or recomputed (kv_load_failure_policy decides)",
                            r.transfer_id, req.req_id, loaded[0], req.load_end)
            self._load_async_part(dataclasses.replace(req, load_start=loaded[0], remote=None), link)

    def _await_push_start(self, req: ReqMeta, link: Link) -> None:
        """A pushed prompt read in the step (``pd_layerwise``): waits only until its chunks'
        pushes have started — their first ranges are in this daemon — so that
        PREPARE_RETRIEVE_LAYERS takes them while later layers are still arriving and
        wait_for_layer_load follows each layer. The scheduler side scheduled the request
        once it saw exactly that, so this returns at once unless a push failed in between;
        the step then waits at most ``timeout`` (less if the producer's daemon reports the
        failure), and what is missing is read from this daemon's tiers by the prepare, or
        becomes load errors: the recompute of vLLM's load-error path."""
        r = req.remote
        job = pd.Job(r.transfer_id, req.namespace, req.keys, req.load_end, r.source)
        transport = self._pd()
        deadline = time.monotonic() + min(self.settings.pd_timeout, self.settings.timeout)
        try:
            if isinstance(transport, pd.DaemonTransport):
                got = transport.started(job, link, deadline, req.load_start)
            else:
                got = transport.fetch(job, link, deadline, True, req.load_start)
        except _ABSORBED as e:
            link.fail(e)
            return
        if got < req.load_end:
            log.warning("kvtier: transfer %s of %s: %d of %d tokens on their way; the rest is read from this "
                        "daemon's tiers or recomputed", r.transfer_id, req.req_id, got, req.load_end)

    # ----- layer hooks

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until the layer's loaded KV is in place (layerwise mode only)."""
        if self._stream is not None:
            i = self._layer_of(layer_name)
            self._stream_upto(i + 1)
            self.copier.wait_layer(i)
            return
        if not self._layer_ready:
            return
        i = self._layer_of(layer_name)
        # The copier sets layer i's event once every load's LAYER_WAIT for it has answered,
        # each bounded by lease_ms + timeout (a layer may take that long to come from a
        # lower tier or a push). Past the bound the pass cannot use the step's layered
        # loads: every one of them becomes load errors (vLLM recomputes those blocks, and
        # what the copier still writes into them is overwritten), and the pass stops waiting.
        if not self._layer_ready[i].wait(timeout=self._layer_wait_limit()):
            log.error("kvtier: layer %s not loaded in time; the step's layered loads are recomputed", layer_name)
            for load in self._layer_loads:
                self._fail_blocks(load.req, load.req.load_start, load.req.load_end)
            self._layer_ready, self._layer_loads = [], []
            return
        self.copier.wait_layer(i)

    def _layer_wait_limit(self) -> float:
        """How long wait_for_layer_load waits for one layer from the copier thread: at least
        one LAYER_WAIT's bound (lease_ms + timeout), never under a minute."""
        return max(60.0, self.settings.lease_ms / 1000.0 + self.settings.timeout)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        """Copies this layer's K/V of every chunk being saved straight into the arena slots."""
        layer = self._layer_of(layer_name)
        if layer == 0:
            self._saves = self._prepare_saves()
            self._noticed = 0
        if self._cross is not None:
            return  # whole blocks are copied once every layer is written (wait_for_save)
        for save in self._saves:
            if save.lost():
                continue  # its lease ended with its connection: layers_done falls short, it is dropped
            try:
                with _copies(save.client):  # a close on another thread waits for these copies
                    for chunk, index in save.parts:
                        kvl.gather_layer(self.copier, chunk, layer, self._layout, kv_layer, index, save.client)
                save.layers_done += 1
            except ConnectionLost:
                continue  # closed on another thread since lost() was checked: dropped the same way
            except _ABSORBED as e:  # the save is dropped at commit time: layers_done falls short
                log.error("kvtier: gathering layer %s: %s", layer_name, e)
        if self.settings.layerwise and self.settings.layer_saves and self._saves:
            self.copier.save_layer_done(layer)
            self._notice_layers(layer)

    def _notice_layers(self, upto: int) -> None:
        """Sends STORE_LAYER for each layer up to ``upto``, in order, whose save copies have
        landed in the arena: a one-way frame per save, so the forward pass never waits on the
        daemon. A layer whose copies are still in flight (a GPU's) is sent with a later one."""
        while self._noticed <= upto and self.copier.save_layer_landed(self._noticed):
            layer = self._noticed
            for save in self._saves:
                if save.layers_done <= layer:
                    continue  # its gather failed: the commit gives it up
                try:
                    self._client().store_layer(save.lease, layer, self._layers, self._layout.parts)
                except _ABSORBED as e:  # the commit will find the link down as well
                    self.link.fail(e)
                    return
            self._noticed += 1

    def _prepare_saves(self) -> List[_Save]:
        meta = self._get_connector_metadata()
        with self._lock:
            failed = set(self._load_errors)
        saves = []
        for req in meta.requests:
            if req.save_end <= req.save_start or failed.intersection(req.block_ids):
                continue  # KV computed on top of a failed load is not worth keeping
            s = self._prepare_save(req)
            if s is not None:
                saves.append(s)
        return saves

    def _prepare_save(self, req: ReqMeta) -> Optional[_Save]:
        try:
            c = self._client()
            n = (req.save_end - req.save_start) // self._chunk
            size = self._chunk_bytes()
            keys = self._keys(c, self.link, req.namespace, req.keys, req.save_end, req.save_start)
            slots = c.prepare_store(keys, [size] * n, self.settings.save_lease_ms)
            parts = []
            for i, s in enumerate(slots.slots):
                if s.state != p.SLOT_WRITE:
                    continue
                begin = req.save_start + i * self._chunk
                parts.append(self._save_part(c.slot_tensor(s), req.block_ids, begin))
        except _ABSORBED as e:
            self.link.fail(e)
            return None
        if not slots.lease:
            return None
        if req.push is not None and self.settings.layerwise and self.settings.layer_saves:
            self._push_early(req, slots.lease, c)
        return _Save(req, slots.lease, parts, len(slots.slots), size * len(parts), client=c)

    def _push_early(self, req: ReqMeta, lease: int, c: Any) -> None:
        """Pushes a save's chunks as it starts: the daemon sends each layer as its STORE_LAYER
        notice comes, so the transfer overlaps the forward pass (docs/disaggregation.md). Only
        when the push is up to this save's first chunk; otherwise, or when the daemon cannot,
        the chunks are pushed after the commit."""
        start = self._pushed.get(req.req_id, 0)
        if start != req.save_start:
            return
        job = pd.Job(req.push.transfer_id, req.namespace, req.keys, req.save_end, req.push.push_to)
        transport = self._pd()
        if isinstance(transport, pd.DaemonTransport) and transport.push_store(job, start, lease, c):
            self._pushed[req.req_id] = req.save_end

    def _chunk_bytes(self) -> int:
        if self._cross is not None:
            return self._cross.chunk_bytes(self._chunk // self.block_size)
        return self._layout.chunk_bytes(self._layers, self._chunk)

    def _save_part(self, raw: torch.Tensor, block_ids: List[int], begin: int):
        if self._cross is not None:
            b0 = begin // self.block_size
            index = torch.as_tensor(block_ids[b0:b0 + self._chunk // self.block_size], dtype=torch.int64)
            return self._cross.chunk_view(raw), index.to(self._device)
        index = kvl.token_index(block_ids, self.block_size, begin, begin + self._chunk, self._device)
        return kvl.chunk_view(raw, self._layout, self._layers), index

    def wait_for_save(self) -> None:
        """Commits the chunks gathered during the forward pass (whole chunks, all layers)."""
        if self._loader is not None:
            self._loader.join()
            self._loader = None
        self._finish_stream()
        saves, self._saves = self._saves, []
        t0 = time.perf_counter()
        ok = self._finish_saves(saves)
        for save, complete in zip(saves, ok):
            if save.lost():
                log.warning("kvtier: the connection of %s's save closed during the step; the save is dropped",
                            save.req.req_id)
                continue  # the lease ended with it: nothing to commit, on no connection
            try:
                self._client().commit_store(save.lease, save.count if complete else 0)
                if complete:
                    self.stats.save_bytes += save.nbytes
            except _ABSORBED as e:
                self.link.fail(e)
                complete = False
            if complete and save.req.push is not None:
                self._push_saved(save.req)
        self.stats.save_seconds += time.perf_counter() - t0

    def _finish_saves(self, saves: List[_Save]) -> List[bool]:
        """Copies cross-layer blocks now that every layer is written, then waits for the host copies."""
        ok = []
        for save in saves:
            if self._cross is None or save.lost():
                ok.append(save.layers_done == self._layers and not save.lost())
                continue
            try:
                with _copies(save.client):  # a close on another thread waits for these copies
                    for chunk, index in save.parts:
                        self._cross.gather(self.copier, chunk, index, save.client)
                ok.append(True)
            except ConnectionLost:
                ok.append(False)  # closed on another thread: dropped, as save_kv_layer does
            except _ABSORBED as e:
                log.error("kvtier: gathering cross-layer blocks: %s", e)
                ok.append(False)
        try:
            self.copier.fence()
        except RuntimeError as e:  # a device fault
            # Nothing gathered this step can be trusted, and the copier has dropped what it
            # held (fence resets its state): give the leases up with the connection, so no
            # slot of them is committed or written again.
            log.error("kvtier: waiting for host copies: %s", e)
            self.link.fail(ConnectionLost(f"kvtier: host copies failed: {e}"))
            return [False] * len(saves)
        return ok

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        """Preempted requests' blocks are about to be reused: no save may still be reading them.

        Saves finish inside the step that gathered them (``wait_for_save``
        fences the host copies before committing), so by the time vLLM calls
        this nothing is in flight; the fence makes that a guarantee rather
        than an accident of timing.
        """
        self.copier.fence()

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._finish_stream()
        if self._loader is not None:
            self._loader.join()
        if self._transport is not None:
            self._transport.close()
        for t in self._async_threads:
            t.join(timeout=self.settings.timeout * 2)
        self.link.close()
        if self._async_link is not None:
            self._async_link.close()
        if self._layer_link is not None:
            self._layer_link.close()


def _indexes(parts: Iterable[Tuple[Any, Any, int]]) -> List[torch.Tensor]:
    """The index tensors of a load's parts (a (blocks, offsets) pair, or cross-layer's block index)."""
    out: List[torch.Tensor] = []
    for _, index, _ in parts:
        out.extend(index if isinstance(index, tuple) else (index,))
    return out


def _sync_loads_quietly(copier: kvl.HostCopier) -> None:
    """Waits for the load stream before a failed load's leases are released (its slots may
    still be read by copies issued before the failure); a device fault is logged."""
    try:
        copier.sync_loads()
    except Exception as e:  # noqa: BLE001 - the leases are released all the same
        log.error("kvtier: waiting for the loads of a failed copy: %s", e)


def _copies(client: Optional[Client]) -> Any:
    """The client's copy lock (``Client.copies``), or nothing for slots of no client."""
    return client.copies if client is not None else contextlib.nullcontext()


def _aborted(request: Any) -> bool:
    """A request that did not finish normally (aborted, failed, ignored) has no KV worth sending."""
    status = getattr(request, "status", None)
    name = str(getattr(status, "name", status) or "").upper()
    return name in ("FINISHED_ABORTED", "FINISHED_ERROR", "FINISHED_IGNORED")


def _refuse_hybrid(kv_cache_config: Any) -> None:
    """Hybrid models (several KV cache groups) need per-group keys kvtier does not have yet."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
    if len(groups) <= 1:
        return
    kinds = sorted({type(getattr(g, "kv_cache_spec", g)).__name__ for g in groups})
    raise ValueError(f"kvtier's vLLM connector does not support hybrid models yet: this model has "
                     f"{len(groups)} KV cache groups ({', '.join(kinds)}); run it without kvtier or "
                     f"with --disable-hybrid-kv-cache-manager")


def _block_ids_of(blocks: Any) -> Any:
    getter = getattr(blocks, "get_block_ids", None)
    if callable(getter):
        return getter()
    return blocks


def _first_group(block_ids: Any) -> List[int]:
    """vLLM ≥ 0.9 passes one block list per KV cache group; this connector uses the first."""
    if block_ids is None:
        return []
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids)


def _cached_requests(cached: Any) -> Iterable[Tuple[str, Optional[List[int]], int, bool]]:
    """(req id, new block ids or None, num computed tokens, resumed) of running requests, in every vLLM form.

    Current vLLM names resumed requests in ``resumed_req_ids`` (a set); older
    releases had ``resumed_from_preemption``, a list of bools. Either way a
    resumed request's ``new_block_ids`` are all its blocks.
    """
    if cached is None:
        return []
    if hasattr(cached, "req_ids"):  # vLLM ≥ 0.10: one object of parallel lists
        resumed_ids = getattr(cached, "resumed_req_ids", None)
        flags = getattr(cached, "resumed_from_preemption", None)
        out = []
        for i, (rid, nb, nc) in enumerate(zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens)):
            if resumed_ids is not None:
                resumed = rid in resumed_ids
            else:
                resumed = bool(flags[i]) if flags else False
            out.append((rid, _first_group(nb) if nb is not None else None, nc, resumed))
        return out
    return [(c.req_id, _first_group(c.new_block_ids), c.num_computed_tokens,
             bool(getattr(c, "resumed_from_preemption", False))) for c in cached]
