"""Shared pieces of the connector tests."""

import random

import torch

from kvtier import layout
from kvtier.harness.engine import Engine, KVTransferConfig, reference_logits
from kvtier.harness.model import LlamaConfig

MODEL = LlamaConfig(vocab_size=256, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=128)
TOL = 1e-5


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(MODEL.vocab_size) for _ in range(n)]


def engine(socket_path, model_name, layout_kind=layout.BLOCK_FIRST, block_size=8, layerwise=False,
           prefix_caching=True, kv_role="kv_both", **extra):
    cfg = {"socket_path": socket_path, "layerwise": layerwise, "timeout": 2.0, "reconnect_interval": 0.0}
    cfg.update(extra)
    return Engine(MODEL, model_name=model_name, num_blocks=128, block_size=block_size, layout_kind=layout_kind,
                  kv_transfer=KVTransferConfig(kv_role=kv_role, kv_connector_extra_config=cfg),
                  prefix_caching=prefix_caching)


def assert_close(got, want):
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"max abs logit difference {diff} > {TOL}"


def reference(p):
    return reference_logits(MODEL, p, block_size=8)
