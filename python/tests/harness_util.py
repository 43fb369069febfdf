"""Shared pieces of the connector tests."""

import random

import torch

from kvtier import vllm_kv
from kvtier.harness.engine import Engine, KVTransferConfig, reference_logits
from kvtier.harness.model import LlamaConfig

MODEL = LlamaConfig(vocab_size=256, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=128)
MLA_MODEL = LlamaConfig(vocab_size=256, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                        mla_latent=24)
TOL = 1e-5


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(MODEL.vocab_size) for _ in range(n)]


def engine(socket_path, model_name, layout_kind=vllm_kv.BLOCK_FIRST, block_size=8, layerwise=False,
           prefix_caching=True, kv_role="kv_both", model=MODEL, num_blocks=128, token_budget=1 << 30,
           legacy_preemption=False, cross_layer=False, fail_policy="recompute", **extra):
    cfg = {"socket_path": socket_path, "layerwise": layerwise, "timeout": 2.0, "reconnect_interval": 0.0}
    if cross_layer:
        cfg["cross_layer"] = True
    cfg.update(extra)
    return Engine(model, model_name=model_name, num_blocks=num_blocks, block_size=block_size, layout_kind=layout_kind,
                  kv_transfer=KVTransferConfig(kv_role=kv_role, kv_connector_extra_config=cfg,
                                               kv_load_failure_policy=fail_policy),
                  prefix_caching=prefix_caching, token_budget=token_budget, legacy_preemption=legacy_preemption,
                  cross_layer=cross_layer)


def assert_close(got, want):
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"max abs logit difference {diff} > {TOL}"


def reference(p, model=MODEL):
    return reference_logits(model, p, block_size=8)
