"""A tiny stand-in for vLLM's v1 engine, driving a KV connector the way vLLM does.

vLLM cannot be installed here, so this module plays its part: it keeps a
paged KV cache with block tables and a prefix cache, schedules requests,
and calls the connector's scheduler-side and worker-side methods in vLLM's
order and with vLLM's argument shapes (docs/vllm.md, per vLLM 0.10/0.11):

scheduler: get_num_new_matched_tokens → allocate → update_state_after_alloc
→ build_connector_meta; worker: bind_connector_metadata → start_load_kv →
per layer (wait_for_layer_load, attention, save_kv_layer) → wait_for_save →
get_finished → get_block_ids_with_load_errors → clear_connector_metadata;
scheduler: load errors first (rewind to the first failed block and
recompute, vLLM's ``recompute`` policy), then request_finished.

One request runs per step (prefills may be split by ``token_budget``); that
is all the connector tests need and keeps the harness small.
"""

from __future__ import annotations

import hashlib
import importlib
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from .. import layout
from .._vllm_compat import KVConnectorRole
from .model import LayerHooks, Llama, LlamaConfig

# ----------------------------------------------------------------- vLLM's shapes


@dataclass
class ModelConfig:
    model: str
    dtype: torch.dtype = torch.float32


@dataclass
class CacheConfig:
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


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None


