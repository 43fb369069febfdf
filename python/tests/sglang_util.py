"""Builds SGLang-like backends and engines with the kvtier backend, for tests and subprocesses."""

from kvtier._sglang_compat import HiCacheStorageConfig
from kvtier.harness.sglang_flow import SGLangLikeEngine
from kvtier.sglang import KVTierStorage
from harness_util import MODEL


def backend(socket_path, model, ranks=None, **extra):
    """A backend as SGLang's dynamic factory builds it; ``ranks`` sets config fields (pp_rank, ...)."""
    cfg = HiCacheStorageConfig(model_name=model, extra_config={"socket_path": socket_path, "timeout": 2.0,
                                                                "reconnect_interval": 0.0, **extra})
    for field, value in (ranks or {}).items():
        setattr(cfg, field, value)
    return KVTierStorage(cfg, {})


def engine_prefill(socket_path, model, prompt, ranks=None, **engine_opts):
    """One prefill through a fresh engine: (logits, tokens loaded from storage, the engine)."""
    eng = SGLangLikeEngine(MODEL, backend(socket_path, model, ranks), page_size=16, **engine_opts)
    logits, loaded = eng.prefill(prompt)
    eng.backend.close()
    return logits, loaded, eng


def sglang_prefill(socket_path, model, prompt, ranks=None, **engine_opts):
    """One prefill through a fresh engine: (logits, tokens loaded from storage)."""
    return engine_prefill(socket_path, model, prompt, ranks, **engine_opts)[:2]
