"""The Python side's defaults, stated once for the client, the vLLM connector and the SGLang backend.

Each matches the daemon's own default where the daemon has one
(docs/configuration.md): the socket path is computed the way ``kvtier
serve`` computes it, and ``CHUNK_TOKENS`` is the daemon's ``chunk_size``
(the connectors learn the real value from the daemon's HELLO; this one is
only for tools that start a daemon themselves).
"""

from __future__ import annotations

import os

TIMEOUT = 5.0               # seconds any one daemon call may take
RECONNECT_INTERVAL = 1.0    # least seconds between reconnection attempts
LEASE_MS = 30000            # how long a lookup or read keeps chunks resident
CHUNK_TOKENS = 256          # the daemon's default chunk_size


def socket_path() -> str:
    """The socket path the daemon uses when none is configured."""
    env = os.environ.get("KVTIER_SOCKET_PATH")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/kvtier/kvtier.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "kvtier.sock")
    return f"/tmp/kvtier-{os.getuid()}.sock"
