"""kvtier's chunk byte layout, KV_2LTD, and the names of KV dtypes.

A chunk of T tokens over L layers is ``[2, L, T, kv_heads*head_dim]`` in the
KV's own dtype: all K rows of layer 0 in token order, then layer 1, ...,
then the V rows the same way — byte for byte what the Go package
``kvtier/kvformat`` calls KV_2LTD, so chunks written by either side are
interchangeable. MLA stores its one latent per token the same way with a
single part (KV_MLA_FMT).

Gathering an engine's paged KV into that layout and scattering it back is
:mod:`kvtier.vllm_kv`'s job (every layout vLLM has used, through strides);
the SGLang backend copies host-pool pages itself (:mod:`kvtier.sglang`).
"""

from __future__ import annotations

import torch

_DTYPE_NAMES = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64", torch.uint8: "uint8", torch.int8: "int8",
}


def dtype_name(dtype: torch.dtype) -> str:
    """kvtier's name of a dtype, used in the scope's format string."""
    return _DTYPE_NAMES[dtype]
