"""A stand-in for SGLang's HiCache flow around a storage backend.

SGLang cannot be installed here, so this plays its part for one request, in
the shapes HiCache uses at SGLang main (commit 001067f, November 2026:
``managers/cache_controller.py``, ``mem_cache/hybrid_cache/
hybrid_cache_controller.py``, ``mem_cache/pool_host/``):

1. page keys: chained sha256 hex digests of each full page's token ids
   (the shape of SGLang's ``get_hash_str``: prior digest bytes, then each
   token as 4 little-endian bytes);
2. prefetch: ``batch_exists`` over the prompt's pages (never the page with
   the last token, so at least one token is computed) — ``batch_exists_v2``
   with a trailing-pages state transfer for a hybrid model — then the pages
   into free host-pool pages: ``batch_get_v1`` when ``interface_v1`` is on,
   else ``batch_get`` into dummy pages copied in with
   ``set_from_flat_data_page`` (SGLang's generic path), and for a hybrid
   model the state of the last hit page with ``batch_get_v2``;
3. load back: host pool → the model's device KV, then prefill the rest;
4. write-back: device KV → host pool → ``batch_set_v1`` (or ``batch_set``
   of ``get_data_page`` copies) for the pages storage does not have yet, and
   for a hybrid model each new page's state with ``batch_set_v2``.

The host pool takes any of SGLang's host layouts (``layer_first``,
``page_first``, ``page_first_direct``, ``page_head``), with the page methods
backends use: ``get_data_page``, ``get_dummy_flat_data_page`` and
``set_from_flat_data_page``, whose flat page is the pool's own byte order.

The hybrid model's auxiliary pool stands in for Mamba state: one slot per
state (page size 1), holding a small digest of the KV up to the end of a
page. Loading checks the digest against the KV that was loaded, so a state
that belongs to another prefix, layer split or rank is caught.
"""

from __future__ import annotations

import hashlib
import struct
from typing import List, Optional, Tuple

import torch

from .. import vllm_kv
from .._sglang_compat import PoolHitPolicy, PoolName, PoolTransfer
from .model import Llama, LlamaConfig

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


