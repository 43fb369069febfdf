"""The only place that imports SGLang.

With SGLang installed the backend subclasses SGLang's ``HiCacheStorage``;
without it a local abstract stand-in with the same method names is used,
so the backend is testable here. ``SGLANG_AVAILABLE`` says which.

The v2 types (``PoolName``, ``PoolTransfer``, ...) arrived later than the
base class: a release that has the base but not them still gets the real
base class, with local stand-ins for the v2 types, so the backend loads on
both (SGLang's factory checks ``issubclass(cls, HiCacheStorage)``).

The stand-ins follow python/sglang/srt/mem_cache/hicache_storage.py at
commit 001067f (main, November 2026): field names, defaults and meanings.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

try:  # pragma: no cover - exercised only where SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )

    SGLANG_AVAILABLE = True
except ImportError:
    SGLANG_AVAILABLE = False

    @dataclass
    class HiCacheStorageConfig:
        """Stand-in with SGLang's fields; defaults here only so tests can name what they vary."""

        tp_rank: int = 0
        tp_size: int = 1
        pp_rank: int = 0
        pp_size: int = 1
        attn_cp_rank: int = 0
        attn_cp_size: int = 1
        is_mla_model: bool = False
        enable_storage_metrics: bool = False
        is_page_first_layout: bool = False
        model_name: Optional[str] = None
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(ABC):
        """Stand-in for SGLang's storage base: the concrete parts the backend relies on."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None


try:  # pragma: no cover - exercised only where SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )
except ImportError:

    class PoolName(str, Enum):
        """Pool names HiCache uses as PoolTransfer identifiers."""

        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, Enum):
        """all_pages: every page of the KV hit must exist; trailing_pages: only the last N."""

        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclass
    class PoolTransfer:
        """One pool's part of a v2 transfer: host indices and page keys (storage side)."""

        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: Any = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Any = None

    @dataclass
    class PoolTransferResult:
        """The usable KV prefix in pages, and each pool's own hit."""

        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int]


try:  # pragma: no cover - exercised only where SGLang is installed
    from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
except ImportError:

    @dataclass
    class StorageMetrics:
        """What SGLang's storage metrics collector reads from ``get_stats()``: per batch, pages and GB/s."""

        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)
