"""CacheBlend: reuse the KV of prompt segments wherever they appear, with selective recompute.

A prompt is split at the blend marker (``blend_special_str``, " # # " by
default, matched in token space: the tokenizer's ids for the marker). Each
segment between markers is cached on its own, computed as if it started
the prompt (positions from 0), and keyed by its own tokens plus the model
and namespace, never by what precedes it — so a document hits wherever it
appears. On load the keys are rotated from positions 0.. to the segment's
place in the new prompt (one delta rotation, in place), and the model's
blended prefill recomputes the tokens whose K/V deviates most from a fresh
computation in the check layers (docs/blend.md).

Segment K/V travels through the daemon like any chunk: split into chunks of
the daemon's chunk size (the last one may be shorter), keyed by 16-byte
hashes chained over the segment's tokens, so RAM, disk, remote tiers and
peers all hold it.
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .client import Client
from .protocol import KIND_HASHES, Keys

DEFAULT_MARKER = " # # "
DEFAULT_CHECK_LAYERS = (1,)
DEFAULT_RATIO = 0.15
ROTARY_STYLES = ("neox", "gptj")
KV_FORMAT = "blend-kv-v1"


class BlendError(ValueError):
    """A CacheBlend setting or request that cannot be served as asked."""


# ----- settings ----------------------------------------------------------


@dataclass
class BlendSettings:
    """LMCache's CacheBlend settings, with the meanings kvtier gives them.

    ``recompute_ratios``: the share of reused tokens recomputed, one per
    check layer (the first is the default ratio of a request).
    ``check_layers``: layers where fresh K/V is compared with the loaded
    K/V to pick the tokens to recompute (layer 0's K/V depends only on the
    token and its position, so it is never informative; LMCache's examples
    use layer 1). ``thresholds``: not supported beyond being empty or None
    (LMCache leaves threshold selection unimplemented too). ``min_tokens``:
    prompts shorter than this are prefilled in full.
    """

    enable: bool = False
    special_str: str = DEFAULT_MARKER
    recompute_ratios: Sequence[float] = (DEFAULT_RATIO,)
    check_layers: Sequence[int] = DEFAULT_CHECK_LAYERS
    thresholds: Optional[Sequence[float]] = None
    min_tokens: int = 256

    def __post_init__(self):
        if self.recompute_ratios is None:
            self.recompute_ratios = (DEFAULT_RATIO,)
        if self.check_layers is None:
            self.check_layers = DEFAULT_CHECK_LAYERS
        self.validate()

    def validate(self, layers: Optional[int] = None) -> None:
        if not isinstance(self.special_str, str) or not self.special_str.strip():
            raise BlendError(f"blend_special_str must be a non-blank string, got {self.special_str!r}")
        ratios = list(self.recompute_ratios)
        if not ratios:
            raise BlendError("blend_recompute_ratios is empty: give at least one ratio in [0, 1]")
        for r in ratios:
            check_ratio(r, "blend_recompute_ratios")
        checks = list(self.check_layers)
        if not checks:
            raise BlendError("blend_check_layers is empty: give at least one layer (e.g. [1])")
        if len(ratios) > 1 and len(ratios) != len(checks):
            raise BlendError(f"blend_recompute_ratios has {len(ratios)} entries for {len(checks)} "
                             "blend_check_layers: give one ratio, or one per check layer")
        for c in checks:
            if not isinstance(c, int) or isinstance(c, bool) or c < 0 or (layers is not None and c >= layers):
                bound = f" (the model has {layers})" if layers is not None else ""
                raise BlendError(f"blend_check_layers entry {c!r} is not a layer index{bound}")
        if len(set(checks)) != len(checks):
            raise BlendError(f"blend_check_layers {checks} repeats a layer")
        if self.thresholds:
            raise BlendError("blend_thresholds is not supported: tokens are selected by "
                             "blend_recompute_ratios (leave blend_thresholds unset)")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise BlendError(f"blend_min_tokens must be a non-negative integer, got {self.min_tokens!r}")

    @classmethod
    def from_lmcache(cls, cfg: Dict) -> "BlendSettings":
        """From LMCache-named keys (enable_blending, blend_special_str, ...); others are ignored."""
        kw = {}
        for key, name in (("enable_blending", "enable"), ("blend_special_str", "special_str"),
                          ("blend_recompute_ratios", "recompute_ratios"),
                          ("blend_check_layers", "check_layers"), ("blend_thresholds", "thresholds"),
                          ("blend_min_tokens", "min_tokens")):
            if cfg.get(key) is not None:
                kw[name] = cfg[key]
        return cls(**kw)


def check_ratio(r, what: str = "recompute ratio") -> float:
    if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r) or not 0.0 <= r <= 1.0:
        raise BlendError(f"{what}: {r!r} is outside [0, 1] (a share of the reused tokens)")
    return float(r)


# ----- segments and keys ----------------------------------------------------


@dataclass(frozen=True)
class Segment:
    start: int  # position of the segment's first token in the prompt
    tokens: Tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def split(tokens: Sequence[int], marker: Sequence[int]) -> List[Segment]:
    """Segments between occurrences of ``marker`` (marker tokens belong to no segment).

    Raises BlendError when the marker does not occur: such a prompt has
    nothing to blend, and a silent full prefill would hide a tokenizer or
    template mismatch. Empty segments (adjacent markers) are dropped.
    """
    m = list(marker)
    if not m:
        raise BlendError("the blend marker tokenizes to no tokens")
    toks = list(tokens)
    out, start, i, found = [], 0, 0, False
    while i + len(m) <= len(toks):
        if toks[i:i + len(m)] == m:
            found = True
            if i > start:
                out.append(Segment(start, tuple(toks[start:i])))
            i += len(m)
            start = i
        else:
            i += 1
    if not found:
        raise BlendError(f"the blend marker (tokens {m}) does not occur in the prompt of {len(toks)} tokens: "
                         "separate the reusable segments with blend_special_str")
    if start < len(toks):
        out.append(Segment(start, tuple(toks[start:])))
    return out


def segment_keys(tokens: Sequence[int], chunk: int, model: str, extra: Sequence[str] = ()) -> List[bytes]:
    """16-byte keys of a segment's chunks: each hashes the model, the extra keys and
    every token of the segment up to the chunk's end (chained), and nothing about
    where the segment sits in a prompt."""
    h = hashlib.sha256(b"kvtier-blend-segment\0")
    for part in (model, *extra):
        b = part.encode()
        h.update(struct.pack("<I", len(b)) + b)
    keys = []
    for s in range(0, len(tokens), chunk):
        part = tokens[s:s + chunk]
        h.update(struct.pack(f"<I{len(part)}I", len(part), *part))
        keys.append(h.copy().digest()[:16])
    return keys


# ----- rotary position correction --------------------------------------------


def check_position_scheme(style: Optional[str]) -> str:
    if style not in ROTARY_STYLES:
        raise BlendError(f"CacheBlend moves cached keys to new positions with a rotary delta rotation; "
                         f"the model's position scheme {style!r} is not supported (want one of {ROTARY_STYLES})")
    return style


def rotate_keys_(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor, style: str,
                 rotary_dim: Optional[int] = None) -> torch.Tensor:
    """Rotates keys computed at positions p to p + ``delta``, in place, on their device.

    ``keys`` is [..., heads, head_dim]. A rotary embedding is a rotation of
    each pair of dimensions by position × frequency, so moving by ``delta``
    is one more rotation by delta × frequency, whatever p was: no need to
    undo the stored rotation first.

    ``rotary_dim`` (default: the whole head) is how many leading dimensions
    of each head carry the rotation, as in models with partial rotary
    embeddings (vLLM's ``rotary_dim < head_size``): the pairs are formed
    within those dimensions (neox: i with i + rotary_dim/2; GPT-J: 2i with
    2i+1) and the rest of the head is left as it is. ``inv_freq`` has
    rotary_dim/2 entries.
    """
    check_position_scheme(style)
    head = keys.shape[-1]
    rdim = head if rotary_dim is None else rotary_dim
    if isinstance(rdim, bool) or not isinstance(rdim, int) or rdim <= 0 or rdim > head or rdim % 2:
        raise BlendError(f"rotary_dim {rotary_dim!r} must be an even number of dimensions in 2..{head} "
                         "(the head size)")
    if inv_freq.numel() != rdim // 2:
        raise BlendError(f"{inv_freq.numel()} rotary frequencies for rotary_dim {rdim}: want {rdim // 2}")
    if delta == 0:
        return keys
    ang = delta * inv_freq.to(torch.float64)
    cos = ang.cos().to(device=keys.device, dtype=keys.dtype)
    sin = ang.sin().to(device=keys.device, dtype=keys.dtype)
    part = keys[..., :rdim]
    if style == "neox":
        half = rdim // 2
        a, b = part[..., :half], part[..., half:]
    else:
        a, b = part[..., 0::2], part[..., 1::2]
    a2 = a * cos - b * sin
    b.mul_(cos).add_(a * sin)
    a.copy_(a2)
    return keys


# ----- the daemon as a segment store ----------------------------------------


class SegmentStore:
    """Segment K/V ([layers, 2, tokens, heads, head_dim]) in a kvtier daemon."""

    def __init__(self, client: Client, model: str, namespace: str = "", extra: Sequence[str] = ()):
        self.client, self.model, self.extra = client, model, tuple(extra)
        self.scope = client.scope(model, KV_FORMAT, namespace=namespace)
        self.chunk = client.chunk_tokens

    def keys(self, tokens: Sequence[int]) -> Keys:
        return Keys(self.scope, KIND_HASHES, segment_keys(tokens, self.chunk, self.model, self.extra))

    def contains(self, tokens: Sequence[int]) -> bool:
        keys = self.keys(tokens)
        return self.client.lookup(keys).chunks == len(keys.items)

    def store(self, tokens: Sequence[int], kv: torch.Tensor) -> int:
        """Stores a segment's K/V; returns how many chunks were committed."""
        if kv.shape[2] != len(tokens):
            raise BlendError(f"segment K/V holds {kv.shape[2]} tokens for a segment of {len(tokens)}")
        chunks = [kv[:, :, s:s + self.chunk].contiguous() for s in range(0, len(tokens), self.chunk)]
        return self.client.store(self.keys(tokens), chunks)

    def load(self, tokens: Sequence[int], shape: Tuple[int, ...], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """The segment's K/V ([layers, 2, len(tokens), heads, head_dim]), or None unless every chunk is held."""
        keys = self.keys(tokens)
        slots = self.client.prepare_retrieve(keys)
        try:
            if len(slots.slots) != len(keys.items):  # only the leading held chunks get slots
                return None
            layers, heads, dim = shape
            out = torch.empty(layers, 2, len(tokens), heads, dim, dtype=dtype)
            for i, s in enumerate(slots.slots):
                n = min(self.chunk, len(tokens) - i * self.chunk)
                raw = self.client.slot_tensor(s)
                want = layers * 2 * n * heads * dim * out.element_size()
                if raw.numel() != want:
                    return None
                out[:, :, i * self.chunk:i * self.chunk + n] = raw.view(dtype).view(layers, 2, n, heads, dim)
            return out
        finally:
            if slots.lease:
                self.client.release(slots.lease)


# ----- the blended prefill ---------------------------------------------------------


@dataclass
class BlendResult:
    logits: torch.Tensor
    kv: list
    recomputed: torch.Tensor  # bool per token: computed fresh in the last layer
    hit_segments: int
    missed_segments: int
    timings: Dict[str, float] = field(default_factory=dict)


class Blender:
    """Runs prompts through a model's blended prefill, with segment K/V from a SegmentStore.

    ``model`` provides ``cfg`` (layers, heads, head_dim, rope_style),
    ``freqs`` (the rotary inverse frequencies), ``prefill(tokens)`` and
    ``blend_prefill(tokens, loaded, have, check_layers, ratios)`` — the
    hooks docs/blend.md lists. ``encode`` turns the marker text into tokens.
    """

    def __init__(self, model, store: SegmentStore, settings: BlendSettings, encode: Callable[[str], List[int]]):
        if not settings.enable:
            raise BlendError("enable_blending is off")
        cfg = model.cfg
        self.style = check_position_scheme(getattr(cfg, "rope_style", None))
        settings.validate(layers=cfg.layers)
        self.model, self.store, self.settings = model, store, settings
        self.marker = list(encode(settings.special_str))
        self.shape = (cfg.layers, cfg.heads, cfg.head_dim)
        self.rotary_dim = getattr(cfg, "rotary_dim", None)  # None: the whole head

    def ratios(self, ratio: Optional[float]) -> List[float]:
        if ratio is None:
            return [float(r) for r in self.settings.recompute_ratios]
        return [check_ratio(ratio, "request recompute ratio")]

    def segment_kv(self, seg: Sequence[int]) -> torch.Tensor:
        """A segment's own K/V, positions from 0: what is cached for it."""
        _, kv = self.model.prefill(seg)
        return torch.stack([torch.stack((k, v)) for k, v in kv])

    def prefill(self, tokens: Sequence[int], ratio: Optional[float] = None,
                store_misses: bool = True) -> BlendResult:
        """Blended prefill of ``tokens`` at recompute ``ratio`` (the default ratios when None).

        Segments found in the store are reused; missing ones are computed
        fresh in this prefill and, except the last segment (the part after
        the final marker: the request's own question), stored for the next
        prompt that contains them.
        """
        ratios = self.ratios(ratio)
        t0 = time.perf_counter()
        segs = split(tokens, self.marker)
        n, (layers, heads, dim) = len(tokens), self.shape
        if n < self.settings.min_tokens:
            logits, kv = self.model.prefill(tokens)
            return BlendResult(logits, kv, torch.ones(n, dtype=torch.bool), 0, len(segs))
        loaded = torch.zeros(layers, 2, n, heads, dim)
        have = torch.zeros(n, dtype=torch.bool)
        misses = []
        for i, seg in enumerate(segs):
            kv = self.store.load(seg.tokens, self.shape, loaded.dtype)
            if kv is None:
                if i < len(segs) - 1:
                    misses.append(seg)
                continue
            rotate_keys_(kv[:, 0], seg.start, self.model.freqs, self.style, self.rotary_dim)
            loaded[:, :, seg.start:seg.end] = kv
            have[seg.start:seg.end] = True
        t1 = time.perf_counter()
        per_layer = [(loaded[i, 0], loaded[i, 1]) for i in range(layers)]
        logits, kv, mask = self.model.blend_prefill(tokens, per_layer, have, self.settings.check_layers, ratios)
        t2 = time.perf_counter()
        if store_misses:
            for seg in misses:
                self.store.store(seg.tokens, self.segment_kv(seg.tokens))
        hits = sum(1 for s in segs if bool(have[s.start]))
        return BlendResult(logits, kv, mask, hits, len(segs) - hits,
                           {"load": t1 - t0, "compute": t2 - t1, "store": time.perf_counter() - t2})
