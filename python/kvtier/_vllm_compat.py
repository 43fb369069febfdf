"""The only place that imports vLLM.

With vLLM installed, the connector subclasses vLLM's own
``KVConnectorBase_V1`` and metadata class, so vLLM's factory accepts it.
Without vLLM (as on machines where only the test harness runs) small local
stand-ins with the same names and the same behaviour the connector relies on
are used instead: ``bind_connector_metadata`` / ``clear_connector_metadata`` /
``_get_connector_metadata`` and the role enum. ``VLLM_AVAILABLE`` says which.
"""

from __future__ import annotations

import enum
from typing import Any, Optional

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    VLLM_AVAILABLE = True
except ImportError:
    VLLM_AVAILABLE = False

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

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None, "no connector metadata bound for this step"
            return self._connector_metadata
