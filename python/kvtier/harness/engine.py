"""A small stand-in for vLLM's v1 engine, driving a KV connector the way vLLM does.

vLLM cannot be installed here, so this module plays its part, following
vLLM's main branch as of November 2026 (vllm/v1/core/sched/scheduler.py and
output.py; facts in ../shared/conformance/vllm_kv_connector_v1.json):

- a block pool with a prefix cache keyed by vLLM's chained block hashes,
  extra keys included (LoRA name, multimodal items, cache salt; see
  :mod:`kvtier.harness.vllm_hash`);
- a scheduler over many requests with a token budget (chunked prefill),
  running requests first, then waiting ones; when blocks run out the newest
  running request is **preempted**: its blocks are freed, its computed tokens
  reset to 0, and it goes back to the front of the waiting queue. Resumed,
  it asks the connector again and is scheduled as a cached request named in
  ``resumed_req_ids`` whose ``new_block_ids`` replace its blocks (or, with
  ``legacy_preemption``, flagged in ``resumed_from_preemption``);
- asynchronous loads (``WAITING_FOR_REMOTE_KVS`` until the worker reports
  the request in ``get_finished``), load errors and ``kv_load_failure_policy``
  (a failed asynchronous load keeps the tokens before its first bad block, or
  frees the blocks and asks the connector again);
- disaggregation: ``Request.kv_transfer_params``; ``request_finished``'s
  ``(delay_free, params)`` keeps a finished request's blocks until the worker
  names it in ``finished_sending``; ``update_connector_output`` and
  ``has_pending_push_work`` (the loop keeps stepping while it is True);
- every KV layout vLLM has used: per-layer legacy 5-D, packed, the
  standardized physical permutations, cross-layer blocks, and MLA.

Scheduler: get_num_new_matched_tokens → allocate → update_state_after_alloc
per admitted request → build_connector_meta; worker: bind_connector_metadata
→ handle_preemptions → start_load_kv → per layer (wait_for_layer_load,
attention of every scheduled request, save_kv_layer) → wait_for_save →
get_finished → get_block_ids_with_load_errors → clear_connector_metadata;
scheduler: load errors first, then request_finished for finishing requests.
"""

from __future__ import annotations

import enum
import importlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from .. import vllm_kv as kvl
from .._vllm_compat import KVConnectorRole
from .model import LayerHooks, Llama, LlamaConfig
from .vllm_hash import block_hashes

# ----------------------------------------------------------------- vLLM's shapes


@dataclass
class ModelConfig:
    model: str
    dtype: torch.dtype = torch.float32
    use_mla: bool = False


class KVCacheLayout(enum.Enum):
    """vLLM's resolved layout enum (PR 51718): the member name is the permutation."""

    LBNHC = "LBNHC"
    LBHNC = "LBHNC"
    LHBNC = "LHBNC"
    BLHNC = "BLHNC"
    BLNHC = "BLNHC"
    BHLNC = "BHLNC"


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    kv_cache_layout: Optional[str] = None  # resolved name, None on vLLM before the standardization

    def get_resolved_kv_cache_layout(self) -> KVCacheLayout:
        if self.kv_cache_layout is None:
            raise ValueError("KV cache layout has not been resolved yet")
        return KVCacheLayout[self.kv_cache_layout]


@dataclass
class LegacyCacheConfig:
    """A cache config of vLLM before the layout standardization (no resolved layout)."""

    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    rank: int = 0


@dataclass
class KVTransferConfig:
    kv_connector: str = "KVTierConnector"
    kv_connector_module_path: str = "kvtier.vllm"
    kv_role: str = "kv_both"
    kv_connector_extra_config: Dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: Any
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    identifier: str
    mm_position: PlaceholderRange


