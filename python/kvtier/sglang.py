"""kvtier as an SGLang HiCache storage backend (the L3 tier below host memory).

Register it as a dynamic backend::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KVTierStorage",
        "interface_v1": 1, "socket_path": "/run/kvtier/kvtier.sock"}'

SGLang names each page by a chained sha256 hex digest of its tokens (the
hash covers the whole prefix). The backend sends the first 16 bytes of that
digest as a kind-1 hash key, so one page is one kvtier object and
``batch_exists``' "consecutive hits from the start" is exactly the daemon's
LOOKUP answer. Page bytes are copied straight between SGLang's host pool and
the shared arena: no intermediate buffer, no bytes on the socket.

Every (dp, cp, tp, pp) rank of SGLang builds its own backend. The daemon
keys pages by scope, so the scope carries exactly the ranks whose pages hold
different bytes (see :func:`rank_scope`): pipeline stages hold different
layers and context-parallel ranks different slices of each page, so both
always separate; tensor-parallel ranks hold different heads unless the model
replicates its KV on every rank (MLA), where only TP rank 0 writes and every
rank must read its pages; attention-DP ranks hold the same model and share.

A page's byte order is whatever the host pool's layout makes it (SGLang's
``get_data_page``), and it is part of the scope's format, so pools of
different layouts never read each other's pages; layouts whose page bytes
kvtier cannot name are refused when the pool is registered.

Hybrid models (the v2 interface) add auxiliary pools — Mamba states, SWA,
indexer, draft — each registered under its name and stored in a scope of its
own, keyed by the same page hashes.

Any daemon failure reads as a miss (``None`` / ``False`` / 0) — HiCache then
recomputes — and the backend reconnects on a later call.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from . import defaults
from . import protocol as p
from ._sglang_compat import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    StorageMetrics,
)
from .auth import resolve_token
from .client import DEFAULT_TIMEOUT, Client, KVTierError, default_socket_path
from .layout import dtype_name
from .link import Link

log = logging.getLogger("kvtier.sglang")

_ABSORBED = (KVTierError, OSError, p.ProtocolError, ValueError, RuntimeError)

KV = "kv"
# The one auxiliary pool that is split over TP ranks even when the KV itself is
# replicated (MLA): SGLang backs it up from every TP rank.
_TP_SHARDED_ALWAYS = frozenset({"mamba"})

# SGLang's host pool layouts (--hicache-mem-layout) whose page bytes kvtier
# names: layout -> (tag for a K/V pool, tag for an MLA pool). A flat page is
#   layer_first        [2, layers, page, heads, head_dim]  (MLA: [layers, page, 1, dim])
#   page_first_direct  the same bytes as layer_first
#   page_first         [2, page, layers, heads, head_dim]  (MLA: [page, layers, 1, dim])
#   page_head          [2, heads, page, layers, head_dim]  (no MLA pool has it)
# so layer_first and page_first_direct share pages, and the others do not.
_LAYOUT_TAGS = {
    "layer_first": ("KV_2LTD", "KV_MLA_FMT"),
    "page_first_direct": ("KV_2LTD", "KV_MLA_FMT"),
    "page_first": ("sglang_page_first", "sglang_mla_page_first"),
    "page_head": ("sglang_page_head", None),
}
SUPPORTED_LAYOUTS = tuple(_LAYOUT_TAGS)
_REFUSED_WHY = {
    "page_first_kv_split": "Ascend NPU MLA pools keep the two parts of a page in separate tensors",
}


def page_key(key: str) -> bytes:
    """16-byte kvtier hash of an SGLang page key (a sha256 hex digest, possibly suffixed)."""
    try:
        raw = bytes.fromhex(key[:32])
    except ValueError:
        raw = b""
    if len(raw) == 16:
        return raw
    return hashlib.sha256(key.encode("utf-8")).digest()[:16]


def pool_name(name: Any) -> str:
    """A pool's name as a plain string (SGLang passes PoolName members or strings)."""
    return str(getattr(name, "value", name))


