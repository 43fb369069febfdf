"""The only place that imports vLLM.

With vLLM installed, the connector subclasses vLLM's own
``KVConnectorBase_V1`` and metadata class, so vLLM's factory accepts it.
Without vLLM (as on machines where only the test harness runs) small local
stand-ins with the same names and the same behaviour the connector relies on
are used instead: ``bind_connector_metadata`` / ``clear_connector_metadata`` /
``_get_connector_metadata`` and the role enum, and the stats base class. ``VLLM_AVAILABLE`` says which.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore
    except ImportError:  # releases before connector stats
        KVConnectorStats = None  # type: ignore[assignment,misc]

    VLLM_AVAILABLE = True
except ImportError:
    VLLM_AVAILABLE = False
    KVConnectorStats = None  # type: ignore[assignment,misc]

    class KVConnectorRole(enum.Enum):
        """Stand-in for vLLM's enum: which process an instance lives in."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """Stand-in for vLLM's marker base of per-step metadata (plain, picklable data)."""

    class KVConnectorBase_V1:
        """Stand-in for vLLM's base class: only the concrete parts the connector uses."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
            self._vllm_config = vllm_config
            self._role = role
            self._kv_cache_config = kv_cache_config
            self._connector_metadata: Optional[KVConnectorMetadata] = None

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def handle_preemptions(self, kv_connector_metadata: Any) -> None:
            """Upstream's default: nothing to finish before preempted blocks are reused."""

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None, "no connector metadata bound for this step"
            return self._connector_metadata


if KVConnectorStats is None:

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        """Stand-in for vLLM's stats base: a ``data`` dict the connector fills and vLLM aggregates."""

        data: Dict[str, Any] = field(default_factory=dict)
