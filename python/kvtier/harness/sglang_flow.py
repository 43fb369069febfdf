"""A stand-in for SGLang's HiCache flow around a storage backend.

SGLang cannot be installed here, so this plays its part for one request:

1. page keys: chained sha256 hex digests of each full page's token ids
   (the shape of SGLang's ``get_hash_str``: prior digest bytes, then each
   token as 4 little-endian bytes);
2. prefetch: ``batch_exists`` over the prompt's pages (never the page with
   the last token, so at least one token is computed), then
   ``batch_get_v1`` into free host-pool pages;
3. load back: host pool → the model's device KV, then prefill the rest;
4. write-back: device KV → host pool → ``batch_set_v1`` for the pages
   storage does not have yet.

The host pool is SGLang's ``layer_first`` layout ``[2, layers, tokens,
heads, head_dim]`` with the two methods backends use, ``get_data_page`` and
``set_from_flat_data_page``.
"""

from __future__ import annotations

import hashlib
import struct
from typing import List, Optional, Tuple

import torch

from .. import layout
from .model import Llama, LlamaConfig


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
    """Layer-first host KV pool: ``[2, layers, size, heads, head_dim]``."""

    def __init__(self, cfg: LlamaConfig, size: int, page_size: int):
        self.page_size, self.dtype, self.layers = page_size, cfg.dtype, cfg.layers
        self.kv_buffer = torch.zeros(2, cfg.layers, size, cfg.kv_heads, cfg.head_dim, dtype=cfg.dtype)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, :, index:index + self.page_size]
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.kv_buffer[:, :, index:index + self.page_size] = data_page.view(
            2, self.layers, self.page_size, *self.kv_buffer.shape[3:])


class SGLangLikeEngine:
    """One model, a K/V-first device cache with a trivial block table, a host pool and a backend."""

    def __init__(self, cfg: LlamaConfig, backend, page_size: int = 16, max_tokens: int = 1024):
        self.cfg, self.backend, self.page_size = cfg, backend, page_size
        self.model = Llama(cfg)
        blocks = -(-max_tokens // page_size)
        self.kv = [torch.zeros(2, blocks, page_size, cfg.kv_heads, cfg.head_dim, dtype=cfg.dtype)
                   for _ in range(cfg.layers)]
        self.paged = layout.Paged.of(self.kv[0], layout.KV_FIRST)
        self.host = HostPool(cfg, max_tokens, page_size)
        backend.register_mem_pool_host(self.host)

    def prefill(self, prompt: List[int]) -> Tuple[torch.Tensor, int]:
        """Logits of the last prompt token and how many tokens came from storage."""
        keys = page_hashes(prompt, self.page_size)
        loaded = self._load(keys[: (len(prompt) - 1) // self.page_size])
        slots = torch.arange(len(prompt), dtype=torch.int64)  # block i holds tokens of page i
        new = torch.arange(loaded, len(prompt), dtype=torch.int64)
        logits = self.model.forward(torch.as_tensor(prompt[loaded:]), new, slots[loaded:], slots, self.kv,
                                    self.paged)
        self._write_back(keys)
        return logits[-1], loaded

    def _load(self, keys: List[str]) -> int:
        hit = self.backend.batch_exists(keys)
        if hit == 0:
            return 0
        host_indices = torch.arange(hit * self.page_size, dtype=torch.int64)
        ok = self.backend.batch_get_v1(keys[:hit], host_indices)
        pages = ok.index(False) if False in ok else len(ok)
        n = pages * self.page_size
        for layer in range(self.cfg.layers):
            # host [2, L, n, H, D] → device blocks 0..pages-1 ([2, blocks, page, H, D])
            self.kv[layer][:, :pages] = self.host.kv_buffer[:, layer, :n].reshape(
                2, pages, self.page_size, *self.kv[layer].shape[3:])
        return n

    def _write_back(self, keys: List[str]) -> None:
        stored = self.backend.batch_exists(keys)
        todo = keys[stored:]
        if not todo:
            return
        first, n = stored * self.page_size, len(todo) * self.page_size
        for layer in range(self.cfg.layers):
            self.host.kv_buffer[:, layer, first:first + n] = self.kv[layer][:, stored:stored + len(todo)].reshape(
                2, n, *self.kv[layer].shape[3:])
        self.backend.batch_set_v1(todo, torch.arange(first, first + n, dtype=torch.int64))
