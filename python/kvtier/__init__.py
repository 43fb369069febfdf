"""kvtier's Python side: a client of the daemon's local protocol, a vLLM v1
KV connector (:mod:`kvtier.vllm`) and an SGLang HiCache storage backend
(:mod:`kvtier.sglang`). Only the standard library, numpy and torch are needed.
"""

from .client import (  # noqa: F401
    BadRequest, Client, ConnectionLost, KVTierError, NoSpace, NotFound, ShuttingDown,
    StatusError, Unauthorized, Unsupported,
)
