"""Session fixtures: one real kvtier daemon binary, daemons per need."""

import os
import sys

import pytest

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from kvtier.testing import Daemon, daemon_binary  # noqa: E402

CHUNK = 16


@pytest.fixture(scope="session")
def kvtier_bin(tmp_path_factory):
    return daemon_binary(str(tmp_path_factory.mktemp("bin")))


@pytest.fixture(scope="session")
def daemon(kvtier_bin, tmp_path_factory):
    """A daemon shared by the tests that do not kill it (chunk size 16, 256 MiB RAM)."""
    d = Daemon(kvtier_bin, str(tmp_path_factory.mktemp("daemon")), chunk_size=CHUNK).start()
    yield d
    d.stop()


@pytest.fixture
def own_daemon(kvtier_bin, tmp_path):
    """A daemon a test may kill and restart, with a small disk tier."""
    d = Daemon(kvtier_bin, str(tmp_path), chunk_size=CHUNK, ram_gb=0.0625, disk_gb=0.25).start()
    yield d
    d.kill()
