"""Helpers that start a real ``kvtier serve`` for tests and the demo."""

from .daemon import Daemon, daemon_binary  # noqa: F401