@dataclass
class Request:
    request_id: str
    prompt_token_ids: List[int]
    num_computed_tokens: int = 0
    block_ids: List[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class KVCacheBlocks:
    block_ids: List[int]

    def get_block_ids(self) -> Tuple[List[int], ...]:
        return (list(self.block_ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: List[str] = field(default_factory=list)
    resumed_from_preemption: List[bool] = field(default_factory=list)
    new_token_ids: List[List[int]] = field(default_factory=list)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = field(default_factory=list)
    num_computed_tokens: List[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: Set[str]
    kv_connector_metadata: Any = None


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

    def block_hashes(self, tokens: List[int]) -> List[bytes]:
        out, prev = [], b""
        for i in range(len(tokens) // self.block_size):
            block = tokens[i * self.block_size:(i + 1) * self.block_size]
            prev = hashlib.sha256(prev + struct.pack(f"<{len(block)}I", *block)).digest()
            out.append(prev)
        return out

    def computed_blocks(self, tokens: List[int]) -> List[int]:
        """Cached blocks of the prompt's prefix, leaving at least one token to compute."""
        if not self.prefix_caching:
            return []
        hit = []
        for h in self.block_hashes(tokens)[: (len(tokens) - 1) // self.block_size]:
            if h not in self.cached:
                break
            hit.append(self.cached[h])
        return hit

    def take(self, block_ids: List[int]) -> None:
        for b in block_ids:
            self.refs[b] += 1
            self.free.pop(b, None)

    def allocate(self, n: int) -> List[int]:
        if n > len(self.free):
            raise RuntimeError(f"out of KV blocks: want {n}, {len(self.free)} free")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)  # least recently freed first
            h = self.hash_of.pop(b, None)
            if h is not None:
                self.cached.pop(h, None)
            self.refs[b] = 1
            out.append(b)
        return out

    def release(self, req: Request) -> None:
        """Frees the request's blocks, keeping its full blocks findable by the prefix cache."""
        if self.prefix_caching:
            for b, h in zip(req.block_ids, self.block_hashes(req.prompt_token_ids)):
                if h not in self.cached:
                    self.cached[h], self.hash_of[b] = b, h
        for b in req.block_ids:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free[b] = None


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
    """What one step did, for tests to inspect."""

    req_id: str
    num_computed_before: int
    num_scheduled: int
    external_tokens: int
    load_error_blocks: Set[int]


class Engine:
    """Scheduler + one worker in one process, each with its own connector instance."""

    def __init__(self, model_cfg: LlamaConfig, model_name: str = "kvtier-test-llama", num_blocks: int = 256,
                 block_size: int = 16, layout_kind: str = layout.BLOCK_FIRST,
                 kv_transfer: Optional[KVTransferConfig] = None, prefix_caching: bool = True,
                 token_budget: int = 1 << 30):
        self.model = Llama(model_cfg)
        self.cfg = model_cfg
        self.block_size, self.token_budget = block_size, token_budget
        self.pool = BlockPool(num_blocks, block_size, prefix_caching)
        c = model_cfg
        shape = ((num_blocks, 2, block_size, c.kv_heads, c.head_dim) if layout_kind == layout.BLOCK_FIRST
                 else (2, num_blocks, block_size, c.kv_heads, c.head_dim))
        self.kv_caches = {c.layer_name(i): torch.zeros(shape, dtype=c.dtype) for i in range(c.layers)}
        self.paged = layout.Paged.of(next(iter(self.kv_caches.values())), layout_kind)
        self.vllm_config = VllmConfig(ModelConfig(model_name, c.dtype),
                                      CacheConfig(block_size, enable_prefix_caching=prefix_caching),
                                      kv_transfer_config=kv_transfer)
        self.scheduler_connector = self.worker_connector = None
        if kv_transfer is not None:
            self.scheduler_connector = load_connector(self.vllm_config, KVConnectorRole.SCHEDULER)
            self.worker_connector = load_connector(self.vllm_config, KVConnectorRole.WORKER)
            self.worker_connector.register_kv_caches(self.kv_caches)
        self.steps: List[StepRecord] = []
        self._finished: Set[str] = set()
        self._next_id = 0

    def close(self) -> None:
        for c in (self.scheduler_connector, self.worker_connector):
            if c is not None:
                c.shutdown()

    # -- public

    def prefill(self, prompt: List[int], req_id: Optional[str] = None) -> torch.Tensor:
        """Runs one request to its first token and returns that token's logits."""
        self._next_id += 1
        req = Request(req_id or f"req-{self._next_id}", list(prompt))
        new = True
        while True:
            logits = self._step(req, new)
            new = False
            if logits is not None:
                self._finish(req)
                return logits

    # -- scheduler

    def _schedule_new(self, req: Request) -> Tuple[NewRequestData, int]:
        local_blocks = self.pool.computed_blocks(req.prompt_token_ids)
        self.pool.take(local_blocks)
        local = len(local_blocks) * self.block_size
        external = 0
        if self.scheduler_connector is not None:
            external, _async = self.scheduler_connector.get_num_new_matched_tokens(req, local)
            external = external or 0
        need = -(-req.num_tokens // self.block_size) - len(local_blocks)
        req.block_ids = local_blocks + self.pool.allocate(need)
        if self.scheduler_connector is not None:
            self.scheduler_connector.update_state_after_alloc(req, KVCacheBlocks(req.block_ids), external)
        req.num_computed_tokens = local + external
        return NewRequestData(req.request_id, req.prompt_token_ids, (list(req.block_ids),),
                              req.num_computed_tokens), external

    def _step(self, req: Request, new: bool) -> Optional[torch.Tensor]:
        cached = CachedRequestData()
        external = 0
        if new:
            new_data, external = self._schedule_new(req)
            news = [new_data]
        else:
            news = []
            cached = CachedRequestData([req.request_id], [False], [[]], [None], [req.num_computed_tokens])
        n = min(self.token_budget, req.num_tokens - req.num_computed_tokens)
        out = SchedulerOutput(news, cached, {req.request_id: n}, n, self._finished)
        self._finished = set()
        if self.scheduler_connector is not None:
            out.kv_connector_metadata = self.scheduler_connector.build_connector_meta(out)
        before = req.num_computed_tokens
        logits, errors = self._execute(req, out, n)
        self.steps.append(StepRecord(req.request_id, before, n, external, errors))
        return self._update_from_output(req, n, logits, errors)

    def _update_from_output(self, req: Request, n: int, logits: torch.Tensor, errors: Set[int]):
        failed = [i for i, b in enumerate(req.block_ids) if b in errors]
        if failed:
            # vLLM's "recompute" policy: rewind to the first block that failed to
            # load and drop this step's output; the request is scheduled again.
            req.num_computed_tokens = min(req.num_computed_tokens, failed[0] * self.block_size)
            return None
        req.num_computed_tokens += n
        return logits[-1] if req.num_computed_tokens == req.num_tokens else None

    def _finish(self, req: Request) -> None:
        if self.scheduler_connector is not None:
            self.scheduler_connector.request_finished(req, list(req.block_ids))
        self.pool.release(req)
        self._finished.add(req.request_id)

    # -- worker

    def _execute(self, req: Request, out: SchedulerOutput, n: int) -> Tuple[torch.Tensor, Set[int]]:
        wc = self.worker_connector
        hooks = None
        if wc is not None:
            wc.bind_connector_metadata(out.kv_connector_metadata)
            wc.start_load_kv(ForwardContext(dict(self.kv_caches)))
            hooks = _ConnectorHooks(wc)
        start = req.num_computed_tokens
        logits = self._forward(req, start, start + n, hooks)
        errors: Set[int] = set()
        if wc is not None:
            wc.wait_for_save()
            wc.get_finished(out.finished_req_ids)
            errors = wc.get_block_ids_with_load_errors()
            wc.clear_connector_metadata()
        return logits, errors

    def _forward(self, req: Request, start: int, end: int, hooks) -> torch.Tensor:
        slots = layout.slots_of(req.block_ids, self.block_size, 0, end)
        tokens = torch.as_tensor(req.prompt_token_ids[start:end], dtype=torch.int64)
        positions = torch.arange(start, end, dtype=torch.int64)
        return self.model.forward(tokens, positions, slots[start:end], slots, list(self.kv_caches.values()),
                                  self.paged, hooks)


def reference_logits(model_cfg: LlamaConfig, prompt: List[int], block_size: int = 16) -> torch.Tensor:
    """Logits of the last prompt token from a plain full prefill, no connector, no prefix cache."""
    blocks = -(-len(prompt) // block_size) + 1
    eng = Engine(model_cfg, num_blocks=blocks, block_size=block_size, prefix_caching=False)
    return eng.prefill(prompt)
