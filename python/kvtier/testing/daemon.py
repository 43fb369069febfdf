"""Start, stop and restart a real ``kvtier serve`` process.

Tests and the demo talk to the actual Go daemon rather than a mock, so the
Python side is checked against the same bytes the Go side produces. The
binary is $KVTIER_BIN when set, else built once with ``go build``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Dict, Optional

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def daemon_binary(build_dir: Optional[str] = None) -> str:
    """Path to a kvtier binary: $KVTIER_BIN, or one built from this repository."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        return env
    build_dir = build_dir or tempfile.mkdtemp(prefix="kvtier-bin-")
    out = os.path.join(build_dir, "kvtier")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    subprocess.run([go, "build", "-o", out, "./cmd/kvtier"], cwd=REPO_ROOT, check=True)
    return out


class Daemon:
    """One ``kvtier serve`` with its own socket and data directory under ``workdir``."""

    def __init__(self, binary: str, workdir: str, chunk_size: int = 16, ram_gb: float = 0.25,
                 disk_gb: float = 0.0, extra_env: Optional[Dict[str, str]] = None, own_session: bool = False):
        # own_session: start the daemon in a session of its own, as a service manager would, so
        # the kernel's autogroup scheduling gives it a CPU share of its own instead of a part of
        # the caller's (benchmarks; tests leave it off).
        self.own_session = own_session
        self.binary, self.workdir = binary, workdir
        self.socket_path = os.path.join(workdir, "s.sock")
        self.log_path = os.path.join(workdir, "daemon.log")
        self.env = {
            "KVTIER_SOCKET_PATH": self.socket_path,
            "KVTIER_ADMIN_ADDR": "127.0.0.1:0",
            "KVTIER_MAX_LOCAL_CPU_SIZE": str(ram_gb),
            "KVTIER_CHUNK_SIZE": str(chunk_size),
            "KVTIER_DATA_DIR": os.path.join(workdir, "data"),
            "KVTIER_LOG_LEVEL": "warn",
        }
        if disk_gb > 0:
            self.env["KVTIER_LOCAL_DISK"] = os.path.join(workdir, "disk")
            self.env["KVTIER_MAX_LOCAL_DISK_SIZE"] = str(disk_gb)
            self.env["KVTIER_WRITE_QUEUE_DEPTH"] = "4096"
            self.env["KVTIER_WRITE_WAIT"] = "2s"
        self.env.update(extra_env or {})
        self.proc: Optional[subprocess.Popen] = None

    def start(self, wait: float = 20.0) -> "Daemon":
        """Starts the daemon and returns once its socket accepts connections."""
        os.makedirs(self.env["KVTIER_DATA_DIR"], exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVTIER_", "LMCACHE_"))}
        env.update(self.env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "serve"], env=env, stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, start_new_session=self.own_session)
        log.close()
        self._wait_ready(wait)
        return self

    def _wait_ready(self, wait: float) -> None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvtier serve exited with {self.proc.returncode}: {self.log()}")
            if self._accepts():
                return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"kvtier serve did not open {self.socket_path} in {wait}s: {self.log()}")

    def _accepts(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket_path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the daemon dies without any goodbye, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """SIGTERM and wait, the orderly shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> "Daemon":
        self.kill()
        return self.start()
