"""Paged engine KV ⇄ kvtier chunks in the KV_2LTD layout.

A chunk of T tokens over L layers is ``[2, L, T, kv_heads*head_dim]`` in the
KV's own dtype: all K rows of layer 0 in token order, then layer 1, ...,
then the V rows the same way — byte for byte what the Go package
``kvtier/kvformat`` calls KV_2LTD, so chunks written here and there are
interchangeable.

Engines keep each layer's KV in blocks, and a token lives at slot
``block_id * block_size + offset``. Two paged shapes are handled:

- block-first ``[num_blocks, 2, block_size, kv_heads, head_dim]`` (newer vLLM
  attention backends), and
- K/V-first ``[2, num_blocks, block_size, kv_heads, head_dim]`` (older
  FlashAttention layout, SGLang-like host pools).

Both are viewed as a 2-D table of rows ``[rows, kv_heads*head_dim]`` and a
token's K and V rows are located by index arithmetic, so gather is one
``index_select`` into the chunk (written straight into the arena view) and
scatter one ``index_copy_`` per layer and half: no Python loop over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

BLOCK_FIRST = "block_first"
KV_FIRST = "kv_first"

_DTYPE_NAMES = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64", torch.uint8: "uint8", torch.int8: "int8",
}


def dtype_name(dtype: torch.dtype) -> str:
    """kvtier's name of a dtype, used in the scope's format string."""
    return _DTYPE_NAMES[dtype]


def paged_kind(t: torch.Tensor) -> str:
    """Which paged shape a 5-D per-layer KV tensor has (2 in dim 1 or dim 0)."""
    if t.dim() != 5:
        raise ValueError(f"paged KV of shape {tuple(t.shape)}: want 5 dimensions")
    if t.shape[1] == 2 and t.shape[0] != 2:
        return BLOCK_FIRST
    if t.shape[0] == 2 and t.shape[1] != 2:
        return KV_FIRST
    raise ValueError(f"paged KV of shape {tuple(t.shape)} is ambiguous; pass the layout explicitly")


@dataclass(frozen=True)
class Paged:
    """The geometry of one engine's per-layer paged KV tensors (all layers alike)."""

    kind: str
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, t: torch.Tensor, kind: str = "") -> "Paged":
        kind = kind or paged_kind(t)
        if kind == BLOCK_FIRST:
            nb, _, bs, h, d = t.shape
        else:
            _, nb, bs, h, d = t.shape
        return cls(kind, nb, bs, h, d, t.dtype)

    @property
    def row_elems(self) -> int:
        return self.kv_heads * self.head_dim

    def rows(self, layer: torch.Tensor) -> torch.Tensor:
        """The layer's tensor as a 2-D table of K and V rows (a view, never a copy)."""
        if not layer.is_contiguous():
            raise ValueError("paged KV tensor must be contiguous")
        return layer.view(-1, self.row_elems)

    def row_indices(self, slots: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rows of the K and V of each slot in :meth:`rows`' table."""
        block, offset = slots // self.block_size, slots % self.block_size
        if self.kind == BLOCK_FIRST:
            k = (block * 2) * self.block_size + offset
            return k, k + self.block_size
        return slots, slots + self.num_blocks * self.block_size

    def chunk_bytes(self, layers: int, tokens: int) -> int:
        return 2 * layers * tokens * self.row_elems * _elem_size(self.dtype)


def _elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def chunk_view(raw: torch.Tensor, paged: Paged, layers: int) -> torch.Tensor:
    """A uint8 chunk (e.g. an arena slot) seen as [2, L, T, H] in the KV dtype, no copy."""
    per_token = 2 * layers * paged.row_elems * _elem_size(paged.dtype)
    if raw.numel() % per_token:
        raise ValueError(f"chunk of {raw.numel()} bytes is not a whole number of {per_token}-byte tokens")
    return raw.view(paged.dtype).view(2, layers, raw.numel() // per_token, paged.row_elems)


def gather_layer(chunk: torch.Tensor, layer: int, paged: Paged, kv: torch.Tensor, slots: torch.Tensor) -> None:
    """Copies the K and V rows of ``slots`` from layer ``layer``'s paged tensor into the chunk."""
    rows = paged.rows(kv)
    k, v = paged.row_indices(slots)
    torch.index_select(rows, 0, k, out=chunk[0, layer])
    torch.index_select(rows, 0, v, out=chunk[1, layer])


def scatter_layer(chunk: torch.Tensor, layer: int, paged: Paged, kv: torch.Tensor, slots: torch.Tensor,
                  first: int = 0) -> None:
    """Copies chunk tokens ``first..`` of one layer into the paged tensor at ``slots``.

    ``first`` lets a caller skip tokens the engine already holds (vLLM's own
    prefix cache) without touching them: those blocks may be shared with
    other requests.
    """
    rows = paged.rows(kv)
    k, v = paged.row_indices(slots)
    rows.index_copy_(0, k, chunk[0, layer, first:first + len(slots)])
    rows.index_copy_(0, v, chunk[1, layer, first:first + len(slots)])


def slots_of(block_ids, block_size: int, start: int, end: int) -> torch.Tensor:
    """Slots of tokens [start, end) of a request whose blocks are ``block_ids``."""
    t = torch.arange(start, end, dtype=torch.int64)
    blocks = torch.as_tensor(list(block_ids), dtype=torch.int64)
    return blocks[t // block_size] * block_size + t % block_size
