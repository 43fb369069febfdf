"""A daemon connection that heals itself, shared by the vLLM and SGLang adapters.

Engines must keep serving when the daemon restarts or dies, so adapters never
hold a :class:`~kvtier.client.Client` directly: they ask a :class:`Link` for
one on each call, report failures to it, and it reconnects — re-registering
the scope, since handles are per connection — on a later call.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Tuple

from . import defaults
from .client import Client, KVTierError

log = logging.getLogger("kvtier")


class Link:
    """A client that reconnects lazily after a failure and re-registers its scope.

    Reconnection is attempted at most once per ``reconnect_interval`` seconds,
    so a dead daemon costs one failed ``connect`` per interval, not one per
    request.
    """

    def __init__(self, socket_path: str, scope: Tuple[str, str, int, int], timeout: float = defaults.TIMEOUT,
                 reconnect_interval: float = defaults.RECONNECT_INTERVAL, namespace: str = "", name: str = "kvtier-python",
                 token: str = ""):
        self.socket_path, self.timeout, self.name = socket_path, timeout, name
        self._token = token  # presented in HELLO (auth.py); never logged
        self.reconnect_interval, self.namespace = reconnect_interval, namespace
        self.scope_args = scope  # (model, format, world size, rank)
        self.client: Optional[Client] = None
        self.scope = 0
        self._last_attempt = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> Client:
        """The live client, connecting if needed; raises KVTierError while the daemon is down."""
        with self._lock:
            if self.client is not None and not self.client.closed:
                return self.client
            now = time.monotonic()
            if now - self._last_attempt < self.reconnect_interval:
                raise KVTierError("kvtier: daemon unavailable (waiting before reconnecting)")
            self._last_attempt = now
            model, fmt, world, rank = self.scope_args
            c = Client(self.socket_path, timeout=self.timeout, name=self.name, token=self._token)
            try:
                self.scope = c.scope(model, fmt, world_size=world, rank=rank, namespace=self.namespace)
            except BaseException:
                c.close()
                raise
            self.client = c
            return c

    def fail(self, err: BaseException) -> None:
        """Logs a failure and drops the connection unless it was a plain error status.

        A status error (say NOT_FOUND for an expired lease) leaves the stream
        at a frame boundary, so the connection and its leases stay.
        """
        log.warning("kvtier: %s", err)
        with self._lock:
            if self.client is None:
                return
            plain_status = isinstance(err, KVTierError) and not isinstance(err, ConnectionError)
            if self.client.closed or not plain_status:
                self.client.close()
                self.client = None

    def close(self) -> None:
        with self._lock:
            if self.client is not None:
                self.client.close()
                self.client = None
