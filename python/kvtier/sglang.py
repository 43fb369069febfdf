"""kvtier as an SGLang HiCache storage backend (the L3 tier below host memory).

Register it as a dynamic backend::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KVTierStorage",
        "socket_path": "/run/kvtier/kvtier.sock"}'

SGLang names each page by a chained sha256 hex digest of its tokens (the
hash covers the whole prefix). The backend sends the first 16 bytes of that
digest as a kind-1 hash key, so one page is one kvtier object and
``batch_exists``' "consecutive hits from the start" is exactly the daemon's
LOOKUP answer. Page bytes are copied straight between SGLang's host pool and
the shared arena: no intermediate buffer, no bytes on the socket.

With a ``layer_first`` host pool a flat page is ``[2, layers, page_size,
heads, head_dim]``, which is kvtier's KV_2LTD, so the scope's format says so.

Any daemon failure reads as a miss (``None`` / ``False`` / 0) — HiCache then
recomputes — and the backend reconnects on a later call.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, List, Optional, Sequence

import torch

from . import protocol as p
from ._sglang_compat import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo
from .client import Client, KVTierError, default_socket_path
from .layout import dtype_name
from .link import Link

log = logging.getLogger("kvtier.sglang")

_ABSORBED = (KVTierError, OSError, p.ProtocolError, ValueError, RuntimeError)


def page_key(key: str) -> bytes:
    """16-byte kvtier hash of an SGLang page key (a sha256 hex digest, possibly suffixed)."""
    try:
        raw = bytes.fromhex(key[:32])
    except ValueError:
        raw = b""
    if len(raw) == 16:
        return raw
    return hashlib.sha256(key.encode("utf-8")).digest()[:16]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous uint8 view of a tensor's bytes (copying only if it is not contiguous)."""
    return t.contiguous().view(-1).view(torch.uint8)


