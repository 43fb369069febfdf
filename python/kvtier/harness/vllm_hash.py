"""vLLM's prefix-cache block hashes (``sha256_cbor``), extra keys included, for the harness.

vLLM hashes every full block as SHA-256 of the canonical CBOR encoding of
``(parent or NONE_HASH, tuple(block tokens), extra_keys or None)`` where
``NONE_HASH`` is the hash of ``str(PYTHONHASHSEED)`` and ``extra_keys`` holds,
in order, the LoRA name (every block), ``(mm identifier, item offset
relative to the block start)`` for each multimodal item overlapping the
block, and the cache salt (first block only). The vectors in
../shared/testvectors/vllm_block_hash.md and the Go package ``kvtier/chunk``
(VLLMHasher) compute the same values; tests check all three agree.

Only the CBOR this needs is encoded: unsigned and negative integers, byte
and text strings, arrays and null.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, List, Optional, Sequence


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | extra]) + struct.pack(fmt, n)
    raise ValueError(f"CBOR length {n} too large")


def cbor(x: Any) -> bytes:
    """Canonical CBOR of ints, bytes, str, lists/tuples and None."""
    if x is None:
        return b"\xf6"
    if isinstance(x, bool):
        return b"\xf5" if x else b"\xf4"
    if isinstance(x, int):
        return _head(0, x) if x >= 0 else _head(1, -1 - x)
    if isinstance(x, (bytes, bytearray)):
        return _head(2, len(x)) + bytes(x)
    if isinstance(x, str):
        b = x.encode()
        return _head(3, len(b)) + b
    if isinstance(x, (list, tuple)):
        return _head(4, len(x)) + b"".join(cbor(i) for i in x)
    raise TypeError(f"no CBOR encoding for {type(x).__name__}")


def none_hash(python_hash_seed: str = "0") -> bytes:
    return hashlib.sha256(cbor(python_hash_seed)).digest()


def block_hash(parent: Optional[bytes], tokens: Sequence[int], extra: Optional[Sequence[Any]],
               seed: str = "0") -> bytes:
    p = parent if parent is not None else none_hash(seed)
    return hashlib.sha256(cbor([p, list(tokens), list(extra) if extra else None])).digest()


def extra_keys(request: Any, start: int, end: int) -> List[Any]:
    """A block's extra keys in vLLM's order: LoRA name, multimodal items, cache salt."""
    keys: List[Any] = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys.append(lora.lora_name)
    for f in getattr(request, "mm_features", None) or ():
        off, n = f.mm_position.offset, f.mm_position.length
        if off < end and off + n > start:
            keys.append((f.identifier, off - start))
    salt = getattr(request, "cache_salt", None)
    if start == 0 and salt:
        keys.append(salt)
    return keys


def block_hashes(request: Any, block_size: int, seed: str = "0") -> List[bytes]:
    """``request.block_hashes`` as vLLM computes them: one per full block of the prompt."""
    tokens = getattr(request, "prompt_token_ids", None)
    if tokens is None:
        return []
    out: List[bytes] = []
    parent = None
    for i in range(len(tokens) // block_size):
        start = i * block_size
        parent = block_hash(parent, tokens[start:start + block_size], extra_keys(request, start, start + block_size),
                            seed)
        out.append(parent)
    return out