class Status(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    FINISHED_ERROR = "finished_error"
    FINISHED_ABORTED = "finished_aborted"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: Optional[List[int]]
    max_tokens: int = 1
    lora_request: Optional[LoRARequest] = None
    cache_salt: Optional[str] = None
    mm_features: List[MultiModalFeatureSpec] = field(default_factory=list)
    prompt_embeds: Optional[torch.Tensor] = None
    num_computed_tokens: int = 0
    block_ids: List[int] = field(default_factory=list)
    output_token_ids: List[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_preemptions: int = 0
    block_hashes: List[bytes] = field(default_factory=list)
    logits: List[torch.Tensor] = field(default_factory=list)  # one per sampled token
    publishable: Optional[int] = None  # fewer publishable blocks than full ones (EAGLE drafts)
    kv_transfer_params: Optional[Dict[str, Any]] = None  # vLLM takes them from sampling_params.extra_args

    @property
    def prompt(self) -> List[int]:
        return list(self.prompt_token_ids or [])

    @property
    def num_prompt_tokens(self) -> int:
        if self.prompt_token_ids is None:
            return int(self.prompt_embeds.shape[0])
        return len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> List[int]:
        return self.prompt + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_publishable_block_hashes(self) -> int:
        return len(self.block_hashes) if self.publishable is None else self.publishable


@dataclass
class KVCacheBlocks:
    block_ids: List[int]

    def get_block_ids(self) -> Tuple[List[int], ...]:
        return (list(self.block_ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[List[int]]
    mm_features: List[MultiModalFeatureSpec]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int
    lora_request: Optional[LoRARequest]
    prompt_embeds: Optional[torch.Tensor] = None


@dataclass
class CachedRequestData:
    req_ids: List[str] = field(default_factory=list)
    resumed_req_ids: Set[str] = field(default_factory=set)
    new_token_ids: List[List[int]] = field(default_factory=list)
    all_token_ids: Dict[str, List[int]] = field(default_factory=dict)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = field(default_factory=list)
    num_computed_tokens: List[int] = field(default_factory=list)
    num_output_tokens: List[int] = field(default_factory=list)


@dataclass
class LegacyCachedRequestData:
    """CachedRequestData of vLLM 0.10–0.11: ``resumed_from_preemption`` instead of ``resumed_req_ids``."""

    req_ids: List[str] = field(default_factory=list)
    resumed_from_preemption: List[bool] = field(default_factory=list)
    new_token_ids: List[List[int]] = field(default_factory=list)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = field(default_factory=list)
    num_computed_tokens: List[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: Any
    num_scheduled_tokens: Dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: Set[str]
    preempted_req_ids: Set[str] = field(default_factory=set)
    kv_connector_metadata: Any = None


@dataclass
class KVConnectorOutput:
    """The workers' transfer report, as vLLM hands it to update_connector_output."""

    finished_sending: Optional[Set[str]] = None
    finished_recving: Optional[Set[str]] = None
    invalid_block_ids: Set[int] = field(default_factory=set)


@dataclass
class ForwardContext:
    """What start_load_kv receives; this connector reads nothing from it."""

    no_compile_layers: Dict[str, Any]
    attn_metadata: Any = None


def load_connector(vllm_config: VllmConfig, role: KVConnectorRole):
    """Imports the connector class as vLLM's factory does: module path + class name."""
    ktc = vllm_config.kv_transfer_config
    cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    return cls(vllm_config, role, None)


# ------------------------------------------------------------ block pool


class BlockPool:
    """Paged-cache blocks with a prefix cache keyed by chained block hashes, like vLLM's."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size, self.prefix_caching = block_size, prefix_caching
        self.free: "OrderedDict[int, None]" = OrderedDict((i, None) for i in range(num_blocks))
        self.refs = [0] * num_blocks
        self.cached: Dict[bytes, int] = {}
        self.hash_of: Dict[int, bytes] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def computed_blocks(self, req: Request) -> List[int]:
        """Cached blocks of the prompt's prefix, leaving at least one token to compute."""
        if not self.prefix_caching or req.prompt_token_ids is None:
            return []
        hit = []
        for h in req.block_hashes[: (req.num_tokens - 1) // self.block_size]:
            if h not in self.cached:
                break
            hit.append(self.cached[h])
        return hit

    def take(self, block_ids: List[int]) -> None:
        for b in block_ids:
            self.refs[b] += 1
            self.free.pop(b, None)

    def allocate(self, n: int) -> Optional[List[int]]:
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)  # least recently freed first
            h = self.hash_of.pop(b, None)
            if h is not None:
                self.cached.pop(h, None)
            self.refs[b] = 1
            out.append(b)
        return out

    def cache_full_blocks(self, req: Request) -> None:
        """Makes the request's computed full blocks findable by the prefix cache."""
        if not self.prefix_caching:
            return
        full = min(req.num_computed_tokens, req.num_prompt_tokens) // self.block_size
        for b, h in list(zip(req.block_ids, req.block_hashes))[:full]:
            if h not in self.cached:
                self.cached[h], self.hash_of[b] = b, h

    def release(self, req: Request) -> None:
        for b in req.block_ids:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free[b] = None
        req.block_ids = []


# ---------------------------------------------------------------- engine


class _ConnectorHooks(LayerHooks):
    def __init__(self, connector):
        self.c = connector

    def before_attention(self, layer_name):
        self.c.wait_for_layer_load(layer_name)

    def after_attention(self, layer_name, kv_layer):
        self.c.save_kv_layer(layer_name, kv_layer, None)


@dataclass
class StepRecord:
    """What one step did for one request, for tests to inspect."""

    req_id: str
    num_computed_before: int
    num_scheduled: int
    external_tokens: int
    load_error_blocks: Set[int]
    resumed: bool = False


# Per-layer KV forms the harness can allocate; standard layout names are accepted too.
LEGACY_FORMS = (kvl.BLOCK_FIRST, kvl.KV_FIRST, kvl.PACKED)


class Engine:
    """Scheduler + one worker in one process, each with its own connector instance."""

    def __init__(self, model_cfg: LlamaConfig, model_name: str = "kvtier-test-llama", num_blocks: int = 256,
                 block_size: int = 16, layout_kind: str = kvl.BLOCK_FIRST,
                 kv_transfer: Optional[KVTransferConfig] = None, prefix_caching: bool = True,
                 token_budget: int = 1 << 30, legacy_preemption: bool = False, cross_layer: bool = False,
                 device: str = "cpu", kv_snapshots: bool = True):
        self.model = Llama(model_cfg)
        # kv_snapshots: copy each finished request's KV (kv_snapshots[req_id]) for tests that
        # compare it; a benchmark turns it off, since the copy is no part of an engine's TTFT.
        self.keep_snapshots = kv_snapshots
        self.cfg = model_cfg
        self.block_size, self.token_budget = block_size, token_budget
        self.legacy_preemption = legacy_preemption
        self.pool = BlockPool(num_blocks, block_size, prefix_caching)
        use_mla = model_cfg.mla_latent > 0
        cache_config = self._cache_config(layout_kind, block_size, prefix_caching)
        self.vllm_config = VllmConfig(ModelConfig(model_name, model_cfg.dtype, use_mla), cache_config,
                                      kv_transfer_config=kv_transfer)
        self.cross_tensor: Optional[torch.Tensor] = None
        self.kv_caches = self._allocate(model_cfg, num_blocks, block_size, layout_kind, device)
        first = next(iter(self.kv_caches.values()))
        form = kvl.MLA if use_mla else (layout_kind if layout_kind in LEGACY_FORMS else kvl.PACKED)
        self.layout = kvl.Layout.detect(first, use_mla=use_mla, form=form)
        self.scheduler_connector = self.worker_connector = None
        self.fail_policy = kv_transfer.kv_load_failure_policy if kv_transfer else "recompute"
        if kv_transfer is not None:
            self.scheduler_connector = load_connector(self.vllm_config, KVConnectorRole.SCHEDULER)
            self.worker_connector = load_connector(self.vllm_config, KVConnectorRole.WORKER)
            if cross_layer and getattr(self.worker_connector, "prefer_cross_layer_blocks", False):
                self.worker_connector.register_cross_layers_kv_cache(self.cross_tensor, None)
            else:
                self.worker_connector.register_kv_caches(self.kv_caches)
        self.steps: List[StepRecord] = []
        self.requests: Dict[str, Request] = {}
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self._finished_ids: Set[str] = set()
        self._finished_recving: Set[str] = set()
        self._failed_recving: Set[str] = set()
        self.delayed: Dict[str, Request] = {}  # finished, blocks kept for the connector (delay_free)
        self.output_params: Dict[str, Optional[Dict[str, Any]]] = {}  # kv_transfer_params returned per request
        self.freed_by: Dict[str, str] = {}  # req id -> what released its blocks: finished / finished_sending / finished_recving
        self.kv_snapshots: Dict[str, torch.Tensor] = {}
        self.async_loaded: Dict[str, int] = {}  # req id -> tokens loaded in the background
        self._next_id = 0

    @staticmethod
    def _cache_config(layout_kind: str, block_size: int, prefix_caching: bool):
        if layout_kind in LEGACY_FORMS:
            return LegacyCacheConfig(block_size, enable_prefix_caching=prefix_caching)
        return CacheConfig(block_size, enable_prefix_caching=prefix_caching, kv_cache_layout=layout_kind.upper())

    def _allocate(self, c: LlamaConfig, nb: int, bs: int, kind: str, device: str) -> Dict[str, torch.Tensor]:
        names = [c.layer_name(i) for i in range(c.layers)]
        if c.mla_latent:
            if kind in LEGACY_FORMS:
                return {n: torch.zeros((nb, bs, c.mla_latent), dtype=c.dtype, device=device) for n in names}
            logical, per_layer = kvl.allocate_standard(kind, c.layers, nb, 1, bs, c.mla_latent, c.dtype, device)
        elif kind == kvl.BLOCK_FIRST:
            return {n: torch.zeros((nb, 2, bs, c.kv_heads, c.head_dim), dtype=c.dtype, device=device) for n in names}
        elif kind == kvl.KV_FIRST:
            return {n: torch.zeros((2, nb, bs, c.kv_heads, c.head_dim), dtype=c.dtype, device=device) for n in names}
        elif kind == kvl.PACKED:
            return {n: torch.zeros((nb, c.kv_heads, bs, 2 * c.head_dim), dtype=c.dtype, device=device) for n in names}
        else:
            logical, per_layer = kvl.allocate_standard(kind, c.layers, nb, c.kv_heads, bs, 2 * c.head_dim,
                                                       c.dtype, device)
        self.cross_tensor = logical
        if c.mla_latent:  # MLA per-layer views are [B, N, latent]
            per_layer = [t.squeeze(1) for t in per_layer]
        return dict(zip(names, per_layer))

    def close(self) -> None:
        for c in (self.scheduler_connector, self.worker_connector):
            if c is not None:
                c.shutdown()

    # -- public

    def add_request(self, prompt: Optional[List[int]], req_id: Optional[str] = None, max_tokens: int = 1,
                    lora: Optional[str] = None, cache_salt: Optional[str] = None,
                    mm: Optional[List[Tuple[str, int, int]]] = None,
                    prompt_embeds: Optional[torch.Tensor] = None,
                    kv_transfer_params: Optional[Dict[str, Any]] = None) -> Request:
        self._next_id += 1
        req = Request(req_id or f"req-{self._next_id}", list(prompt) if prompt is not None else None, max_tokens,
                      LoRARequest(lora, 1 + self._next_id) if lora else None, cache_salt,
                      [MultiModalFeatureSpec(i, PlaceholderRange(o, n)) for i, o, n in (mm or [])], prompt_embeds)
        req.kv_transfer_params = dict(kv_transfer_params) if kv_transfer_params is not None else None
        req.block_hashes = block_hashes(req, self.block_size)
        self.requests[req.request_id] = req
        self.waiting.append(req)
        return req

    def run(self, timeout: float = 60.0) -> Dict[str, Request]:
        """Steps until every request has finished; like vLLM's engine loop
        (Scheduler.has_requests), it keeps stepping while requests wait for
        asynchronous loads, finished requests are still to be announced, or
        the connector has push work pending."""
        deadline = time.monotonic() + timeout
        while self.has_requests():
            if time.monotonic() > deadline:
                raise RuntimeError("harness: requests did not finish")
            if not self.step():
                time.sleep(0.001)  # nothing scheduled: requests wait for their KV
        return self.requests

    def abort(self, req_id: str) -> None:
        """vLLM's finish_requests(..., FINISHED_ABORTED): the client went away."""
        r = self.requests[req_id]
        if r.status not in (Status.FINISHED, Status.FINISHED_ERROR, Status.FINISHED_ABORTED):
            self._finish(r, Status.FINISHED_ABORTED)

    def has_requests(self) -> bool:
        sc = self.scheduler_connector
        pending_push = sc is not None and bool(getattr(sc, "has_pending_push_work", lambda: False)())
        return bool(self.waiting or self.running or self._finished_ids or pending_push)

    def prefill(self, prompt: List[int], req_id: Optional[str] = None, **kw) -> torch.Tensor:
        """Runs one request to its first token and returns that token's logits."""
        req = self.add_request(prompt, req_id, **kw)
        self.run()
        if req.status == Status.FINISHED_ERROR:
            raise RuntimeError(f"request {req.request_id} failed to load its KV")
        return req.logits[0]

    # -- scheduler

    def step(self) -> bool:
        """One engine step; False when nothing was scheduled."""
        out, scheduled, external, resumed = self._schedule()
        meta = None
        if self.scheduler_connector is not None:
            meta = out.kv_connector_metadata = self.scheduler_connector.build_connector_meta(out)
        before = {r.request_id: r.num_computed_tokens for r in scheduled}
        logits, errors, done_sending, done_recving = self._execute(scheduled, out)
        for r in scheduled:
            self.steps.append(StepRecord(r.request_id, before[r.request_id], out.num_scheduled_tokens[r.request_id],
                                         external.get(r.request_id, 0), errors, r.request_id in resumed))
        self._update_from_output(scheduled, out, logits, errors)
        self._update_from_kv_xfer_finished(KVConnectorOutput(done_sending, done_recving, errors))
        del meta
        return bool(scheduled)

    def _schedule(self):
        budget = self.token_budget
        num_scheduled: Dict[str, int] = {}
        new_blocks: Dict[str, Optional[List[int]]] = {}
        scheduled_running: List[Request] = []
        preempted: List[Request] = []
        for req in list(self.running):
            if req not in self.running or budget <= 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            blocks = self._grow(req, n, preempted, scheduled_running, num_scheduled, new_blocks)
            if blocks is None:
                continue
            scheduled_running.append(req)
            new_blocks[req.request_id] = blocks
            num_scheduled[req.request_id] = n
            budget -= num_scheduled[req.request_id]
        scheduled_new, scheduled_resumed, external = [], [], {}
        if not preempted:
            budget = self._admit(budget, num_scheduled, new_blocks, scheduled_new, scheduled_resumed, external)
        out = SchedulerOutput(
            [NewRequestData(r.request_id, r.prompt_token_ids, r.mm_features, (list(r.block_ids),),
                            r.num_computed_tokens, r.lora_request, r.prompt_embeds) for r in scheduled_new],
            self._cached_data(scheduled_running, scheduled_resumed, new_blocks, num_scheduled),
            num_scheduled, sum(num_scheduled.values()), self._finished_ids,
            {r.request_id for r in preempted})
        self._finished_ids = set()
        resumed = {r.request_id for r in scheduled_resumed}
        return out, scheduled_running + scheduled_new + scheduled_resumed, external, resumed

    def _grow(self, req, n, preempted, scheduled_running, num_scheduled, new_blocks) -> Optional[List[int]]:
        """Blocks for n more tokens of a running request, preempting the newest running requests if needed."""
        need = -(-(req.num_computed_tokens + n) // self.block_size) - len(req.block_ids)
        while True:
            got = self.pool.allocate(max(need, 0))
            if got is not None:
                req.block_ids.extend(got)
                return got
            victim = self.running[-1]
            self.running.remove(victim)
            if victim in scheduled_running:
                scheduled_running.remove(victim)
                num_scheduled.pop(victim.request_id)
                new_blocks.pop(victim.request_id)
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                return None

    def _preempt(self, req: Request) -> None:
        self.pool.release(req)
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        req.num_preemptions += 1
        self.waiting.insert(0, req)

    def _admit(self, budget, num_scheduled, new_blocks, scheduled_new, scheduled_resumed, external) -> int:
        skipped = []
        while self.waiting and budget > 0:
            req = self.waiting.pop(0)
            if req.status == Status.WAITING_FOR_REMOTE_KVS:
                if not self._remote_kv_ready(req):
                    skipped.append(req)
                    continue
            ext, is_async, local_blocks = 0, False, []
            if req.num_computed_tokens == 0:
                local_blocks = self.pool.computed_blocks(req)
                local = len(local_blocks) * self.block_size
                if self.scheduler_connector is not None:
                    ext, is_async = self.scheduler_connector.get_num_new_matched_tokens(req, local)
                    if ext is None:
                        skipped.append(req)
                        continue
                computed = local + ext
            else:
                computed = req.num_computed_tokens
            n = 0 if is_async else min(req.num_tokens - computed, budget)
            need = -(-(computed + n) // self.block_size) - len(local_blocks) - len(req.block_ids)
            got = self.pool.allocate(max(need, 0))
            if got is None:
                skipped.append(req)
                break
            self.pool.take(local_blocks)
            req.block_ids = local_blocks + req.block_ids + got
            if self.scheduler_connector is not None:
                self.scheduler_connector.update_state_after_alloc(req, KVCacheBlocks(list(req.block_ids)), ext)
            if is_async:
                self.async_loaded[req.request_id] = ext
                req.status = Status.WAITING_FOR_REMOTE_KVS
                req.num_computed_tokens = 0
                skipped.append(req)
                continue
            (scheduled_resumed if req.status == Status.PREEMPTED else scheduled_new).append(req)
            external[req.request_id] = ext
            req.status = Status.RUNNING
            req.num_computed_tokens = computed
            self.running.append(req)
            new_blocks[req.request_id] = list(req.block_ids)
            num_scheduled[req.request_id] = n
            budget -= n
        self.waiting[:0] = skipped
        return budget

    def _remote_kv_ready(self, req: Request) -> bool:
        """vLLM's _update_waiting_for_remote_kv: the blocks now hold the loaded tokens.

        After a failed load the tokens before the first bad block count (the
        request keeps its blocks), or, with none, its blocks are freed and the
        connector is asked again as for a new request."""
        if req.request_id not in self._finished_recving:
            return False
        self._finished_recving.discard(req.request_id)
        if req.request_id in self._failed_recving:
            self._failed_recving.discard(req.request_id)
            if req.num_computed_tokens:
                self.pool.cache_full_blocks(req)
            else:
                self.pool.release(req)
        else:
            computed = min(len(req.block_ids) * self.block_size, req.num_tokens)
            if computed == req.num_tokens:
                computed -= 1
            req.num_computed_tokens = computed
            self.pool.cache_full_blocks(req)
        req.status = Status.PREEMPTED if req.num_preemptions else Status.WAITING
        return True

    def _cached_data(self, running, resumed, new_blocks, num_scheduled):
        reqs = running + resumed
        if self.legacy_preemption:
            return LegacyCachedRequestData(
                [r.request_id for r in reqs], [r in resumed for r in reqs], [[] for _ in reqs],
                [(new_blocks[r.request_id],) if new_blocks[r.request_id] else None for r in reqs],
                [r.num_computed_tokens for r in reqs])
        return CachedRequestData(
            [r.request_id for r in reqs], {r.request_id for r in resumed}, [],
            {r.request_id: r.all_token_ids for r in resumed},
            [(new_blocks[r.request_id],) if new_blocks[r.request_id] else None for r in reqs],
            [r.num_computed_tokens for r in reqs], [len(r.output_token_ids) for r in reqs])

    def _update_from_output(self, scheduled, out, logits, errors) -> None:
        failed = self._handle_invalid_blocks(errors) if errors else set()
        for r in scheduled:
            n = out.num_scheduled_tokens[r.request_id]
            if r.request_id in failed or r.status != Status.RUNNING:
                continue
            r.num_computed_tokens += n
            self.pool.cache_full_blocks(r)
            if r.num_computed_tokens == r.num_tokens:
                self._sample(r, logits[r.request_id])

    def _handle_invalid_blocks(self, errors: Set[int]) -> Set[str]:
        """vLLM's _handle_invalid_blocks: requests waiting for asynchronous loads keep the tokens
        before their first failed block; running ones recompute from it; under the ``fail`` policy
        all of them fail. Returns the running requests this step's output must skip."""
        waiting = [r for r in self.waiting if r.status == Status.WAITING_FOR_REMOTE_KVS]
        async_failed = {r.request_id for r in waiting if self._truncate_at_error(r, errors, True)}
        sync_failed = {r.request_id for r in self.running if self._truncate_at_error(r, errors, False)}
        if self.fail_policy == "fail":
            for rid in async_failed | sync_failed:
                self._finish(self.requests[rid], Status.FINISHED_ERROR)
            return async_failed | sync_failed
        self._failed_recving |= async_failed
        return sync_failed

    def _truncate_at_error(self, r: Request, errors: Set[int], is_async: bool) -> bool:
        if is_async:
            upto = r.num_computed_tokens if r.request_id in self._failed_recving else len(r.block_ids) * self.block_size
        else:
            upto = len(r.block_ids) * self.block_size
        for i, b in enumerate(r.block_ids[: -(-upto // self.block_size)]):
            if b in errors:
                r.num_computed_tokens = i * self.block_size if is_async else min(r.num_computed_tokens,
                                                                                 i * self.block_size)
                return True
        return False

    def _update_from_kv_xfer_finished(self, output: KVConnectorOutput) -> None:
        """vLLM's _update_from_kv_xfer_finished: loads done wake their requests (or free a finished
        one's blocks); sends done free the blocks request_finished kept."""
        sc = self.scheduler_connector
        if sc is not None and hasattr(sc, "update_connector_output"):
            sc.update_connector_output(output)
        for rid in output.finished_recving or ():
            r = self.requests[rid]
            if r.status == Status.WAITING_FOR_REMOTE_KVS:
                self._finished_recving.add(rid)
            elif rid in self.delayed:
                self._free_blocks(self.delayed.pop(rid), "finished_recving")
        for rid in output.finished_sending or ():
            if rid not in self.delayed:
                raise RuntimeError(f"harness: {rid} reported in finished_sending but its blocks were not kept")
            self._free_blocks(self.delayed.pop(rid), "finished_sending")

    def _free_blocks(self, r: Request, why: str) -> None:
        self.pool.release(r)
        self.freed_by[r.request_id] = why

    def _sample(self, r: Request, logits: torch.Tensor) -> None:
        r.logits.append(logits)
        if len(r.output_token_ids) + 1 >= r.max_tokens:
            self._finish(r, Status.FINISHED)
            return
        r.output_token_ids.append(int(logits.argmax()))

    def _finish(self, r: Request, status: Status) -> None:
        """vLLM's _free_request: the connector may keep the blocks (delay_free); a request still
        waiting for its asynchronous load keeps them until the load is reported."""
        delay = False
        if r.status == Status.RUNNING:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
            if r.status == Status.WAITING_FOR_REMOTE_KVS:
                delay = r.request_id not in self._finished_recving
                self._finished_recving.discard(r.request_id)
                self._failed_recving.discard(r.request_id)
        r.status = status
        if self.keep_snapshots:
            self.kv_snapshots[r.request_id] = self.kv_of(r, 0, r.num_computed_tokens)
        params = None
        if self.scheduler_connector is not None:
            connector_delay, params = self.scheduler_connector.request_finished(r, list(r.block_ids))
            delay |= connector_delay
        self.output_params[r.request_id] = params
        if delay:
            self.delayed[r.request_id] = r
        else:
            self._free_blocks(r, "finished")
        self._finished_ids.add(r.request_id)

    def kv_of(self, r: Request, start: int, end: int) -> torch.Tensor:
        """The request's cached KV of tokens [start, end) as [layers, tokens, heads, parts, dim] (a copy)."""
        t = torch.arange(start, end, dtype=torch.int64)
        blocks = torch.as_tensor(r.block_ids, dtype=torch.int64)
        if end <= start or not r.block_ids:
            return torch.empty(0)
        b, o = blocks[t // self.block_size], t % self.block_size
        return torch.stack([self.layout.canonical(kv)[b, :, o] for kv in self.kv_caches.values()]).clone()

    # -- worker

    def _execute(self, scheduled: List[Request], out: SchedulerOutput):
        wc = self.worker_connector
        hooks = None
        if wc is not None:
            wc.bind_connector_metadata(out.kv_connector_metadata)
            if out.preempted_req_ids:
                wc.handle_preemptions(out.kv_connector_metadata)
            wc.start_load_kv(ForwardContext(dict(self.kv_caches)))
            hooks = _ConnectorHooks(wc)
        batch = []
        for r in scheduled:
            start = r.num_computed_tokens
            end = start + out.num_scheduled_tokens[r.request_id]
            batch.append(self._inputs(r, start, end))
        outs = self.model.forward_batch(batch, list(self.kv_caches.values()), self.layout, hooks) if batch else []
        logits = {r.request_id: o[-1] for r, o in zip(scheduled, outs)}
        errors: Set[int] = set()
        done_sending: Set[str] = set()
        done_recving: Set[str] = set()
        if wc is not None:
            wc.wait_for_save()
            sending, recving = wc.get_finished(out.finished_req_ids)
            done_sending, done_recving = set(sending or ()), set(recving or ())
            errors = wc.get_block_ids_with_load_errors()
            wc.clear_connector_metadata()
        return logits, errors, done_sending, done_recving

    def _inputs(self, r: Request, start: int, end: int):
        blocks = torch.as_tensor(r.block_ids, dtype=torch.int64)
        t = torch.arange(0, end, dtype=torch.int64)
        slots = blocks[t // self.block_size] * self.block_size + t % self.block_size
        tokens = torch.as_tensor(self._token_ids(r)[start:end], dtype=torch.int64)
        positions = torch.arange(start, end, dtype=torch.int64)
        return tokens, positions, slots[start:end], slots

    def _token_ids(self, r: Request) -> List[int]:
        if r.prompt_token_ids is None:  # embeddings: the harness model maps them back to ids
            return [int(i) for i in r.prompt_embeds.tolist()] + r.output_token_ids
        return r.all_token_ids


def reference_logits(model_cfg: LlamaConfig, prompt: List[int], block_size: int = 16) -> torch.Tensor:
    """Logits of the last prompt token from a plain full prefill, no connector, no prefix cache."""
    blocks = -(-len(prompt) // block_size) + 1
    eng = Engine(model_cfg, num_blocks=blocks, block_size=block_size, prefix_caching=False)
    return eng.prefill(prompt)
