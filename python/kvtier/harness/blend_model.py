"""A small trainable Llama-style model with the forward passes CacheBlend needs.

RMSNorm, rotary position embeddings (neox or GPT-J pairing), multi-head
attention and a SwiGLU MLP, as ``torch.nn`` parameters so it can be trained
in-tree (blend_task). Besides the batched training forward it has the three
inference passes the blend machinery uses, all over contiguous per-layer K/V
(``[tokens, heads, head_dim]``, keys already rotated):

- :meth:`BlendLM.prefill` — a full causal prefill, the reference;
- :meth:`BlendLM.prefill` on one segment with positions from 0 — the K/V
  that is cached for a document;
- :meth:`BlendLM.blend_prefill` — CacheBlend's selective recompute: fresh
  K/V for every token in the layers up to the check layer, then only the
  selected tokens' hidden states go through the remaining layers, attending
  over the loaded K/V of the others.

Both prefills and the decode step share :meth:`_attend`, so with every token
selected the blended pass performs the same arithmetic as the full prefill.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

ROPE_STYLES = ("neox", "gptj")

KV = List[Tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [tokens, heads, head_dim]


@dataclass(frozen=True)
class BlendModelConfig:
    vocab_size: int = 384
    hidden: int = 64
    layers: int = 16
    heads: int = 4
    head_dim: int = 16
    intermediate: int = 128
    rope_theta: float = 10000.0
    rope_style: str = "neox"  # "neox" (halves) or "gptj" (interleaved pairs)
    eps: float = 1e-6
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    half = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) / half))


def rope_tables(positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype):
    """cos and sin of position × frequency ([..., tokens, 1, head_dim/2]), computed in float64
    so a rotation by p1 then p2 matches one by p1 + p2 to float32 rounding."""
    angles = positions.to(torch.float64)[..., None] * freqs
    return angles.cos().to(dtype).unsqueeze(-2), angles.sin().to(dtype).unsqueeze(-2)


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, style: str, tables=None) -> torch.Tensor:
    """Rotates ``x`` ([tokens, heads, head_dim] or [batch, tokens, heads, head_dim]) to ``positions``.

    neox pairs dimension i with i + head_dim/2; GPT-J pairs 2i with 2i+1.
    ``tables`` are :func:`rope_tables` of the positions, when the caller has them.
    """
    cos, sin = tables if tables is not None else rope_tables(positions, freqs, x.dtype)
    if style == "neox":
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    if style == "gptj":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    raise ValueError(f"unsupported rotary style {style!r}: want one of {ROPE_STYLES}")


class _Layer(nn.Module):
    def __init__(self, cfg: BlendModelConfig):
        super().__init__()
        d, hd = cfg.hidden, cfg.heads * cfg.head_dim
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Linear(d, 3 * hd, bias=False)
        self.wo = nn.Linear(hd, d, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.w_gate_up = nn.Linear(d, 2 * cfg.intermediate, bias=False)
        self.w_down = nn.Linear(cfg.intermediate, d, bias=False)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class BlendLM(nn.Module):
    def __init__(self, cfg: BlendModelConfig):
        super().__init__()
        if cfg.rope_style not in ROPE_STYLES:
            raise ValueError(f"unsupported rotary style {cfg.rope_style!r}: want one of {ROPE_STYLES}")
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        nn.init.normal_(self.embed.weight, std=0.5)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.layers))
        for lay in self.layers:  # small residual writes keep a deep stack trainable
            nn.init.normal_(lay.wo.weight, std=0.02 / math.sqrt(2 * cfg.layers))
            nn.init.normal_(lay.w_down.weight, std=0.02 / math.sqrt(2 * cfg.layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.hidden))
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.register_buffer("freqs", inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    # ----- pieces shared by every pass ------------------------------------

    def _qkv(self, lay: _Layer, x: torch.Tensor, positions: torch.Tensor, tables=None):
        cfg = self.cfg
        h = _rms(x, lay.attn_norm, cfg.eps)
        q, k, v = (lay.wqkv(h)).split(cfg.heads * cfg.head_dim, dim=-1)
        shape = x.shape[:-1] + (cfg.heads, cfg.head_dim)
        tables = tables if tables is not None else rope_tables(positions, self.freqs, x.dtype)
        q = rope(q.reshape(shape), positions, self.freqs, cfg.rope_style, tables)
        k = rope(k.reshape(shape), positions, self.freqs, cfg.rope_style, tables)
        return q, k, v.reshape(shape)

    def _finish(self, lay: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + lay.wo(attn.reshape(attn.shape[:-2] + (-1,)))
        h = _rms(x, lay.mlp_norm, self.cfg.eps)
        gate, up = lay.w_gate_up(h).chunk(2, dim=-1)
        return x + lay.w_down(nn.functional.silu(gate) * up)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(_rms(x, self.final_norm, self.cfg.eps))

    def _attend(self, q: torch.Tensor, qpos: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                block: int = 512) -> torch.Tensor:
        """Causal attention of queries at ``qpos`` (ascending) over keys at positions 0..len(keys)-1.

        Queries are processed in blocks so the score matrix stays small on
        long prompts; a block reads keys up to its last position and masks
        only the columns past its first one (the rest are visible to all of
        its queries), which keeps long prompts memory-bound work down.
        """
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        kt, vt = keys.transpose(0, 1), values.transpose(0, 1)  # [heads, N, d]
        out = torch.empty_like(q)
        for s in range(0, len(q), block):
            pos = qpos[s:s + block]
            lo, n = int(pos[0]), int(pos[-1]) + 1
            scores = torch.matmul(q[s:s + block].transpose(0, 1) * scale, kt[:, :n].transpose(1, 2))
            mask = torch.arange(lo, n)[None, :] > pos[:, None]
            scores[:, :, lo:n].masked_fill_(mask[None], float("-inf"))
            out[s:s + block] = torch.matmul(scores.softmax(-1), vt[:, :n]).transpose(0, 1)
        return out

    # ----- training -----------------------------------------------------

    def forward(self, tokens: torch.Tensor, tap: Optional[int] = None, positions: Optional[torch.Tensor] = None):
        """Batched causal forward ([batch, T] -> logits [batch, T, vocab]), for training.

        With ``tap``, also returns the logits read (through the final norm and
        head) from the residual stream after the first ``tap`` layers.
        ``positions`` ([batch, T], ascending) are the rotary positions, 0..T-1
        when absent; the causal mask always follows the token order.
        """
        cfg = self.cfg
        b, t = tokens.shape
        pos = torch.arange(t) if positions is None else positions
        tables = rope_tables(pos, self.freqs, torch.float32)
        x = self.embed(tokens)
        bias = torch.full((t, t), float("-inf")).triu(1)
        scale = 1.0 / math.sqrt(cfg.head_dim)
        tapped = None
        for i, lay in enumerate(self.layers):
            if i == tap:
                tapped = self.logits(x)
            q, k, v = (y.transpose(1, 2) for y in self._qkv(lay, x, pos, tables))  # [b, heads, t, d]
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
            attn = torch.matmul(scores.softmax(-1), v).transpose(1, 2)
            x = self._finish(lay, x, attn)
        return self.logits(x) if tap is None else (self.logits(x), tapped)

    # ----- inference ------------------------------------------------------

    @torch.no_grad()
    def prefill(self, tokens: Sequence[int], start: int = 0) -> Tuple[torch.Tensor, KV]:
        """Full causal prefill with positions start.. ; returns (last-token logits, K/V per layer)."""
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        pos = torch.arange(start, start + len(ids))
        x = self.embed(ids)
        kv: KV = []
        for lay in self.layers:
            q, k, v = self._qkv(lay, x, pos)
            kv.append((k, v))
            x = self._finish(lay, x, self._attend(q, pos - start, k, v))
        return self.logits(x[-1]), kv

    @torch.no_grad()
    def decode(self, token: int, kv: KV) -> Tuple[torch.Tensor, KV]:
        """One decode step after a prefill whose K/V is ``kv``; returns logits and the grown K/V."""
        n = len(kv[0][0])
        pos = torch.tensor([n])
        x = self.embed(torch.tensor([token]))
        out: KV = []
        for lay, (keys, values) in zip(self.layers, kv):
            q, k, v = self._qkv(lay, x, pos)
            keys, values = torch.cat((keys, k)), torch.cat((values, v))
            out.append((keys, values))
            x = self._finish(lay, x, self._attend(q, pos, keys, values))
        return self.logits(x[-1]), out

    @torch.no_grad()
    def blend_prefill(self, tokens: Sequence[int], loaded: KV, have: torch.Tensor, check_layers: Sequence[int],
                      ratios: Sequence[float]) -> Tuple[torch.Tensor, KV, torch.Tensor]:
        """CacheBlend's prefill: reuse ``loaded`` K/V where ``have`` is set, recompute the rest.

        ``loaded`` holds per layer K/V for every token (rows where ``have`` is
        false are ignored), keys already rotated to the tokens' positions in
        this prompt. Tokens without loaded K/V (markers, uncached segments,
        the question) are computed in every layer. Up to and including the
        first check layer every token is computed fresh; there the loaded
        tokens are ranked by how far the fresh K/V is from the loaded one
        (the check layer itself uses the fresh K/V of all of them), and only
        the top ``ratios[0]`` share of them stay selected. A later
        check layer ``check_layers[j]`` narrows the selection to ``ratios[j]``
        of the loaded tokens (the last ratio when fewer are given). From
        then on only selected tokens are computed; the others keep their
        loaded K/V. Returns (last-token logits, the K/V used per layer, the
        final selection mask).
        """
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        n = len(ids)
        pos = torch.arange(n)
        have = have.to(torch.bool)
        first_check = min(check_layers) if check_layers else self.cfg.layers
        checks = {c: ratios[min(j, len(ratios) - 1)] for j, c in enumerate(sorted(check_layers))}
        total = int(have.sum())
        sel = torch.arange(n)  # indices of tokens computed in this layer, ascending
        x = self.embed(ids)
        kv: KV = []
        for i, (lay, (lk, lv)) in enumerate(zip(self.layers, loaded)):
            q, k, v = self._qkv(lay, x, pos[sel])
            if i < first_check or len(sel) == n and i not in checks:
                keys, values = k, v  # every token fresh: exactly the full prefill's K/V
            else:
                # Loaded K/V for tokens not computed here; fresh K/V for those
                # that are — at a check layer that is every token still
                # selected, before narrowing: they were computed anyway.
                keys, values = lk.clone(), lv.clone()
                keys[sel], values[sel] = k, v
                if i in checks:
                    keep = self._select(k, v, lk[sel], lv[sel], have[sel], math.ceil(checks[i] * total - 1e-9))
                    sel, q, x = sel[keep], q[keep], x[keep]
            kv.append((keys, values))
            # Selected tokens are spread over the prompt; small query blocks
            # keep each block's key range close to what its queries can see.
            block = 512 if len(sel) == n else 128
            x = self._finish(lay, x, self._attend(q, pos[sel], keys, values, block))
        mask = torch.zeros(n, dtype=torch.bool)
        mask[sel] = True
        return self.logits(x[-1]), kv, mask

    # How the check layer measures a token's deviation: "kv" sums squared
    # differences of keys and values, "k" and "v" use one of them; with
    # "-norm" each head's differences are divided by that head's mean squared
    # fresh norm first, so a head with large activations does not decide alone.
    selection = "kv"
    SELECTIONS = ("kv", "k", "v", "kv-norm", "k-norm", "v-norm")

    def deviation(self, k, v, lk, lv) -> torch.Tensor:
        """Per-token deviation of fresh K/V from loaded K/V, by :attr:`selection`."""
        mode = self.selection
        if mode not in self.SELECTIONS:
            raise ValueError(f"unknown deviation measure {mode!r}: want one of {self.SELECTIONS}")
        parts, norm = mode.split("-")[0], mode.endswith("-norm")

        def dev_of(fresh, old):
            d = (fresh - old).pow(2).sum(-1)  # [tokens, heads]
            if norm:
                d = d / fresh.pow(2).sum(-1).mean(0).clamp_min(1e-12)
            return d.sum(-1)
        return sum(dev_of(*p) for c, p in (("k", (k, lk)), ("v", (v, lv))) if c in parts)

    def _select(self, k, v, lk, lv, have, take: int) -> torch.Tensor:
        """Positions (into the current selection) to keep: every token without loaded
        K/V, plus the ``take`` loaded ones whose K/V deviates most."""
        dev = self.deviation(k, v, lk, lv)
        loaded_idx = have.nonzero().flatten()
        keep = ~have
        if take > 0:
            top = dev[loaded_idx].topk(min(take, len(loaded_idx))).indices
            keep[loaded_idx[top]] = True
        return keep.nonzero().flatten()
