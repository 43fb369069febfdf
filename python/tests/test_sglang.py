"""The SGLang HiCache backend: its interface, and prefills through the SGLang-like flow."""

import hashlib

import torch

from kvtier.sglang import page_key
from harness_util import assert_close, prompt, reference
from sglang_util import backend, sglang_prefill
from test_vllm import _run


def _hex(i):
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_set_get_exists_round_trip(daemon):
    b = backend(daemon.socket_path, "sglang-basic")
    pages = [torch.arange(12, dtype=torch.float32) + 100 * i for i in range(3)]
    keys = [_hex(i + 1) for i in range(3)]
    assert not b.exists(keys[0]) and b.get(keys[0]) is None
    assert b.set(keys[0], pages[0])
    assert b.batch_set(keys[1:], pages[1:])
    assert b.batch_exists(keys + [_hex(99)]) == 3
    assert b.batch_exists([_hex(99)] + keys) == 0  # consecutive hits from the start only
    target = torch.zeros(12)
    assert b.get(keys[1], target) is target and torch.equal(target, pages[1])
    got = b.batch_get(keys)
    assert all(g is not None for g in got)
    assert all(torch.equal(g.view(torch.float32), want) for g, want in zip(got, pages))


def test_page_key_uses_the_digest_prefix():
    digest = "ab" * 32
    assert page_key(digest) == bytes.fromhex("ab" * 16)
    assert len(page_key("not hex at all")) == 16 and page_key("x") != page_key("y")


def test_prefill_through_the_backend_matches_full_prefill(daemon):
    p = prompt(30, 16 * 4 + 5)
    ref = reference(p)
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-flow", p)
    assert loaded == 0
    assert_close(logits, ref)
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-flow", p)
    assert loaded == 64
    assert_close(logits, ref)
    q = p[:16] + prompt(31, 30)  # shares one page
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-flow", q)
    assert loaded == 16
    assert_close(logits, reference(q))


def test_sglang_across_processes(daemon):
    first = _run(["sglang", daemon.socket_path, "sglang-procs", "kv_first", "32", "50"])
    second = _run(["sglang", daemon.socket_path, "sglang-procs", "kv_first", "32", "50"])
    assert (first["external"], second["external"]) == (0, 48)
    assert first["diff"] <= 1e-5 and second["diff"] <= 1e-5


def test_dead_daemon_reads_as_misses(own_daemon):
    p = prompt(33, 40)
    b = backend(own_daemon.socket_path, "sglang-dead")
    sglang_prefill(own_daemon.socket_path, "sglang-dead", p)
    own_daemon.kill()
    assert b.batch_exists(["00" * 32]) == 0
    assert b.set(_hex(1), torch.zeros(4)) is False
    assert b.get(_hex(1)) is None
    logits, loaded = sglang_prefill(own_daemon.socket_path, "sglang-dead", p)
    assert loaded == 0
    assert_close(logits, reference(p))
    own_daemon.start()
    assert b.set(_hex(1), torch.ones(4))  # reconnected
    assert b.exists(_hex(1))