def page_hashes(tokens: List[int], page_size: int) -> List[str]:
    """Chained sha256 hex digests of the full pages of ``tokens``."""
    out: List[str] = []
    prior = b""
    for i in range(len(tokens) // page_size):
        page = tokens[i * page_size:(i + 1) * page_size]
        prior = hashlib.sha256(prior + struct.pack(f"<{len(page)}I", *page)).digest()
        out.append(prior.hex())
    return out


class HostPool:
    """A host KV pool in one of SGLang's layouts.

    Buffer shapes (``parts`` is 2 for K and V, absent for MLA's one latent row):

    - layer_first        ``[parts, layers, size, heads, head_dim]``
    - page_first         ``[parts, size, layers, heads, head_dim]``
    - page_first_direct  ``[parts, pages, layers, page, heads, head_dim]``
    - page_head          ``[parts, pages, heads, page, layers, head_dim]``

    A page is addressed by the host index of its first token, as SGLang does.
    """

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype, size: int, page_size: int,
                 layout_name: str = "layer_first", mla: bool = False):
        if layout_name not in LAYOUTS or (mla and layout_name == "page_head"):
            raise ValueError(f"host layout {layout_name!r} (mla={mla})")
        self.layout, self.mla, self.dtype = layout_name, mla, dtype
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.page_size, self.size = page_size, size - size % page_size
        pages, lead = self.size // page_size, () if mla else (2,)
        shape = {
            "layer_first": (layers, self.size, heads, head_dim),
            "page_first": (self.size, layers, heads, head_dim),
            "page_first_direct": (pages, layers, page_size, heads, head_dim),
            "page_head": (pages, heads, page_size, layers, head_dim),
        }[layout_name]
        self.kv_buffer = torch.zeros(*lead, *shape, dtype=dtype)
        self._lead = len(lead)

    def _page_view(self, index: int) -> torch.Tensor:
        """The pool's elements of the page starting at host index ``index`` (a view)."""
        keep = (slice(None),) * self._lead
        if self.layout == "layer_first":
            return self.kv_buffer[keep + (slice(None), slice(index, index + self.page_size))]
        if self.layout == "page_first":
            return self.kv_buffer[keep + (slice(index, index + self.page_size),)]
        page = index // self.page_size
        return self.kv_buffer[keep + (slice(page, page + 1),)]

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self._page_view(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self._page_view(0).numel(), dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        view = self._page_view(index)
        view.copy_(data_page.reshape(view.shape))

    def layer_pages(self, layer: int) -> torch.Tensor:
        """One layer as ``[parts, pages, page, heads, head_dim]``, a view for reading and writing."""
        keep = (slice(None),) * self._lead
        if self.layout == "layer_first":
            return self.kv_buffer[keep + (layer,)].unflatten(self._lead, (-1, self.page_size))
        if self.layout == "page_first":
            return self.kv_buffer[keep + (slice(None), layer)].unflatten(self._lead, (-1, self.page_size))
        if self.layout == "page_first_direct":
            return self.kv_buffer[keep + (slice(None), layer)]
        return self.kv_buffer[keep + (Ellipsis, layer, slice(None))].transpose(self._lead + 1, self._lead + 2)


class StatePool:
    """A Mamba-like auxiliary host pool: one slot per state, ``[slots, layers, 1, head_dim]``."""

    layout = "page_first"
    page_size = 1

    def __init__(self, layers: int, head_dim: int, slots: int, dtype: torch.dtype = torch.float32):
        self.dtype = dtype
        self.buffer = torch.zeros(slots, layers, 1, head_dim, dtype=dtype)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.buffer[index]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.buffer[0].numel(), dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.buffer[index] = data_page.reshape(self.buffer[index].shape)


def prefix_state(kv: List[torch.Tensor], pages: int) -> torch.Tensor:
    """The stand-in state after ``pages`` pages: per layer, the sum of K over the prefix and heads."""
    # contiguous first, so host and device copies of the same KV sum in the same order
    return torch.stack([k[0, :pages].contiguous().sum(dim=(0, 1, 2)) for k in kv])[:, None, :]


class SGLangLikeEngine:
    """One model, a K/V-first device cache with a trivial block table, a host pool and a backend."""

    def __init__(self, cfg: LlamaConfig, backend, page_size: int = 16, max_tokens: int = 1024,
                 host_layout: str = "layer_first", interface_v1: bool = True, hybrid: bool = False):
        self.cfg, self.backend, self.page_size = cfg, backend, page_size
        self.interface_v1, self.hybrid = interface_v1, hybrid
        self.model = Llama(cfg)
        blocks = -(-max_tokens // page_size)
        self.kv = [torch.zeros(2, blocks, page_size, cfg.kv_heads, cfg.head_dim, dtype=cfg.dtype)
                   for _ in range(cfg.layers)]
        self.lay = vllm_kv.Layout.detect(self.kv[0], form=vllm_kv.KV_FIRST)
        self.host = HostPool(cfg.layers, cfg.kv_heads, cfg.head_dim, cfg.dtype, max_tokens, page_size, host_layout)
        backend.register_mem_pool_host(self.host)
        self.states: Optional[StatePool] = None
        if hybrid:
            self.states = StatePool(cfg.layers, cfg.head_dim, blocks)
            backend.register_mem_host_pool_v2(self.host, PoolName.KV)
            backend.register_mem_host_pool_v2(self.states, PoolName.MAMBA)
        self.state_loads: List[bool] = []  # per load: did the loaded state match the loaded KV

    def prefill(self, prompt: List[int]) -> Tuple[torch.Tensor, int]:
        """Logits of the last prompt token and how many tokens came from storage."""
        keys = page_hashes(prompt, self.page_size)
        loaded = self._load(keys[: (len(prompt) - 1) // self.page_size])
        slots = torch.arange(len(prompt), dtype=torch.int64)  # block i holds tokens of page i
        new = torch.arange(loaded, len(prompt), dtype=torch.int64)
        logits = self.model.forward(torch.as_tensor(prompt[loaded:]), new, slots[loaded:], slots, self.kv,
                                    self.lay)
        self._write_back(keys)
        return logits[-1], loaded

    # ----- prefetch and load back

    def _hit(self, keys: List[str]) -> int:
        if not self.hybrid:
            return self.backend.batch_exists(keys)
        state = PoolTransfer(PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        return self.backend.batch_exists_v2(keys, [state]).kv_hit_pages

    def _load(self, keys: List[str]) -> int:
        hit = self._hit(keys) if keys else 0
        if hit == 0:
            return 0
        pages = self._get_pages(keys[:hit], torch.arange(hit * self.page_size, dtype=torch.int64))
        if pages and self.hybrid and not self._get_state(keys[pages - 1], pages):
            return 0  # a hybrid model cannot resume without the state at the end of the prefix
        for layer in range(self.cfg.layers):
            self.kv[layer][:, :pages] = self.host.layer_pages(layer)[:, :pages]
        return pages * self.page_size

    def _get_pages(self, keys: List[str], host_indices: torch.Tensor) -> int:
        """Leading pages read into host pages 0.. (SGLang's zero-copy or generic path)."""
        if self.interface_v1:
            ok = self.backend.batch_get_v1(keys, host_indices)
        else:
            got = self.backend.batch_get(keys, [self.host.get_dummy_flat_data_page() for _ in keys])
            ok = [g is not None for g in got]
            for i, g in enumerate(got):
                if g is None:
                    break
                self.host.set_from_flat_data_page(int(host_indices[i * self.page_size]), g)
        return ok.index(False) if False in ok else len(ok)

    def _get_state(self, key: str, pages: int) -> bool:
        """The state after the last loaded page, checked against the KV those pages hold."""
        slot = torch.tensor([0], dtype=torch.int64)
        got = self.backend.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=slot, keys=[key])])
        if not all(got.get(PoolName.MAMBA, [False])):
            return False
        host_kv = [self.host.layer_pages(layer) for layer in range(self.cfg.layers)]
        ok = torch.equal(self.states.buffer[0], prefix_state(host_kv, pages))
        self.state_loads.append(ok)
        return ok

    # ----- write-back

    def _write_back(self, keys: List[str]) -> None:
        stored = self.backend.batch_exists(keys)
        todo = keys[stored:]
        if not todo:
            return
        first, n = stored * self.page_size, len(todo) * self.page_size
        for layer in range(self.cfg.layers):
            self.host.layer_pages(layer)[:, stored:stored + len(todo)] = self.kv[layer][:, stored:stored + len(todo)]
        host_indices = torch.arange(first, first + n, dtype=torch.int64)
        if self.interface_v1:
            self.backend.batch_set_v1(todo, host_indices)
        else:
            self.backend.batch_set(todo, [self.host.get_data_page(int(i)) for i in host_indices[::self.page_size]])
        if self.hybrid:
            self._set_states(keys, stored)

    def _set_states(self, keys: List[str], stored: int) -> None:
        """The state after each newly stored page, one slot each."""
        slots = torch.arange(stored, len(keys), dtype=torch.int64)
        for s in slots.tolist():
            self.states.buffer[s] = prefix_state(self.kv, s + 1)
        self.backend.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=slots, keys=keys[stored:])])
