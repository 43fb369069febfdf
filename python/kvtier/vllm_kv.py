"""vLLM's paged KV, in every layout vLLM has used, ⇄ kvtier chunks.

Every per-layer KV tensor vLLM hands a connector is reduced to one
*canonical view* ``[blocks, heads, tokens_in_block, parts, dim]`` — parts is 2
(K then V) for ordinary attention and 1 for MLA's single latent — without a
copy and without assuming contiguity: the view is built from strides, so
any physical permutation works.

Layouts (``Layout.form``):

``packed``
    vLLM ≥ 0.26 (PR 44455) and the standardized vocabulary of PR 51718: a
    layer is logically ``[B, H, N, 2*D]``, K in the first half of the content
    dim. The physical permutation (``LBNHC``, ``LBHNC``, ``LHBNC`` …) only
    changes strides, which the view follows.
``block_first`` / ``kv_first``
    Older 5-D shapes ``[B, 2, N, H, D]`` and ``[2, B, N, H, D]`` (NHD or HND
    by stride order).
``mla``
    ``[B, N, latent]`` (or ``[B, 1, N, latent]``), one latent per token.

Chunks are KV_2LTD ``[parts, layers, tokens, heads*dim]`` in the KV dtype —
byte for byte the Go package ``kvtier/kvformat`` (KV_MLA_FMT for MLA; see
:mod:`kvtier.layout`) — so chunks written here are interchangeable with the
daemon's and with other engines' of any layout. In cross-layer mode (``prefer_cross_layer_blocks``) a chunk is
instead the chunk's physical blocks, each holding every layer, copied whole.

Device discipline: index tensors live on the KV's device and every gather or
scatter runs there; bytes cross between device and host memory only through
a :class:`HostCopier`, one explicit copy per part (K or V of a layer, or one
run of cross-layer blocks). On CUDA the copier uses pinned memory and
stream events; on the CPU it is a plain ``copy_``. Tests swap in a copier
that records the copies, with KV on torch's ``meta`` device, to prove no
other host↔device traffic happens.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import cuda_host
from .client import ConnectionLost

log = logging.getLogger("kvtier")

PACKED = "packed"
BLOCK_FIRST = "block_first"
KV_FIRST = "kv_first"
MLA = "mla"

# PR 51718's physical permutations of the logical [L, B, H, N, C] allocation.
STANDARD_LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
CROSS_LAYER_LAYOUTS = tuple(n for n in STANDARD_LAYOUTS if n[0] == "B")
# kvtier's preference: blocks first, then layers, so one block of every layer
# is one contiguous run and a chunk moves with one copy per run of blocks.
PREFERRED_CROSS_LAYER_LAYOUT = "BLHNC"


def resolved_layout_name(cache_config) -> Optional[str]:
    """The layout vLLM resolved into its cache config, or None on older vLLM.

    Current vLLM publishes it as ``cache_config.get_resolved_kv_cache_layout()``
    (an enum whose name is one of STANDARD_LAYOUTS); a plain
    ``kv_cache_layout`` string is accepted too.
    """
    getter = getattr(cache_config, "get_resolved_kv_cache_layout", None)
    value = None
    if callable(getter):
        try:
            value = getter()
        except (ValueError, RuntimeError):  # not resolved yet
            value = None
    if value is None:
        value = getattr(cache_config, "kv_cache_layout", None)
    if value is None:
        return None
    name = getattr(value, "name", value)
    return str(name).upper()


@dataclass(frozen=True)
class Layout:
    """The geometry of one engine's per-layer KV tensors (all layers alike)."""

    form: str
    num_blocks: int
    block_size: int
    heads: int
    dim: int        # head_size for K/V, latent size for MLA
    parts: int      # 2 (K, V) or 1 (MLA)
    dtype: torch.dtype

    @classmethod
    def detect(cls, t: torch.Tensor, use_mla: bool = False, form: str = "", block_size: int = 0) -> "Layout":
        """Reads the geometry of a per-layer tensor.

        ``form`` names the layout when the caller knows it (from vLLM's
        config); otherwise it is inferred from the rank, and a 5-D tensor
        whose first two dims are both 2 is refused as ambiguous.
        """
        form = form or _infer_form(t, use_mla)
        shape = tuple(t.shape)
        if form == PACKED:
            _want_dims(t, 4, form)
            b, h, n, c = shape
            if c % 2:
                raise ValueError(f"packed KV of shape {shape}: content dim {c} is not 2 x head_size")
            lay = cls(form, b, n, h, c // 2, 2, t.dtype)
        elif form == BLOCK_FIRST:
            _want_dims(t, 5, form)
            b, two, n, h, d = shape
            lay = cls(form, b, n, h, d, 2, t.dtype)
        elif form == KV_FIRST:
            _want_dims(t, 5, form)
            two, b, n, h, d = shape
            lay = cls(form, b, n, h, d, 2, t.dtype)
        elif form == MLA:
            if t.dim() == 3:
                b, n, d = shape
            elif t.dim() == 4 and shape[1] == 1:
                b, _, n, d = shape
            else:
                raise ValueError(f"MLA KV of shape {shape}: want [blocks, block_size, latent]")
            lay = cls(form, b, n, 1, d, 1, t.dtype)
        else:
            raise ValueError(f"unknown KV layout form {form!r}")
        if block_size and lay.block_size != block_size:
            raise ValueError(f"KV tensor of shape {shape} ({form}) has block size {lay.block_size}, "
                             f"cache_config.block_size is {block_size}")
        return lay

    @property
    def row_elems(self) -> int:
        return self.heads * self.dim

    @property
    def elem_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def chunk_bytes(self, layers: int, tokens: int) -> int:
        return self.parts * layers * tokens * self.row_elems * self.elem_size

    @property
    def format_tag(self) -> str:
        """The chunk format name kvtier keys under (KV_2LTD, or KV_MLA_FMT)."""
        return "KV_MLA_FMT" if self.parts == 1 else "KV_2LTD"

    def canonical(self, t: torch.Tensor) -> torch.Tensor:
        """The layer as a ``[B, H, N, parts, dim]`` view of the same storage."""
        if self.form == PACKED:
            return t.unflatten(-1, (2, self.dim))
        if self.form == BLOCK_FIRST:
            return t.permute(0, 3, 2, 1, 4)
        if self.form == KV_FIRST:
            return t.permute(1, 3, 2, 0, 4)
        if t.dim() == 3:
            return t[:, None, :, None, :]
        return t.unsqueeze(3)


def _want_dims(t: torch.Tensor, n: int, form: str) -> None:
    if t.dim() != n:
        raise ValueError(f"{form} KV of shape {tuple(t.shape)}: want {n} dimensions")


def _infer_form(t: torch.Tensor, use_mla: bool) -> str:
    if use_mla or t.dim() == 3:
        return MLA
    if t.dim() == 4:
        return PACKED
    if t.dim() == 5:
        if t.shape[1] == 2 and t.shape[0] != 2:
            return BLOCK_FIRST
        if t.shape[0] == 2 and t.shape[1] != 2:
            return KV_FIRST
        raise ValueError(f"KV of shape {tuple(t.shape)} is ambiguous (block-first or KV-first); "
                         "set kv_connector_extra_config.kv_layout to 'block_first' or 'kv_first'")
    raise ValueError(f"KV of shape {tuple(t.shape)}: unsupported rank {t.dim()}; kvtier reads "
                     "[B,H,N,2D] (vLLM >= 0.26), [B,2,N,H,D] / [2,B,N,H,D] (older) or MLA [B,N,D]")


def chunk_view(raw: torch.Tensor, lay: Layout, layers: int) -> torch.Tensor:
    """A uint8 chunk (e.g. an arena slot) seen as ``[parts, L, T, H*D]`` in the KV dtype, no copy."""
    per_token = lay.parts * layers * lay.row_elems * lay.elem_size
    if raw.numel() % per_token:
        raise ValueError(f"chunk of {raw.numel()} bytes is not a whole number of {per_token}-byte tokens")
    return raw.view(lay.dtype).view(lay.parts, layers, raw.numel() // per_token, lay.row_elems)


# ------------------------------------------------------------------ host copies


class HostCopier:
    """Moves bytes between device memory and host memory, one explicit copy per part.

    The base class is the CPU case (and the fallback): a synchronous
    ``copy_``. :class:`CudaCopier` overrides it with asynchronous copies.
    Tests substitute a recording copier; nothing else in the connector moves
    bytes across devices.
    """

    def to_host(self, dst: torch.Tensor, src: torch.Tensor, owner: Any = None) -> None:
        """Copies ``src`` (device) into ``dst`` (host memory: arena slots of ``owner``, a
        client, when given). Called under ``owner.copies``."""
        dst.copy_(src)

    def to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def fence(self) -> None:
        """Returns once every copy issued so far has completed. Only on the forward pass's
        thread, the one that issues the saves."""

    def sync_loads(self) -> None:
        """Returns once every load copy (and index op) issued on the load stream has
        completed; leaves the saves alone, so any thread may call it."""

    def layer_done(self, layer: int) -> None:
        """Marks the copies issued so far as the load of ``layer`` (asynchronous copiers record an event)."""

    def wait_layer(self, layer: int) -> None:
        """Makes the engine's compute wait for ``layer``'s load (no-op when copies are synchronous)."""

    def save_layer_done(self, layer: int) -> None:
        """Marks the save copies issued so far as those of ``layer`` (asynchronous copiers record an event)."""

    def save_layer_landed(self, layer: int) -> bool:
        """Whether ``layer``'s save copies are in host memory, without waiting: synchronous copies are."""
        return True

    def pin(self, client: Any) -> None:
        """Offers a client's arena for direct DMA (CUDA pins it when it can); no-op here."""

    def begin_loads(self) -> None:
        """Orders the step's loads after the work queued so far on the calling thread's
        stream (the index tensors it made, earlier use of the blocks the loads overwrite).
        Called once per batch of loads, on the thread that prepared them."""

    def on_load_stream(self, *index: torch.Tensor) -> Any:
        """A context that queues the copies and index ops of a load on the copier's load
        stream; ``index`` are the index tensors they read."""
        return contextlib.nullcontext()


class CudaCopier(HostCopier):  # CUDA calls go through cuda_host.runtime (a recorder in tests)
    """Asynchronous host copies on CUDA, through pinned memory.

    Saves copy on the engine's current stream, after the attention kernel
    that wrote the layer and before anything that could overwrite its blocks,
    into host memory that is pinned (the arena, registered with
    ``cudaHostRegister``) or into a pinned bounce buffer that ``fence`` then
    drains into the arena. Loads run whole on a separate stream (the host copy,
    the staging tensor and the index write into the paged KV, see
    :meth:`on_load_stream`); each layer's event is waited on by the compute
    stream in ``wait_layer``, so attention never reads a layer before its bytes
    are in place.

    Saves and :meth:`fence` belong to the forward pass's thread; a loader thread
    waits for its loads with :meth:`sync_loads`, which touches no save state. The
    save state (latest save event, bounce drain, per-layer save events) is kept
    under a lock all the same, and ``fence`` only clears the event it waited for.

    One arena is pinned at a time, a client's (:meth:`pin`), until that client
    closes: its close hook (:meth:`_unpin`) waits for the copies queued into and
    out of the range, then unregisters it — before the client remaps the range
    and closes its socket, after which the daemon reuses the slots.
    """

    def __init__(self, device: torch.device, bounce_bytes: int = 64 << 20):
        self.device = device
        self.load_stream = cuda_host.runtime.stream(device)
        self._pinned: Optional[Tuple[int, int]] = None  # [start, end) of the registered arena
        self._tried: Optional[weakref.ref] = None  # the client a pin was last tried for
        self.bounce = cuda_host.runtime.pinned(bounce_bytes)
        self._state = threading.Lock()  # the save state below
        self._bounce_used = 0
        # (client owning dst or None, dst in host memory, its bytes in the bounce buffer)
        self._drain: List[Tuple[Any, torch.Tensor, torch.Tensor]] = []
        self._save_event: Any = None  # recorded after the latest save copy
        self._layer_events: Dict[int, Any] = {}
        # Per-layer save events (STORE_LAYER); None where a copy went through the bounce
        # buffer, which reaches the arena only at fence.
        self._save_layer_events: Dict[int, Any] = {}

    @property
    def registered(self) -> bool:
        """Whether an arena is pinned now."""
        return self._pinned is not None

    def _is_pinned(self, t: torch.Tensor) -> bool:
        span = self._pinned
        return span is not None and span[0] <= t.data_ptr() < span[1]

    def pin(self, client: Any) -> None:
        """Registers the client's arena with CUDA, unless an arena is pinned already, and
        has the client's close unregister it (after the copies through it have finished).

        The registration (slow: the driver pins every page of the arena) runs outside the
        client's copy lock, so copies on other threads and a close are not held up by it.
        The pinned range and the close hook are then published together under the lock,
        which close takes first: either the hook is in place before close starts, or the
        client closed meanwhile and the range is unregistered here at once (no copy went
        through it: copies are only issued under the lock, where ``_pinned`` is set)."""
        view = getattr(client, "_arena_bytes", None)
        if self._pinned is not None or view is None or not view.numel() or client.closed:
            return
        if self._tried is not None and self._tried() is client:
            return  # CUDA refused this arena once: its copies use the bounce buffer
        self._tried = weakref.ref(client)
        ptr, n = view.data_ptr(), view.numel()
        try:
            if not cuda_host.runtime.register(ptr, n, self.device):
                return
        except (AttributeError, RuntimeError, TypeError) as e:
            log.warning("kvtier: cannot pin the arena for direct copies (%s); saves go through a bounce buffer", e)
            return
        try:
            with client.copies:
                self._pinned = (ptr, ptr + n)
                client.on_close(lambda: self._unpin(ptr))
        except ConnectionLost:  # closed while registering: nothing was copied through it
            try:
                cuda_host.runtime.unregister(ptr, self.device)
            except (AttributeError, RuntimeError, TypeError) as e:
                log.error("kvtier: unpinning the arena of a connection closed while pinning: %s", e)

    def _unpin(self, ptr: int) -> None:
        """The pinned client's close hook: waits for every copy that may still touch the
        range (saves on the engine's stream, loads on the load stream), then unregisters it.
        The client has stopped issuing copies through it before calling this."""
        span = self._pinned
        if span is None or span[0] != ptr:
            return
        try:
            # The latest save copy's event (every earlier one precedes it on the stream). Read
            # without the state lock: a save holding it would hold this close up for nothing,
            # and it is issued under the client's copy lock, which close has taken and left.
            ev = self._save_event
            if ev is not None:
                cuda_host.runtime.synchronize(ev)
            cuda_host.runtime.synchronize(self.load_stream)
        except RuntimeError as e:  # a device fault: the context is gone, unregister anyway
            log.error("kvtier: waiting for copies before unpinning the arena: %s", e)
        self._pinned = None
        try:
            cuda_host.runtime.unregister(ptr, self.device)
        except (AttributeError, RuntimeError, TypeError) as e:
            log.error("kvtier: unpinning the arena of a closed connection: %s", e)

    def begin_loads(self) -> None:
        """Makes the load stream wait, once, for an event of the calling thread's current
        stream: the forward pass's (or an asynchronous load's own thread) after it made the
        loads' index tensors and before any scatter. Recorded here and not per scatter: a
        loader thread's current stream is the default stream, not the compute stream, and
        a wait per scatter would hold each layer's copy up until the compute queued before
        it had run (a synchronous copy then blocks the host for it as well)."""
        rt = cuda_host.runtime
        before = rt.record(rt.current_stream(self.device))
        with rt.on_stream(self.load_stream):
            rt.wait(self.device, before)

    @contextlib.contextmanager
    def on_load_stream(self, *index: torch.Tensor) -> Any:
        """Queues what runs under it on the load stream (after :meth:`begin_loads`).
        Tensors allocated under it (staging) belong to the load stream's pool, so freeing
        them never lets another stream reuse them early; the ``index`` tensors, made on
        another stream, are marked as used by the load stream (``record_stream``), so that
        dropping them (a load cut short, or lost, before its scatters ran) never lets the
        allocator hand their memory out while the load stream still reads it."""
        rt = cuda_host.runtime
        with rt.on_stream(self.load_stream):
            for t in index:
                rt.keep(t, self.load_stream)
            yield

    def _bounce_for(self, like: torch.Tensor) -> Optional[torch.Tensor]:
        n = like.numel() * like.element_size()
        if self._bounce_used + n > self.bounce.numel():
            return None
        buf = self.bounce[self._bounce_used:self._bounce_used + n].view(like.dtype).view(like.shape)
        self._bounce_used += n
        return buf

    def to_host(self, dst: torch.Tensor, src: torch.Tensor, owner: Any = None) -> None:
        with self._state:
            if self._is_pinned(dst):
                dst.copy_(src, non_blocking=True)
            else:
                buf = self._bounce_for(src)
                if buf is None:  # bounce buffer full: a synchronous copy is still correct
                    dst.copy_(src)
                    return
                buf.copy_(src, non_blocking=True)
                self._drain.append((owner, dst, buf))
            self._save_event = cuda_host.runtime.record()

    def to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with cuda_host.runtime.on_stream(self.load_stream):
            if self._is_pinned(src):
                dst.copy_(src, non_blocking=True)
            else:
                dst.copy_(src)  # pageable source: the copy is synchronous anyway

    def layer_done(self, layer: int) -> None:
        self._layer_events[layer] = cuda_host.runtime.record(self.load_stream)

    def wait_layer(self, layer: int) -> None:
        ev = self._layer_events.pop(layer, None)
        if ev is not None:
            cuda_host.runtime.wait(self.device, ev)

    def save_layer_done(self, layer: int) -> None:
        with self._state:
            self._save_layer_events[layer] = None if self._drain else cuda_host.runtime.record()

    def save_layer_landed(self, layer: int) -> bool:
        with self._state:
            ev = self._save_layer_events.get(layer)
            if ev is None or not ev.query():
                return False
            del self._save_layer_events[layer]
            return True

    def sync_loads(self) -> None:
        cuda_host.runtime.synchronize(self.load_stream)

    def fence(self) -> None:
        """Waits for the save copies issued so far and drains the bounce buffer into the
        arena, then waits for the load stream. The state it takes is reset whether or not
        it succeeds: a failed fence leaves no bounce bytes for a later one to copy into
        slots whose lease has been given up. A drain entry is copied under its client's
        copy lock and skipped once that client has closed (its slots are no longer ours)."""
        with self._state:
            ev, drain = self._save_event, self._drain
            self._drain = []
            self._save_layer_events.clear()
        try:
            if ev is not None:
                cuda_host.runtime.synchronize(ev)
            for owner, dst, buf in drain:
                if owner is None:
                    dst.copy_(buf)
                    continue
                try:
                    with owner.copies:
                        dst.copy_(buf)
                except ConnectionLost:
                    pass  # closed: its save is dropped, its slots are not ours any more
            cuda_host.runtime.synchronize(self.load_stream)
        finally:
            with self._state:
                if self._save_event is ev:  # not a newer one recorded meanwhile
                    self._save_event = None
                if not self._drain:
                    self._bounce_used = 0


def copier_for(device: torch.device) -> HostCopier:
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        return CudaCopier(device)
    return HostCopier()


# ------------------------------------------------------- per-layer transfers


def token_index(block_ids: Sequence[int], block_size: int, start: int, end: int,
                device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(block, offset) of tokens [start, end) of a request, as index tensors on ``device``."""
    t = torch.arange(start, end, dtype=torch.int64)
    blocks = torch.as_tensor(list(block_ids), dtype=torch.int64)
    return blocks[t // block_size].to(device), (t % block_size).to(device)


def _check_device(kv: torch.Tensor, *index: torch.Tensor) -> None:
    for i in index:
        if i.device != kv.device:
            raise ValueError(f"index on {i.device} for KV on {kv.device}")


def gather_layer(copier: HostCopier, chunk: torch.Tensor, layer: int, lay: Layout, kv: torch.Tensor,
                 index: Tuple[torch.Tensor, torch.Tensor], owner: Any = None) -> None:
    """Copies one layer's K/V (or latent) of the indexed tokens into ``chunk[:, layer]``
    (slots of client ``owner``, when given).

    The gather runs on the KV's device into a staging tensor; one host copy
    per part then lands it in the chunk.
    """
    blocks, offsets = index
    _check_device(kv, blocks, offsets)
    stage = lay.canonical(kv)[blocks, :, offsets]           # [T, H, parts, dim] on the device
    stage = stage.permute(2, 0, 1, 3).contiguous()          # [parts, T, H, dim]
    n = stage.shape[1]
    for p in range(lay.parts):
        copier.to_host(chunk[p, layer, :n], stage[p].view(n, lay.row_elems), owner)


def scatter_layer(copier: HostCopier, chunk: torch.Tensor, layer: int, lay: Layout, kv: torch.Tensor,
                  index: Tuple[torch.Tensor, torch.Tensor], first: int = 0) -> None:
    """Writes chunk tokens ``first..first+len(index)`` of one layer into the paged tensor.

    ``first`` skips tokens the engine already holds (its own prefix cache):
    those blocks may be shared with other requests and are never written.
    Called under ``copier.on_load_stream()``, so the staging tensor, its host
    copy and the index write all run, in order, on the load stream.
    """
    blocks, offsets = index
    _check_device(kv, blocks, offsets)
    n = blocks.shape[0]
    stage = torch.empty((lay.parts, n, lay.heads, lay.dim), dtype=lay.dtype, device=kv.device)
    for p in range(lay.parts):
        copier.to_device(stage[p].view(n, lay.row_elems), chunk[p, layer, first:first + n])
    lay.canonical(kv)[blocks, :, offsets] = stage.permute(1, 2, 0, 3)


# ------------------------------------------------------------- cross-layer


@dataclass(frozen=True)
class CrossLayer:
    """vLLM's cross-layer allocation: one tensor whose blocks each hold every layer.

    ``blocks`` is the tensor seen as ``[num_blocks, bytes_per_block]`` (a
    view), so a chunk's blocks move with one gather and one host copy.
    """

    layout_name: str
    blocks: torch.Tensor
    per_layer: Tuple[torch.Tensor, ...]  # logical [B, H, N, C] views, for the model and tests
    layer: Layout

    @classmethod
    def of(cls, kv_cache: torch.Tensor, layout_name: str, num_layers: int, use_mla: bool = False) -> "CrossLayer":
        """Accepts the tensor in physical order (contiguous) or as the logical ``[L, B, H, N, C]`` view."""
        name = layout_name.upper()
        if name not in CROSS_LAYER_LAYOUTS:
            raise ValueError(f"cross-layer KV needs a blocks-first layout ({', '.join(CROSS_LAYER_LAYOUTS)}), got {name}")
        if kv_cache.dim() != 5:
            raise ValueError(f"cross-layer KV of shape {tuple(kv_cache.shape)}: want 5 dimensions")
        if kv_cache.is_contiguous():
            physical = kv_cache
            logical = kv_cache.permute(*[name.index(c) for c in "LBHNC"])
        else:
            logical = kv_cache
            physical = kv_cache.permute(*["LBHNC".index(c) for c in name])
            if not physical.is_contiguous():
                raise ValueError(f"cross-layer KV strides do not follow {name}")
        if logical.shape[0] != num_layers:
            raise ValueError(f"cross-layer KV holds {logical.shape[0]} layers, the model has {num_layers}")
        per_layer = tuple(logical[i] for i in range(num_layers))
        layer = Layout.detect(per_layer[0], use_mla=use_mla, form=MLA if use_mla else PACKED)
        blocks = physical.reshape(physical.shape[0], -1)  # a view: physical is contiguous
        return cls(name, blocks, per_layer, layer)

    @property
    def block_elems(self) -> int:
        return self.blocks.shape[1]

    @property
    def format_tag(self) -> str:
        return f"{self.layout_name}/blocks"

    def chunk_bytes(self, blocks_per_chunk: int) -> int:
        return blocks_per_chunk * self.block_elems * self.blocks.element_size()

    def chunk_view(self, raw: torch.Tensor) -> torch.Tensor:
        per_block = self.block_elems * self.blocks.element_size()
        if raw.numel() % per_block:
            raise ValueError(f"chunk of {raw.numel()} bytes is not a whole number of {per_block}-byte blocks")
        return raw.view(self.blocks.dtype).view(raw.numel() // per_block, self.block_elems)

    def gather(self, copier: HostCopier, chunk: torch.Tensor, block_index: torch.Tensor, owner: Any = None) -> None:
        _check_device(self.blocks, block_index)
        n = block_index.shape[0]
        if _host_resident(self.blocks, copier):  # KV already in host memory: one copy, no staging
            torch.index_select(self.blocks, 0, block_index, out=chunk[:n])
            return
        copier.to_host(chunk[:n], self.blocks.index_select(0, block_index), owner)

    def scatter(self, copier: HostCopier, chunk: torch.Tensor, block_index: torch.Tensor, first_block: int = 0) -> None:
        _check_device(self.blocks, block_index)
        n = block_index.shape[0]
        if _host_resident(self.blocks, copier):
            self.blocks.index_copy_(0, block_index, chunk[first_block:first_block + n])
            return
        stage = torch.empty((n, self.block_elems), dtype=self.blocks.dtype, device=self.blocks.device)
        copier.to_device(stage, chunk[first_block:first_block + n])
        self.blocks.index_copy_(0, block_index, stage)


def _host_resident(kv: torch.Tensor, copier: HostCopier) -> bool:
    """KV in CPU memory with the plain copier: staging would only add a copy."""
    return kv.device.type == "cpu" and type(copier) is HostCopier


def allocate_standard(layout_name: str, num_layers: int, num_blocks: int, heads: int, block_size: int,
                      content: int, dtype: torch.dtype, device: str = "cpu") -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Allocates KV the way vLLM's standardized allocator does (PR 51718): a physical
    tensor in ``layout_name`` order and per-layer logical ``[B, H, N, C]`` views.

    Returned: (the logical ``[L, B, H, N, C]`` view, its per-layer views). The
    harness uses it to hand the connector what vLLM would.
    """
    name = layout_name.upper()
    if name not in STANDARD_LAYOUTS:
        raise ValueError(f"unknown KV layout {layout_name!r}; vLLM's are {', '.join(STANDARD_LAYOUTS)}")
    dims = {"L": num_layers, "B": num_blocks, "H": heads, "N": block_size, "C": content}
    physical = torch.zeros([dims[c] for c in name], dtype=dtype, device=device)
    logical = physical.permute(*[name.index(c) for c in "LBHNC"])
    return logical, [logical[i] for i in range(num_layers)]
