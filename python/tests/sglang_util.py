"""Builds an SGLang-like engine with the kvtier backend, for tests and subprocesses."""

from kvtier._sglang_compat import HiCacheStorageConfig
from kvtier.harness.sglang_flow import SGLangLikeEngine
from kvtier.sglang import KVTierStorage
from harness_util import MODEL


def backend(socket_path, model, **extra):
    cfg = HiCacheStorageConfig(model_name=model, extra_config={"socket_path": socket_path, "timeout": 2.0,
                                                                "reconnect_interval": 0.0, **extra})
    return KVTierStorage(cfg, {})


def sglang_prefill(socket_path, model, prompt):
    eng = SGLangLikeEngine(MODEL, backend(socket_path, model), page_size=16)
    logits, loaded = eng.prefill(prompt)
    eng.backend.close()
    return logits, loaded
