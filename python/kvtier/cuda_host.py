"""The CUDA runtime calls behind the connector's host copies, in one replaceable object.

:class:`kvtier.vllm_kv.CudaCopier` makes every CUDA call it needs through the
module-level :data:`runtime`: pinning the daemon's arena (``cudaHostRegister``),
unpinning it (``cudaHostUnregister``), streams, events and waiting for them. Keeping
them in one place lets tests on a machine without a GPU put a recorder there and check
the order of those calls — above all on close, where copies must finish before the
range is unpinned and unpinning must come before the arena is remapped (docs/vllm.md,
*Closing a connection on a GPU*). Only CudaCopier uses it; the CPU copier makes no
CUDA call at all.
"""

from __future__ import annotations

from typing import Any

import torch


class Runtime:
    """torch.cuda, reduced to the calls the copier makes."""

    def register(self, ptr: int, nbytes: int) -> bool:
        """Pins ``nbytes`` of host memory at ``ptr`` for direct DMA; False if CUDA refuses."""
        rc = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
        return _code(rc) == 0

    def unregister(self, ptr: int) -> None:
        """Unpins the range registered at ``ptr``; raises RuntimeError if CUDA refuses."""
        rc = _code(torch.cuda.cudart().cudaHostUnregister(ptr))
        if rc != 0:
            raise RuntimeError(f"cudaHostUnregister: CUDA error {rc}")

    def synchronize(self, what: Any) -> None:
        """Waits until the work recorded in an event, or queued on a stream, has finished."""
        what.synchronize()

    def stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def on_stream(self, stream: Any) -> Any:
        """A context under which work is queued on ``stream``."""
        return torch.cuda.stream(stream)

    def record(self, stream: Any = None) -> Any:
        """An event recorded on ``stream`` (the calling thread's current stream when None)."""
        ev = torch.cuda.Event()
        ev.record(stream)
        return ev

    def wait(self, device: torch.device, ev: Any) -> None:
        """Makes the current stream of ``device`` wait for ``ev`` (without blocking the host)."""
        torch.cuda.current_stream(device).wait_event(ev)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _code(rc: Any) -> int:
    """A cudaError_t from torch's cudart bindings (an enum or an int) as an int."""
    return int(getattr(rc, "value", rc))


runtime = Runtime()