def check_layout(layout: str, mla: bool = False) -> str:
    """The format tag of a pool layout; ValueError for layouts kvtier does not store."""
    tags = _LAYOUT_TAGS.get(layout)
    tag = tags[1 if mla else 0] if tags else None
    if tag is None:
        why = _REFUSED_WHY.get(layout, "its page bytes have no kvtier format")
        kind = "MLA " if mla else ""
        raise ValueError(f"kvtier: SGLang host pool layout {layout!r} is not supported for {kind}KV pages "
                         f"({why}); use --hicache-mem-layout with one of {', '.join(SUPPORTED_LAYOUTS)}")
    return tag


@dataclass(frozen=True)
class RankScope:
    """The parallel position a backend's pages are keyed by: world size, rank, and the shape."""

    world: int
    rank: int
    shape: str  # "" when world and rank say it all (pipeline and context parallel off)


def rank_scope(cfg: Any, replicated: bool) -> RankScope:
    """Which of SGLang's ranks hold different bytes for the same page, as one (world, rank).

    - PP ranks hold different layers: always separate.
    - Attention-CP ranks each hold a disjoint slice of every page: always separate.
    - TP ranks hold different heads, unless ``replicated`` (MLA: every rank has
      the whole latent KV, only TP rank 0 backs it up, and all read it).
    - DP ranks are left out: attention-DP replicas run the same model with the
      same attention-TP split (SGLang reports attention-TP in tp_rank/tp_size),
      so a page's bytes do not depend on which replica computed it.

    The ranks are folded into one index, pp-major; when pipeline or context
    parallelism is on, ``shape`` names the sizes so that two layouts with the
    same world size (tp=2 and pp=2, say) never share a scope.
    """
    tp_size, tp_rank = (1, 0) if replicated else (_int(cfg, "tp_size", 1), _int(cfg, "tp_rank", 0))
    pp_size, pp_rank = _int(cfg, "pp_size", 1), _int(cfg, "pp_rank", 0)
    cp_size, cp_rank = _int(cfg, "attn_cp_size", 1), _int(cfg, "attn_cp_rank", 0)
    for what, rank, size in (("tp", tp_rank, tp_size), ("pp", pp_rank, pp_size), ("attn_cp", cp_rank, cp_size)):
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"kvtier: {what}_rank {rank} is outside {what}_size {size}")
    world = tp_size * cp_size * pp_size
    rank = (pp_rank * cp_size + cp_rank) * tp_size + tp_rank
    shape = "" if pp_size == cp_size == 1 else f"pp{pp_size}.cp{cp_size}.tp{tp_size}"
    return RankScope(world, rank, shape)


def _int(cfg: Any, field: str, default: int) -> int:
    value = getattr(cfg, field, None)
    return default if value is None else int(value)


def _dtype_label(dtype: Optional[torch.dtype]) -> str:
    if dtype is None:
        return "bytes"
    try:
        return dtype_name(dtype)
    except KeyError:  # fp8 and other dtypes kvtier's Go side has no name for
        return str(dtype).replace("torch.", "")


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous uint8 view of a tensor's bytes (copying only if it is not contiguous)."""
    return t.contiguous().view(-1).view(torch.uint8)


def _as_bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor, for writing into it in place."""
    if not t.is_contiguous():
        raise ValueError("target page must be contiguous")
    return t.view(-1).view(torch.uint8)


class _Traffic:
    """Pages and GB/s of each read and write batch since the last drain, for SGLang's metrics."""

    def __init__(self):
        self._lock = threading.Lock()
        self._m = StorageMetrics()

    def note(self, read: bool, pages: int, nbytes: int, seconds: float) -> None:
        if pages <= 0:
            return
        gbps = nbytes / 1e9 / seconds if seconds > 0 else 0.0
        with self._lock:
            if read:
                self._m.prefetch_pgs.append(pages)
                self._m.prefetch_bandwidth.append(gbps)
            else:
                self._m.backup_pgs.append(pages)
                self._m.backup_bandwidth.append(gbps)

    def drain(self) -> StorageMetrics:
        with self._lock:
            m, self._m = self._m, StorageMetrics()
        return m


@dataclass
class _PoolIO:
    """A registered host pool and the daemon connection holding its scope."""

    name: str
    pool: Any
    link: Link
    page_size: int
    page_dtype: torch.dtype
    page_bytes: int

    def page_index(self, host_indices: torch.Tensor, i: int) -> int:
        """Host-pool index of the i-th page's first token (SGLang passes every token's index)."""
        return int(host_indices[i * self.page_size])


