"""The only place that imports SGLang.

With SGLang installed the backend subclasses SGLang's ``HiCacheStorage``;
without it a local abstract stand-in with the same method names is used,
so the backend is testable here. ``SGLANG_AVAILABLE`` says which.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import Any, List, Optional

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
        """Stand-in with the fields the backend reads (SGLang has more)."""

        tp_rank: int = 0
        tp_size: int = 1
        is_mla_model: bool = False
        is_page_first_layout: bool = False
        model_name: Optional[str] = None
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(ABC):
        """Stand-in for SGLang's storage base: the concrete parts the backend relies on."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None
