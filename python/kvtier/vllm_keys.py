"""What a vLLM request's chunk keys are made of, besides its prompt tokens.

vLLM's own prefix-cache block hash mixes *extra keys* into a block
(``generate_block_hash_extra_keys``): the LoRA adapter's name into every
block, the ``cache_salt`` into the first block, and a multimodal item's hash
into every block its placeholder tokens overlap. Because the hashes are
chained, each of these separates every later block too. kvtier keys chunks
by token ids (the daemon chains and hashes them, the same on every machine
and restart, with no ``PYTHONHASHSEED`` to agree on), and reproduces the same
separation:

- LoRA adapter and cache salt are part of the chunk *namespace* (a scope the
  daemon keys by): a request under another adapter or salt shares no chunk
  with it, exactly as with vLLM, where the first block already differs.
- A multimodal item's placeholder tokens are replaced, for keying only, by
  ids derived from the item's hash (above any vocabulary: bit 31 set), so the
  chunk holding the placeholder, and every chunk after it, differ between
  two images while chunks before it are still shared.

Requests whose prompt is given as embeddings (``prompt_token_ids is None``)
have no token identity and are not cached.
"""

from __future__ import annotations

import array
import hashlib
from typing import Any, List, Optional, Sequence, Tuple

_MM_BIT = 0x80000000
_MM_STEP = 0x9E3779B1  # odd, so consecutive placeholder positions never repeat within 2**31


def lora_name(request: Any) -> str:
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return ""
    return str(getattr(lora, "lora_name", None) or getattr(lora, "name", None) or getattr(lora, "lora_int_id", ""))


def namespace_of(base: str, request: Any) -> str:
    """The namespace a request's chunks live in: the configured one plus LoRA and salt."""
    parts = [base] if base else []
    lora = lora_name(request)
    if lora:
        parts.append("lora=" + lora)
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append("salt=" + str(salt))
    return "|".join(parts)


def mm_items(request: Any) -> List[Tuple[str, int, int]]:
    """(identifier, offset, length) of the request's multimodal placeholders, in either vLLM form."""
    out = []
    for f in getattr(request, "mm_features", None) or ():
        pos = getattr(f, "mm_position", None)
        ident = getattr(f, "identifier", None) or getattr(f, "mm_hash", None)
        if pos is not None and ident is not None:
            out.append((str(ident), int(pos.offset), int(pos.length)))
    if out:
        return out
    hashes = getattr(request, "mm_hashes", None) or ()
    positions = getattr(request, "mm_positions", None) or ()
    return [(str(h), int(p.offset), int(p.length)) for h, p in zip(hashes, positions)]


def key_tokens(prompt: Optional[Sequence[int]], items: Sequence[Tuple[str, int, int]]) -> Optional[List[int]]:
    """The token ids chunks are keyed by, or None when the prompt has no token ids."""
    if prompt is None:
        return None
    tokens = list(prompt)
    for ident, offset, length in items:
        base = int.from_bytes(hashlib.sha256(ident.encode()).digest()[:4], "little")
        end = min(offset + length, len(tokens))
        for i in range(max(offset, 0), end):
            tokens[i] = _MM_BIT | ((base + (i - offset) * _MM_STEP) & 0x7FFFFFFF)
    return tokens


class TokenKeys:
    """A prompt keyed by its token ids (packed u32s): the daemon chains and hashes them."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: "array.array"):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getstate__(self):
        return self.tokens

    def __setstate__(self, state):
        self.tokens = state

    def build(self, client: Any, scope: int, end: int, skip: int):
        """Keys of the chunks in [skip, end) tokens (skip and end on chunk boundaries)."""
        return client.tokens(scope, self.tokens[:end], skip)

    def hit_tokens(self, reply: Any, chunk: int) -> int:
        return reply.tokens


class HashKeys:
    """A prompt keyed by vLLM's own block hashes: one 16-byte key per chunk.

    A chunk's key is the hash of its last block, which vLLM chained over the
    whole prefix and every extra key (LoRA, salt, multimodal, prompt
    embeddings). Reproducible across processes only when vLLM runs with a
    fixed PYTHONHASHSEED, which the connector requires for this mode.
    """

    __slots__ = ("hashes", "chunk")

    def __init__(self, hashes: List[bytes], chunk: int):
        self.hashes, self.chunk = hashes, chunk

    def __len__(self) -> int:
        return len(self.hashes) * self.chunk

    def __getstate__(self):
        return (self.hashes, self.chunk)

    def __setstate__(self, state):
        self.hashes, self.chunk = state

    def build(self, client: Any, scope: int, end: int, skip: int):
        return client.hashes(scope, self.hashes[skip // self.chunk:end // self.chunk])

    def hit_tokens(self, reply: Any, chunk: int) -> int:
        return reply.chunks * chunk

    @classmethod
    def of(cls, block_hashes: Sequence[bytes], block_size: int, chunk: int) -> "HashKeys":
        if chunk % block_size:
            raise ValueError(f"key_mode block_hashes needs the chunk size ({chunk}) to be a multiple "
                             f"of vLLM's block size ({block_size})")
        per = chunk // block_size
        keys = []
        for i in range(per - 1, len(block_hashes), per):
            h = bytes(block_hashes[i])
            keys.append(h[:16] if len(h) >= 16 else h.ljust(16, b"\0"))
        return cls(keys, chunk)
