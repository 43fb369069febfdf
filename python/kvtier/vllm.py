"""kvtier as a vLLM v1 KV connector.

Enable it with::

    --kv-transfer-config '{"kv_connector": "KVTierConnector",
                           "kv_connector_module_path": "kvtier.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket_path": "/run/kvtier/kvtier.sock"}}'

Targets vLLM's ``KVConnectorBase_V1`` as of vLLM 0.10 – 0.11 (constructor
``(vllm_config, role, kv_cache_config=None)``, ``get_block_ids_with_load_errors``);
docs/vllm.md lists the call order this class relies on. Loads are synchronous
from vLLM's point of view (``get_num_new_matched_tokens`` answers
``(tokens, False)``) but, with ``layerwise`` on, the copy of layer i+1 from
the arena overlaps the computation of layer i.

Principles:

- Chunks are kvtier's: ``chunk_size`` tokens (the daemon's, from HELLO), keyed
  by the prompt's token ids (kind 0), bytes in KV_2LTD (see ``layout``).
  Only whole chunks are stored and loaded.
- Tokens vLLM already holds in its prefix cache (``num_computed_tokens``) are
  never written: the load starts there, and ``skip`` keeps the daemon from
  even handing out chunks before it.
- The daemon is an optimisation, never a dependency: a failure in any call
  becomes a miss (scheduler) or load errors for the affected blocks
  (worker, via ``get_block_ids_with_load_errors``), never an exception into
  vLLM and never a hang (every socket call has a timeout). The next call
  reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from . import layout
from . import protocol as p
from ._vllm_compat import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from .client import Client, KVTierError, default_socket_path
from .link import Link

log = logging.getLogger("kvtier.vllm")

# Failures the connector absorbs: daemon gone or misbehaving, or bytes that
# do not fit the engine's geometry (another model wrote under this scope).
_ABSORBED = (KVTierError, OSError, p.ProtocolError, ValueError, RuntimeError)


@dataclass
class ReqMeta:
    """What the worker does for one request in one step (plain data, shipped to workers)."""

    req_id: str
    token_ids: List[int]
    block_ids: List[int]
    load_start: int = 0  # first token to write: vLLM holds the ones before
    load_end: int = 0    # tokens the request has once the load is done (0: no load)
    save_start: int = 0  # chunks [save_start, save_end) are to be stored
    save_end: int = 0


@dataclass
class KVTierConnectorMetadata(KVConnectorMetadata):
    requests: List[ReqMeta] = field(default_factory=list)


@dataclass
class Settings:
    """``kv_connector_extra_config`` keys understood by the connector."""

    socket_path: str = ""
    timeout: float = 5.0          # seconds any one daemon call may take
    lease_ms: int = 30000         # how long a lookup keeps hit chunks resident
    # How long reserved store slots wait for their commit: a whole forward
    # pass runs between PREPARE_STORE (layer 0) and COMMIT_STORE. The daemon
    # caps leases at 10 minutes; a dead worker's connection frees them anyway.
    save_lease_ms: int = 600000
    layerwise: bool = False       # overlap loading layer i+1 with computing layer i
    reconnect_interval: float = 1.0  # least seconds between reconnection attempts
    namespace: str = ""

    @classmethod
    def from_config(cls, vllm_config: Any) -> "Settings":
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        s = cls()
        for name in ("socket_path", "namespace"):
            setattr(s, name, str(extra.get(name, getattr(s, name))))
        s.timeout = float(extra.get("timeout", s.timeout))
        s.lease_ms = int(extra.get("lease_ms", s.lease_ms))
        s.save_lease_ms = int(extra.get("save_lease_ms", s.save_lease_ms))
        s.layerwise = _truthy(extra.get("layerwise", s.layerwise))
        s.reconnect_interval = float(extra.get("reconnect_interval", s.reconnect_interval))
        s.socket_path = s.socket_path or default_socket_path()
        return s


def _truthy(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")


def scope_of(vllm_config: Any) -> Tuple[str, str, int, int]:
    """(model, format, world size, rank) — what keys are computed under.

    The format names the KV dtype and the KV_2LTD layout so chunks of
    differently typed caches never match.
    """
    model_config = vllm_config.model_config
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    dtype = model_config.dtype if cache_dtype in (None, "auto") else cache_dtype
    if isinstance(dtype, torch.dtype):
        dtype = layout.dtype_name(dtype)
    parallel = vllm_config.parallel_config
    world = int(getattr(parallel, "tensor_parallel_size", 1)) * int(getattr(parallel, "pipeline_parallel_size", 1))
    rank = int(getattr(parallel, "rank", 0))
    return model_config.model, f"{dtype}/KV_2LTD", world, rank


def chunk_floor(n: int, chunk: int) -> int:
    return n // chunk * chunk


@dataclass
class _Tracked:
    """Scheduler-side memory of a running request, for saving across steps."""

    token_ids: List[int]
    block_ids: List[int]
    saved_upto: int
    computed: int


@dataclass
class _Load:
    """A worker-side load in flight: arena chunks to scatter and where."""

    req: ReqMeta
    lease: int
    parts: List[Tuple[torch.Tensor, torch.Tensor, int]]  # (chunk [2,L,T,H], dst slots, first token)


@dataclass
class _Save:
    req: ReqMeta
    lease: int
    parts: List[Tuple[torch.Tensor, torch.Tensor]]  # (chunk [2,L,T,H], src slots)
    count: int
    layers_done: int = 0


class KVTierConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector backed by a node-local kvtier daemon."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config) if kv_cache_config is not None \
            else super().__init__(vllm_config, role)
        self.settings = Settings.from_config(vllm_config)
        self.link = Link(self.settings.socket_path, scope_of(vllm_config), timeout=self.settings.timeout,
                         reconnect_interval=self.settings.reconnect_interval,
                         namespace=self.settings.namespace, name="vllm")
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        kv_role = getattr(ktc, "kv_role", "kv_both")
        self.can_save = kv_role in ("kv_both", "kv_producer")
        self.can_load = kv_role in ("kv_both", "kv_consumer")
        self.block_size = int(vllm_config.cache_config.block_size)
        self._chunk = 0
        # scheduler side
        self._lookups: Dict[str, Tuple[int, int, int]] = {}  # req id -> (kvtier hit, lease, vLLM-local tokens)
        self._loads: Dict[str, Tuple[int, int]] = {}     # req id -> (load_start, load_end), this step
        self._tracked: Dict[str, _Tracked] = {}
        # worker side
        self._kv_caches: Dict[str, torch.Tensor] = {}
        self._layer_index: Dict[str, int] = {}
        self._paged: Optional[layout.Paged] = None
        self._load_errors: Set[int] = set()
        self._layer_ready: List[threading.Event] = []
        self._loader: Optional[threading.Thread] = None
        self._saves: List[_Save] = []
        self._errors_lock = threading.Lock()

    # ------------------------------------------------------------ helpers

    def _client(self) -> Client:
        c = self.link.get()
        self._chunk = c.chunk_tokens
        return c

    def _keys(self, c: Client, tokens: List[int], skip: int) -> p.Keys:
        return c.tokens(self.link.scope, tokens, skip)

    # ------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """Whole cached chunks beyond ``num_computed_tokens``, never the prompt's last token."""
        if not self.can_load:
            return 0, False
        tokens = list(request.prompt_token_ids)
        self._release_lookup(request.request_id)
        try:
            c = self._client()
            reply = c.lookup(self._keys(c, tokens, chunk_floor(num_computed_tokens, self._chunk)),
                             lease_ms=self.settings.lease_ms)
        except _ABSORBED as e:
            self.link.fail(e)
            return 0, False
        self._lookups[request.request_id] = (reply.tokens, reply.lease, num_computed_tokens)
        usable = min(reply.tokens, chunk_floor(len(tokens) - 1, self._chunk))
        return max(0, usable - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Records the load decided for this step; vLLM has not yet updated num_computed_tokens."""
        if num_external_tokens <= 0:
            self._release_lookup(request.request_id, keep_hit=True)
            return
        _, _, local = self._lookups.get(request.request_id, (0, 0, 0))
        self._loads[request.request_id] = (local, local + num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = KVTierConnectorMetadata()
        for req_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._forget(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            self._track_new(new, scheduler_output.num_scheduled_tokens[new.req_id], meta)
        for req_id, new_blocks, computed in _cached_requests(scheduler_output.scheduled_cached_reqs):
            self._track_cached(req_id, new_blocks, computed, scheduler_output.num_scheduled_tokens[req_id], meta)
        self._loads.clear()
        return meta

    def _track_new(self, new: Any, scheduled: int, meta: KVTierConnectorMetadata) -> None:
        tokens = list(new.prompt_token_ids)
        block_ids = list(_first_group(new.block_ids))
        hit, _, _ = self._lookups.get(new.req_id, (0, 0, 0))
        state = _Tracked(tokens, block_ids, chunk_floor(hit, self._chunk or 1), new.num_computed_tokens + scheduled)
        self._tracked[new.req_id] = state
        load_start, load_end = self._loads.get(new.req_id, (0, 0))
        req = ReqMeta(new.req_id, tokens, block_ids, load_start, load_end)
        self._add_save(req, state)
        if req.load_end or req.save_end:
            meta.requests.append(req)

    def _track_cached(self, req_id: str, new_blocks: Iterable[int], computed: int, scheduled: int,
                      meta: KVTierConnectorMetadata) -> None:
        state = self._tracked.get(req_id)
        if state is None:
            return
        state.block_ids.extend(new_blocks)
        if computed < state.computed:
            # vLLM rewound the request (a failed load or preemption): what
            # was computed beyond this point is being recomputed, so save it again.
            state.saved_upto = min(state.saved_upto, chunk_floor(computed, self._chunk or 1))
        state.computed = computed + scheduled
        req = ReqMeta(req_id, state.token_ids, list(state.block_ids))
        self._add_save(req, state)
        if req.save_end:
            meta.requests.append(req)

    def _add_save(self, req: ReqMeta, state: _Tracked) -> None:
        if not self.can_save or not self._chunk:
            return
        end = chunk_floor(min(state.computed, len(state.token_ids)), self._chunk)
        if end > state.saved_upto:
            req.save_start, req.save_end = state.saved_upto, end
            state.saved_upto = end

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[dict]]:
        """Saves happen inside the step (wait_for_save), so blocks can be freed at once."""
        self._forget(request.request_id)
        return False, None

    def _forget(self, req_id: str) -> None:
        self._release_lookup(req_id)
        self._tracked.pop(req_id, None)

    def _release_lookup(self, req_id: str, keep_hit: bool = False) -> None:
        hit, lease, local = self._lookups.get(req_id, (0, 0, 0))
        if keep_hit:
            self._lookups[req_id] = (hit, 0, local)
        else:
            self._lookups.pop(req_id, None)
        c = self.link.client
        if lease and c is not None and not c.closed:
            try:
                c.release(lease)
            except _ABSORBED as e:  # an expired lease is not worth more than a log line
                if isinstance(e, ConnectionError):
                    self.link.fail(e)

    # --------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        self._kv_caches = dict(kv_caches)
        self._layer_index = {name: i for i, name in enumerate(self._kv_caches)}
        first = next(iter(self._kv_caches.values()))
        self._paged = layout.Paged.of(first)
        if self._paged.block_size != self.block_size:
            raise ValueError(f"KV cache block size {self._paged.block_size} != cache_config.block_size {self.block_size}")

    @property
    def _layers(self) -> int:
        return len(self._kv_caches)

    def _kv_list(self) -> List[torch.Tensor]:
        return list(self._kv_caches.values())

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Leases the chunks of every loading request and copies them in (or starts the copier)."""
        self._saves = []
        self._layer_ready = []
        meta = self._get_connector_metadata()
        loads = [l for l in (self._prepare_load(r) for r in meta.requests if r.load_end > r.load_start) if l]
        if not loads:
            return
        if not self.settings.layerwise:
            self._copy_layers(loads)
            return
        self._layer_ready = [threading.Event() for _ in range(self._layers)]
        self._loader = threading.Thread(target=self._copy_layers, args=(loads,), name="kvtier-load", daemon=True)
        self._loader.start()

    def _prepare_load(self, req: ReqMeta) -> Optional[_Load]:
        """PREPARE_RETRIEVE for one request; unavailable chunks become load errors."""
        skip = chunk_floor(req.load_start, self._chunk or 1)
        got_end = req.load_start
        try:
            c = self._client()
            skip = chunk_floor(req.load_start, self._chunk)
            slots = c.prepare_retrieve(self._keys(c, req.token_ids[:req.load_end], skip), self.settings.lease_ms)
            parts = []
            for i, s in enumerate(slots.slots):
                begin = skip + i * self._chunk
                chunk = layout.chunk_view(c.slot_tensor(s), self._paged, self._layers)
                if chunk.shape[2] != self._chunk:
                    raise ValueError(f"chunk of {chunk.shape[2]} tokens, want {self._chunk}")
                first = max(0, req.load_start - begin)
                dst = layout.slots_of(req.block_ids, self.block_size, begin + first, begin + self._chunk)
                parts.append((chunk, dst, first))
            got_end = max(req.load_start, skip + len(slots.slots) * self._chunk)
        except _ABSORBED as e:
            self.link.fail(e)
            slots = None
        self._fail_blocks(req, got_end, req.load_end)
        if slots is None or not slots.slots:
            self._release_quietly(slots.lease if slots else 0)
            return None
        return _Load(req, slots.lease, parts)

    def _fail_blocks(self, req: ReqMeta, start: int, end: int) -> None:
        if start >= end:
            return
        first, last = start // self.block_size, (end - 1) // self.block_size
        with self._errors_lock:
            self._load_errors.update(req.block_ids[first:last + 1])

    def _copy_layers(self, loads: List[_Load]) -> None:
        """Scatters every layer of every load, in layer order, signalling each layer as it lands."""
        try:
            for layer, kv in enumerate(self._kv_list()):
                for load in loads:
                    for chunk, dst, first in load.parts:
                        layout.scatter_layer(chunk, layer, self._paged, kv, dst, first)
                if self._layer_ready:
                    self._layer_ready[layer].set()
        except Exception as e:  # noqa: BLE001 - must not escape a background thread
            log.error("kvtier: copying loaded KV: %s", e)
            for load in loads:
                self._fail_blocks(load.req, load.req.load_start, load.req.load_end)
        finally:
            for ev in self._layer_ready:
                ev.set()
            for load in loads:
                self._release_quietly(load.lease)

    def _release_quietly(self, lease: int) -> None:
        c = self.link.client
        if not lease or c is None or c.closed:
            return
        try:
            c.release(lease)
        except _ABSORBED as e:
            if isinstance(e, ConnectionError):
                self.link.fail(e)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until the layer's loaded KV is in place (layerwise mode only)."""
        if not self._layer_ready:
            return
        i = self._layer_index[layer_name]
        # The copier does no I/O before setting events, so this cannot wait on
        # the daemon; the bound is a safety net against a bug, not a tuning knob.
        if not self._layer_ready[i].wait(timeout=max(60.0, self.settings.timeout)):
            log.error("kvtier: layer %s not loaded in time", layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        """Copies this layer's K/V of every chunk being saved straight into the arena slots."""
        layer = self._layer_index[layer_name]
        if layer == 0:
            self._saves = self._prepare_saves()
        for save in self._saves:
            try:
                for chunk, src in save.parts:
                    layout.gather_layer(chunk, layer, self._paged, kv_layer, src)
                save.layers_done += 1
            except _ABSORBED as e:  # the save is dropped at commit time: layers_done falls short
                log.error("kvtier: gathering layer %s: %s", layer_name, e)

    def _prepare_saves(self) -> List[_Save]:
        meta = self._get_connector_metadata()
        with self._errors_lock:
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
            size = self._paged.chunk_bytes(self._layers, self._chunk)
            slots = c.prepare_store(self._keys(c, req.token_ids[:req.save_end], req.save_start), [size] * n,
                                    self.settings.save_lease_ms)
            parts = []
            for i, s in enumerate(slots.slots):
                if s.state != p.SLOT_WRITE:
                    continue
                begin = req.save_start + i * self._chunk
                src = layout.slots_of(req.block_ids, self.block_size, begin, begin + self._chunk)
                parts.append((layout.chunk_view(c.slot_tensor(s), self._paged, self._layers), src))
        except _ABSORBED as e:
            self.link.fail(e)
            return None
        if not slots.lease:
            return None
        return _Save(req, slots.lease, parts, len(slots.slots))

    def wait_for_save(self) -> None:
        """Commits the chunks gathered during the forward pass (whole chunks, all layers)."""
        if self._loader is not None:
            self._loader.join()
            self._loader = None
        saves, self._saves = self._saves, []
        for save in saves:
            complete = save.layers_done == self._layers
            try:
                self._client().commit_store(save.lease, save.count if complete else 0)
            except _ABSORBED as e:
                self.link.fail(e)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return None, None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._errors_lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._loader is not None:
            self._loader.join()
        self.link.close()


def _first_group(block_ids: Any) -> List[int]:
    """vLLM ≥ 0.9 passes one block list per KV cache group; this connector uses the first."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return list(block_ids[0])
    return list(block_ids)


def _cached_requests(cached: Any) -> Iterable[Tuple[str, List[int], int]]:
    """(req id, new block ids, num computed tokens) of running requests, in either vLLM form."""
    if cached is None:
        return []
    if hasattr(cached, "req_ids"):  # vLLM ≥ 0.10: one object of parallel lists
        return [(rid, _first_group(nb) if nb else [], nc) for rid, nb, nc in
                zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens)]
    return [(c.req_id, _first_group(c.new_block_ids), c.num_computed_tokens) for c in cached]