class KVTierStorage(HiCacheStorage):
    """HiCacheStorage over a node-local kvtier daemon."""

    def __init__(self, storage_config: Optional[HiCacheStorageConfig] = None, kwargs: Optional[dict] = None):
        cfg = storage_config or HiCacheStorageConfig()
        extra = dict(getattr(cfg, "extra_config", None) or {})
        extra.update(kwargs or {})
        self.page_first = bool(getattr(cfg, "is_page_first_layout", False))
        self._format_override = extra.get("format", "")
        self.mem_pool_host = None
        model = getattr(cfg, "model_name", None) or "unknown-model"
        world = 1 if getattr(cfg, "is_mla_model", False) else int(getattr(cfg, "tp_size", 1))
        rank = 0 if getattr(cfg, "is_mla_model", False) else int(getattr(cfg, "tp_rank", 0))
        self.link = Link(str(extra.get("socket_path") or default_socket_path()),
                         (model, self._format(None), world, rank), timeout=float(extra.get("timeout", 5.0)),
                         reconnect_interval=float(extra.get("reconnect_interval", 1.0)),
                         namespace=str(extra.get("namespace", "")), name="sglang")
        self.lease_ms = int(extra.get("lease_ms", 30000))

    def _format(self, dtype: Optional[torch.dtype]) -> str:
        if self._format_override:
            return self._format_override
        name = dtype_name(dtype) if dtype is not None else "bytes"
        return f"{name}/{'sglang_page_first' if self.page_first else 'KV_2LTD'}"

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Remembers the host pool; its dtype becomes part of the scope."""
        self.mem_pool_host = mem_pool_host
        model, _, world, rank = self.link.scope_args
        self.link.close()
        self.link.scope_args = (model, self._format(getattr(mem_pool_host, "dtype", None)), world, rank)

    # ----- helpers

    def _keys(self, c: Client, keys: Sequence[str]) -> p.Keys:
        return c.hashes(self.link.scope, [page_key(k) for k in keys])

    def _retrieve(self, keys: Sequence[str], consume) -> int:
        """Leases the leading cached pages, calls consume(i, bytes) for each; returns how many."""
        if not keys:
            return 0
        try:
            c = self.link.get()
            slots = c.prepare_retrieve(self._keys(c, keys), self.lease_ms)
        except _ABSORBED as e:
            self.link.fail(e)
            return 0
        try:
            for i, s in enumerate(slots.slots):
                consume(i, c.slot_tensor(s))
            return len(slots.slots)
        except _ABSORBED as e:
            log.error("kvtier: reading pages: %s", e)
            return 0
        finally:
            self._release(c, slots.lease)

    def _release(self, c: Client, lease: int) -> None:
        if not lease:
            return
        try:
            c.release(lease)
        except _ABSORBED as e:
            self.link.fail(e)

    def _store(self, keys: Sequence[str], sizes: Sequence[int], produce) -> int:
        """Reserves slots, lets produce(i, dst) fill each new page, commits; returns pages stored."""
        if not keys:
            return 0
        try:
            c = self.link.get()
            slots = c.prepare_store(self._keys(c, keys), list(sizes), self.lease_ms)
        except _ABSORBED as e:
            self.link.fail(e)
            return 0
        count = 0
        try:
            for i, s in enumerate(slots.slots):
                if s.state == p.SLOT_WRITE:
                    produce(i, c.slot_tensor(s))
                count = i + 1
        except _ABSORBED as e:
            log.error("kvtier: writing pages: %s", e)
        try:
            c.commit_store(slots.lease, count) if slots.lease else None
        except _ABSORBED as e:
            self.link.fail(e)
            return 0
        return count

    # ----- the HiCacheStorage interface

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        """Pages into ``target_locations`` (tensors) when given, else into new tensors."""
        out: List[Optional[torch.Tensor]] = [None] * len(keys)

        def consume(i: int, src: torch.Tensor) -> None:
            if target_locations is not None:
                dst = target_locations[i]
                if dst.numel() * dst.element_size() != src.numel():
                    raise ValueError(f"page {keys[i]}: {src.numel()} bytes, target holds {dst.numel() * dst.element_size()}")
                _as_bytes_view(dst).copy_(src)
                out[i] = dst
            else:
                dtype = getattr(self.mem_pool_host, "dtype", torch.uint8)
                out[i] = src.clone().view(dtype)

        self._retrieve(keys, consume)
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value] if value is not None else None,
                              [target_location] if target_location is not None else None)

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        pages = values if values is not None else target_locations
        if pages is None or len(pages) != len(keys):
            return False
        pages = [_as_bytes(v) for v in pages]
        return self._store(keys, [v.numel() for v in pages], lambda i, dst: dst.copy_(pages[i])) == len(keys)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Pages present from the first key on: the daemon's LOOKUP hit, in chunks."""
        if not keys:
            return 0
        try:
            c = self.link.get()
            return c.lookup(self._keys(c, keys)).chunks
        except _ABSORBED as e:
            self.link.fail(e)
            return 0

    # ----- zero-copy variants over the registered host pool

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Reads pages straight from the arena into the host pool at ``host_indices``."""
        pool = self._pool()
        page = pool.page_size

        def consume(i: int, src: torch.Tensor) -> None:
            pool.set_from_flat_data_page(int(host_indices[i * page]), src.view(pool.dtype))

        n = self._retrieve(keys, consume)
        return [i < n for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Writes host-pool pages at ``host_indices`` straight into arena slots."""
        pool = self._pool()
        page = pool.page_size
        pages = [pool.get_data_page(int(host_indices[i * page]), flat=True) for i in range(len(keys))]
        n = self._store(keys, [v.numel() * v.element_size() for v in pages],
                        lambda i, dst: dst.copy_(_as_bytes(pages[i])))
        return [i < n for i in range(len(keys))]

    def _pool(self):
        if self.mem_pool_host is None:
            raise RuntimeError("kvtier: register_mem_pool_host was not called")
        return self.mem_pool_host

    def clear(self) -> None:
        """Drops this scope's pages from the daemon's RAM tier."""
        try:
            c = self.link.get()
            c.clear(self.link.scope)
        except _ABSORBED as e:
            self.link.fail(e)

    def get_stats(self):
        try:
            return self.link.get().stats()
        except _ABSORBED as e:
            self.link.fail(e)
            return None

    def close(self) -> None:
        self.link.close()


def _as_bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor, for writing into it in place."""
    if not t.is_contiguous():
        raise ValueError("target page must be contiguous")
    return t.view(-1).view(torch.uint8)