class KVTierStorage(HiCacheStorage):
    """HiCacheStorage over a node-local kvtier daemon."""

    def __init__(self, storage_config: Optional[HiCacheStorageConfig] = None, kwargs: Optional[dict] = None):
        cfg = storage_config or HiCacheStorageConfig()
        extra = dict(getattr(cfg, "extra_config", None) or {})
        extra.update(kwargs or {})
        self.cfg = cfg
        self.mla = bool(getattr(cfg, "is_mla_model", False))
        # Before the host pool is registered only this flag tells the layout.
        self.layout = "page_first" if getattr(cfg, "is_page_first_layout", False) else "layer_first"
        check_layout(self.layout, self.mla)
        self.model = getattr(cfg, "model_name", None) or "unknown-model"
        self.socket_path = str(extra.get("socket_path") or default_socket_path())
        self.timeout = float(extra.get("timeout", DEFAULT_TIMEOUT))
        self.reconnect_interval = float(extra.get("reconnect_interval", defaults.RECONNECT_INTERVAL))
        self.namespace = str(extra.get("namespace", ""))
        self.lease_ms = int(extra.get("lease_ms", defaults.LEASE_MS))
        # For a daemon with tenants (auth.py); never logged.
        self._token = resolve_token(str(extra.get("token", "")), str(extra.get("token_file", "")))
        self._format_override = str(extra.get("format", ""))
        if getattr(cfg, "should_split_heads", False):
            log.warning("kvtier: tp_lcm_size head splitting is not supported; pages are stored per TP rank, "
                        "so ranks of different TP sizes do not share them")
        self.mem_pool_host = None
        self.traffic = _Traffic()
        self.link = self._new_link(self._kv_format(None), replicated=self.mla)
        self._pools: Dict[str, _PoolIO] = {}

    # ----- scopes

    def _kv_format(self, dtype: Optional[torch.dtype]) -> str:
        if self._format_override:
            return self._format_override
        return f"{_dtype_label(dtype)}/{check_layout(self.layout, self.mla)}"

    def _new_link(self, fmt: str, replicated: bool) -> Link:
        rs = rank_scope(self.cfg, replicated)
        if rs.shape:
            fmt = f"{fmt};{rs.shape}"
        return Link(self.socket_path, (self.model, fmt, rs.world, rs.rank), timeout=self.timeout,
                    reconnect_interval=self.reconnect_interval, namespace=self.namespace, name="sglang",
                    token=self._token)

    def _io(self, name: str, pool: Any, link: Link) -> _PoolIO:
        sample = pool.get_data_page(0, flat=True)
        page_size = int(getattr(pool, "page_size", 1) or 1)
        return _PoolIO(name, pool, link, page_size, sample.dtype, sample.numel() * sample.element_size())

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes the KV host pool: its layout and dtype become part of the scope.

        SGLang's dynamic factory does not pass the pool to the constructor but
        registers it right after, inside the same attach step, so an
        unsupported layout refused here fails the backend's setup.
        """
        layout = str(getattr(mem_pool_host, "layout", self.layout))
        check_layout(layout, self.mla)
        super().register_mem_pool_host(mem_pool_host)
        self.layout = layout
        self.link.close()
        fmt = self._kv_format(getattr(mem_pool_host, "dtype", None))
        self.link = self._new_link(fmt, replicated=self.mla)
        self._pools[KV] = self._io(KV, mem_pool_host, self.link)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Takes one pool of a hybrid model; its pages get a scope of their own."""
        name = pool_name(host_pool_name)
        if name == KV:
            # SGLang registers the KV pool both ways; the second must not reset its scope.
            if self._pools.get(KV) is None or self._pools[KV].pool is not host_pool:
                self.register_mem_pool_host(host_pool)
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            return
        layout = str(getattr(host_pool, "layout", "") or "flat")
        if layout != "flat":
            check_layout(layout)  # raises for layouts kvtier does not store
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        old = self._pools.get(name)
        if old is not None:
            old.link.close()
        fmt = f"{_dtype_label(getattr(host_pool, 'dtype', None))}/sglang_{name}_{layout}"
        replicated = self.mla and name not in _TP_SHARDED_ALWAYS
        self._pools[name] = self._io(name, host_pool, self._new_link(fmt, replicated))

    def _links(self) -> List[Link]:
        links = [self.link]
        links += [io.link for io in self._pools.values() if io.link is not self.link]
        return links

    # ----- daemon operations, absorbing failures

    def _keys(self, c: Client, link: Link, keys: Sequence[str]) -> p.Keys:
        return c.hashes(link.scope, [page_key(k) for k in keys])

    def _lookup(self, link: Link, keys: Sequence[str]) -> int:
        """Pages present from the first key on (0 on any failure)."""
        if not keys:
            return 0
        try:
            c = link.get()
            return c.lookup(self._keys(c, link, keys)).chunks
        except _ABSORBED as e:
            link.fail(e)
            return 0

    def _retrieve(self, link: Link, keys: Sequence[str], consume) -> int:
        """Leases the leading cached pages, calls consume(i, bytes) for each; returns how many."""
        if not keys:
            return 0
        start = time.perf_counter()
        try:
            c = link.get()
            slots = c.prepare_retrieve(self._keys(c, link, keys), self.lease_ms)
        except _ABSORBED as e:
            link.fail(e)
            return 0
        done = 0
        try:
            for i, s in enumerate(slots.slots):
                consume(i, c.slot_tensor(s))
                done = i + 1
        except _ABSORBED as e:
            log.error("kvtier: reading pages: %s", e)
        finally:
            self._release(c, link, slots.lease)
        self.traffic.note(True, done, sum(s.length for s in slots.slots[:done]), time.perf_counter() - start)
        return done

    def _release(self, c: Client, link: Link, lease: int) -> None:
        if not lease:
            return
        try:
            c.release(lease)
        except _ABSORBED as e:
            link.fail(e)

    def _store(self, link: Link, keys: Sequence[str], sizes: Sequence[int], produce) -> int:
        """Reserves slots, lets produce(i, dst) fill each new page, commits; returns pages stored."""
        if not keys:
            return 0
        start = time.perf_counter()
        try:
            c = link.get()
            slots = c.prepare_store(self._keys(c, link, keys), list(sizes), self.lease_ms)
        except _ABSORBED as e:
            link.fail(e)
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
            if slots.lease:
                c.commit_store(slots.lease, count)
        except _ABSORBED as e:
            link.fail(e)
            return 0
        self.traffic.note(False, count, sum(sizes[:count]), time.perf_counter() - start)
        return count

    # ----- page moves between a registered pool and the arena

    def _pool_get(self, io: _PoolIO, keys: Sequence[str], host_indices: torch.Tensor) -> List[bool]:
        """Reads pages straight from the arena into the pool, one per key."""
        if not self._indices_fit(io, keys, host_indices):
            return [False] * len(keys)

        def consume(i: int, src: torch.Tensor) -> None:
            if src.numel() != io.page_bytes:
                raise ValueError(f"{io.name} page {keys[i]}: {src.numel()} bytes stored, the pool's pages hold "
                                 f"{io.page_bytes}")
            io.pool.set_from_flat_data_page(io.page_index(host_indices, i), src.view(io.page_dtype))

        n = self._retrieve(io.link, keys, consume)
        return [i < n for i in range(len(keys))]

    def _pool_set(self, io: _PoolIO, keys: Sequence[str], host_indices: torch.Tensor) -> List[bool]:
        """Writes the pool's pages, one per key, straight into arena slots."""
        if not self._indices_fit(io, keys, host_indices):
            return [False] * len(keys)

        def produce(i: int, dst: torch.Tensor) -> None:
            # One page at a time: a contiguous page goes from the pool to the arena
            # in one copy, and a strided one needs only one page of scratch.
            dst.copy_(_as_bytes(io.pool.get_data_page(io.page_index(host_indices, i), flat=True)))

        n = self._store(io.link, keys, [io.page_bytes] * len(keys), produce)
        return [i < n for i in range(len(keys))]

    @staticmethod
    def _indices_fit(io: _PoolIO, keys: Sequence[str], host_indices: Optional[torch.Tensor]) -> bool:
        """SGLang passes one host index per token: exactly page_size of them per key."""
        got = 0 if host_indices is None else int(host_indices.numel())
        if got != len(keys) * io.page_size:
            log.error("kvtier: %s pool: %d host indices for %d pages of %d", io.name, got, len(keys), io.page_size)
            return False
        return True

    def _kv_io(self) -> _PoolIO:
        io = self._pools.get(KV)
        if io is None:
            raise RuntimeError("kvtier: register_mem_pool_host was not called")
        return io

    # ----- the HiCacheStorage interface

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        """Pages into ``target_locations`` (tensors) when given, else into new tensors."""
        out: List[Optional[torch.Tensor]] = [None] * len(keys)
        kv = self._pools.get(KV)

        def consume(i: int, src: torch.Tensor) -> None:
            if target_locations is not None:
                dst = target_locations[i]
                if dst.numel() * dst.element_size() != src.numel():
                    raise ValueError(f"page {keys[i]}: {src.numel()} bytes, target holds {dst.numel() * dst.element_size()}")
                _as_bytes_view(dst).copy_(src)
                out[i] = dst
            else:
                out[i] = src.clone().view(kv.page_dtype if kv else torch.uint8)

        self._retrieve(self.link, keys, consume)
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
        return self._store(self.link, keys, [v.numel() for v in pages],
                           lambda i, dst: dst.copy_(pages[i])) == len(keys)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Pages present from the first key on: the daemon's LOOKUP hit, in chunks."""
        return self._lookup(self.link, keys)

    # ----- zero-copy (interface_v1) over the registered KV pool

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Reads pages straight from the arena into the KV host pool at ``host_indices``."""
        return self._pool_get(self._kv_io(), keys, host_indices)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Writes KV host-pool pages at ``host_indices`` straight into arena slots."""
        return self._pool_set(self._kv_io(), keys, host_indices)

    # ----- hybrid models (v2): several pools per page

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        """The usable prefix: the KV hit, cut to where every pool has what its policy needs."""
        kv_pages = self._lookup(self.link, keys)
        hits: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        usable = kv_pages
        for t in pool_transfers or []:
            if usable == 0:
                break
            io = self._pools.get(pool_name(t.name))
            boundary = 0 if io is None else self._pool_boundary(io, keys, kv_pages, t)
            if boundary:
                hits[t.name] = boundary
            usable = min(usable, boundary)
        return PoolTransferResult(usable, hits)

    def _pool_boundary(self, io: _PoolIO, keys: List[str], kv_pages: int, t: PoolTransfer) -> int:
        """How much of the KV hit this pool can back, under the transfer's hit policy."""
        if pool_name(t.hit_policy) != pool_name(PoolHitPolicy.TRAILING_PAGES):
            return self._lookup(io.link, keys[:kv_pages])  # every page from the first
        window = max(1, len(t.keys or []))
        end = kv_pages
        while end > 0:
            start = max(0, end - window)
            present = self._lookup(io.link, keys[start:end])
            if present == end - start:
                return end
            # The page at start+present is missing: no window covering it will do.
            end = start + present
        return 0

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        """Each transfer's pages from its pool's scope into that pool: per pool, per page success."""
        return self._each_transfer(transfers, self._pool_get)

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        """Each transfer's pages from its pool into the pool's scope: per pool, per page success."""
        return self._each_transfer(transfers, self._pool_set)

    def _each_transfer(self, transfers: List[PoolTransfer], move) -> Dict[Any, List[bool]]:
        results: Dict[Any, List[bool]] = {}
        for t in transfers:
            keys = list(t.keys or [])
            io = self._pools.get(pool_name(t.name))
            if io is None:
                log.error("kvtier: pool %s was never registered", pool_name(t.name))
                results[t.name] = [False] * len(keys)
                continue
            results[t.name] = move(io, keys, t.host_indices)
        return results

    # ----- housekeeping

    def clear(self) -> None:
        """Drops every pool's pages of this rank from the daemon's RAM and disk tiers."""
        for link in self._links():
            try:
                link.get().clear(link.scope)
            except _ABSORBED as e:
                link.fail(e)

    def get_stats(self) -> StorageMetrics:
        """Pages and GB/s per batch since the last call: what SGLang's storage metrics log.

        SGLang asserts the type of what this returns (``StorageMetrics``), so the
        daemon's own statistics are :meth:`daemon_stats` instead.
        """
        return self.traffic.drain()

    def daemon_stats(self) -> Optional[dict]:
        """The daemon's STATS document (None while it is unreachable)."""
        try:
            return self.link.get().stats()
        except _ABSORBED as e:
            self.link.fail(e)
            return None

    def close(self) -> None:
        for link in self._links():
            link.close()
