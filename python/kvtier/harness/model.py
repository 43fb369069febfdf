"""A small Llama-architecture model over a paged KV cache, for testing connectors.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU
MLP, with deterministic random weights. It is not meant to produce good text,
only to compute exactly what a real Llama does with its KV cache: every
layer writes its new keys and values into paged per-layer tensors at the
step's slot mapping and attends over the whole context *read back from those
tensors*, so KV loaded by a connector is genuinely used, and wrong KV changes
the logits.

The per-layer hooks sit where vLLM's attention op calls the connector:
``wait_for_layer_load`` before attention, ``save_kv_layer`` after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from .. import vllm_kv


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 512
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 256
    rope_theta: float = 10000.0
    eps: float = 1e-6
    seed: int = 0
    dtype: torch.dtype = torch.float32
    # MLA: > 0 caches one latent of this size per token (K and V are
    # projected up from it at attention time) instead of per-head K and V.
    mla_latent: int = 0

    def layer_name(self, i: int) -> str:
        return f"model.layers.{i}.self_attn.attn"


class LayerHooks:
    """Callbacks around each attention layer; the engine wires them to the connector."""

    def before_attention(self, layer_name: str) -> None:  # vLLM: wait_for_layer_load
        pass

    def after_attention(self, layer_name: str, kv_layer: torch.Tensor) -> None:  # vLLM: save_kv_layer
        pass


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Llama:
    """Weights and the forward pass; KV lives outside, in the engine's paged tensors."""

    def __init__(self, cfg: LlamaConfig):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).to(cfg.dtype)

        self.embed = torch.randn(cfg.vocab_size, cfg.hidden, generator=g).to(cfg.dtype)
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append({
                "attn_norm": 1 + 0.1 * torch.randn(cfg.hidden, generator=g).to(cfg.dtype),
                "wq": w(cfg.heads * cfg.head_dim, cfg.hidden),
                "wk": w(cfg.kv_heads * cfg.head_dim, cfg.hidden),
                "w_dkv": w(max(cfg.mla_latent, 1), cfg.hidden),
                "w_uk": w(cfg.kv_heads * cfg.head_dim, max(cfg.mla_latent, 1)),
                "w_uv": w(cfg.kv_heads * cfg.head_dim, max(cfg.mla_latent, 1)),
                "wv": w(cfg.kv_heads * cfg.head_dim, cfg.hidden),
                "wo": w(cfg.hidden, cfg.heads * cfg.head_dim),
                "mlp_norm": 1 + 0.1 * torch.randn(cfg.hidden, generator=g).to(cfg.dtype),
                "w_gate": w(cfg.intermediate, cfg.hidden),
                "w_up": w(cfg.intermediate, cfg.hidden),
                "w_down": w(cfg.hidden, cfg.intermediate),
            })
        self.final_norm = torch.ones(cfg.hidden, dtype=cfg.dtype)
        self.lm_head = w(cfg.vocab_size, cfg.hidden)
        half = cfg.head_dim // 2
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float64) / half))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cat((angles.cos(), angles.cos()), -1).to(x.dtype)[:, None, :]
        sin = torch.cat((angles.sin(), angles.sin()), -1).to(x.dtype)[:, None, :]
        return x * cos + _rotate_half(x) * sin

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                context_slots: torch.Tensor, kv_caches: List[torch.Tensor], lay: vllm_kv.Layout,
                hooks: Optional[LayerHooks] = None, last_only: bool = True) -> torch.Tensor:
        """Runs the new tokens of one request; returns logits (of the last token by default).

        ``context_slots`` are the slots of tokens 0..positions[-1] (the whole
        context including the new tokens), in order; ``lay`` is the cache's layout.
        """
        return self.forward_batch([(token_ids, positions, slot_mapping, context_slots)], kv_caches, lay,
                                  hooks, last_only)[0]

    @torch.no_grad()
    def forward_batch(self, batch, kv_caches: List[torch.Tensor], lay: vllm_kv.Layout,
                      hooks: Optional[LayerHooks] = None,
                      last_only: bool = True) -> List[torch.Tensor]:
        """One forward pass over several requests, layer by layer, as an engine's batched step runs.

        ``batch`` holds (token_ids, positions, slot_mapping, context_slots) per
        request. The hooks run once per layer for the whole batch, where vLLM
        calls the connector.
        """
        cfg, hooks = self.cfg, hooks or LayerHooks()
        xs = [self.embed[tokens] for tokens, _, _, _ in batch]
        for i, lw in enumerate(self.layers):
            name = cfg.layer_name(i)
            hooks.before_attention(name)
            for r, (tokens, positions, slot_mapping, context_slots) in enumerate(batch):
                x = xs[r]
                h = _rms_norm(x, lw["attn_norm"], cfg.eps)
                q = self._rope((h @ lw["wq"].T).view(-1, cfg.heads, cfg.head_dim), positions)
                attn = self._attention(lw, h, q, positions, slot_mapping, context_slots, kv_caches[i], lay)
                x = x + attn.reshape(len(tokens), -1) @ lw["wo"].T
                h = _rms_norm(x, lw["mlp_norm"], cfg.eps)
                xs[r] = x + (torch.nn.functional.silu(h @ lw["w_gate"].T) * (h @ lw["w_up"].T)) @ lw["w_down"].T
            hooks.after_attention(name, kv_caches[i])
        out = []
        for x in xs:
            if last_only:
                x = x[-1:]
            out.append(_rms_norm(x, self.final_norm, cfg.eps) @ self.lm_head.T)
        return out

    def _write_kv(self, lw, h, positions, slot_mapping, kv, lay):
        """Writes the new tokens' cache entries: K/V per head, or MLA's latent."""
        cfg = self.cfg
        view = lay.canonical(kv)
        blocks, offsets = slot_mapping // lay.block_size, slot_mapping % lay.block_size
        if cfg.mla_latent:
            view[blocks, :, offsets] = (h @ lw["w_dkv"].T).view(-1, 1, 1, cfg.mla_latent)
            return
        k = self._rope((h @ lw["wk"].T).view(-1, cfg.kv_heads, cfg.head_dim), positions)
        v = (h @ lw["wv"].T).view(-1, cfg.kv_heads, cfg.head_dim)
        view[blocks, :, offsets] = torch.stack((k, v), dim=2)

    def _read_kv(self, lw, context_slots, kv, lay):
        """Keys and values of the whole context, read back from the paged cache."""
        cfg = self.cfg
        cached = lay.canonical(kv)[context_slots // lay.block_size, :, context_slots % lay.block_size]
        if cfg.mla_latent:
            latent = cached.reshape(-1, cfg.mla_latent)
            pos = torch.arange(len(latent), dtype=torch.int64)
            keys = self._rope((latent @ lw["w_uk"].T).view(-1, cfg.kv_heads, cfg.head_dim), pos)
            return keys, (latent @ lw["w_uv"].T).view(-1, cfg.kv_heads, cfg.head_dim)
        return cached[:, :, 0], cached[:, :, 1]

    def _attention(self, lw, h, q, positions, slot_mapping, context_slots, kv, lay, block_q: int = 512):
        """Writes the new K/V into the paged cache, then attends causally over the cached context."""
        self._write_kv(lw, h, positions, slot_mapping, kv, lay)
        keys, values = self._read_kv(lw, context_slots, kv, lay)
        group = self.cfg.heads // self.cfg.kv_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)      # [heads, N, d]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, N, d]
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        out = torch.empty_like(q)
        for s in range(0, len(q), block_q):
            pos = positions[s:s + block_q]
            n = int(pos[-1]) + 1  # keys beyond the block's last position are all masked
            scores = torch.matmul(q[s:s + block_q].transpose(0, 1), keys[:, :n].transpose(1, 2)) * scale
            mask = torch.arange(n)[None, :] > pos[:, None]
            scores.masked_fill_(mask[None], float("-inf"))
            out[s:s + block_q] = torch.matmul(scores.softmax(-1), values[:, :n]).transpose(0, 1)
        return out
