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

import contextlib
import ctypes
import logging
from typing import Any, Callable, Dict, List, Optional

import torch

log = logging.getLogger("kvtier")

HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context, not only the current one


class Runtime:
    """torch.cuda, reduced to the calls the copier makes."""

    def register(self, ptr: int, nbytes: int, device: Any = None) -> bool:
        """Pins ``nbytes`` of host memory at ``ptr`` for direct DMA; False if CUDA refuses.

        Made with ``device`` current, as :meth:`unregister` is: every thread uses the
        device's shared primary context, so a close on another thread unregisters it in the
        context that registered it, the ``torch.cuda.device`` guard making that device
        current whatever the thread's own is. Portable registration is about other CUDA
        contexts (a library creating its own): the range is pinned for them too. A refusal
        leaves no pending error behind (:meth:`clear_error`)."""
        with _on_device(device):
            rc = _code(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, HOST_REGISTER_PORTABLE))
            if rc != 0:
                self.clear_error()
        return rc == 0

    def unregister(self, ptr: int, device: Any = None) -> None:
        """Unpins the range registered at ``ptr``; raises RuntimeError if CUDA refuses
        (after clearing the error it leaves pending, see :meth:`clear_error`)."""
        with _on_device(device):
            rc = _code(torch.cuda.cudart().cudaHostUnregister(ptr))
            if rc != 0:
                self.clear_error()
        if rc != 0:
            raise RuntimeError(f"cudaHostUnregister: CUDA error {rc}")

    def clear_error(self) -> None:
        """Resets the calling thread's last CUDA runtime error (cudaGetLastError).

        A failed cudaHostRegister or cudaHostUnregister leaves its error pending in the
        thread's runtime state; torch's bindings return the code without clearing it, so
        the next kernel launch checked on this thread (vLLM's forward pass) would raise it
        as its own. torch's cudart() module binds cudaGetLastError in no version we know
        (torch 1.13 binds cudaHostRegister, cudaHostUnregister, cudaGetErrorString, the
        profiler and stream calls); it is used when present. Every runtime library mapped
        in the process is cleared too, through ctypes: each libcudart (there may be more
        than one, e.g. cupy's next to torch's, and which one torch uses cannot be told from
        the mappings) and, on ROCm, libamdhip64's hipGetLastError. Clearing a runtime with
        no error pending does nothing. Without any of them, the error is logged once."""
        fns = list(_mapped_get_last_errors())
        get = getattr(torch.cuda.cudart(), "cudaGetLastError", None)
        if get is not None:
            fns.insert(0, get)
        if not fns:
            _log_once("kvtier: cannot clear a CUDA error (no cudaGetLastError reachable); "
                      "the next CUDA call on this thread may report it")
            return
        for fn in fns:
            fn()

    def synchronize(self, what: Any) -> None:
        """Waits until the work recorded in an event, or queued on a stream, has finished."""
        what.synchronize()

    def stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream on ``device``."""
        return torch.cuda.current_stream(device)

    def on_stream(self, stream: Any) -> Any:
        """A context under which work is queued on ``stream``."""
        return torch.cuda.stream(stream)

    def keep(self, tensor: torch.Tensor, stream: Any) -> None:
        """Marks ``tensor`` as used by ``stream``: its memory is not reused before the work
        queued on ``stream`` so far has finished, whenever it is freed."""
        tensor.record_stream(stream)

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


def _on_device(device: Any) -> Any:
    if device is None or getattr(device, "type", "cuda") != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


# (library file name stem, its "get last error" function): CUDA's runtime, and HIP's on ROCm.
_RUNTIMES = (("libcudart", "cudaGetLastError"), ("libamdhip64", "hipGetLastError"))
_get_last_error: Dict[str, Optional[Callable[[], int]]] = {}  # by library path; None: not callable
_logged = False


def _mapped_get_last_errors() -> List[Callable[[], int]]:
    """The get-last-error function of every CUDA (or HIP) runtime library mapped in this
    process now. Looked up again on each call (only after a refused call, so rarely): a
    library loaded later (cupy's) is found too; each is opened once."""
    fns = []
    for stem, name in _RUNTIMES:
        for path in _loaded_libraries(stem):
            if path not in _get_last_error:
                try:
                    fn = getattr(ctypes.CDLL(path), name)  # already loaded: the same library
                    fn.restype, fn.argtypes = ctypes.c_int, []
                except (OSError, AttributeError):
                    fn = None
                _get_last_error[path] = fn
            if _get_last_error[path] is not None:
                fns.append(_get_last_error[path])
    return fns


def _loaded_libraries(stem: str) -> list:
    """Paths of the shared objects mapped in this process whose file name starts with ``stem``."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) > 5 else ""
                if path.rsplit("/", 1)[-1].startswith(stem) and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _log_once(msg: str) -> None:
    global _logged
    if not _logged:
        _logged = True
        log.warning(msg)


runtime = Runtime()
