"""The vLLM connector driven by the harness engine against a real daemon.

Each test compares the first-token logits of a request whose prefix came
from kvtier with those of a plain full prefill (fp32, max abs diff ≤ 1e-5),
and checks from the engine's step records that the load really happened.
"""

import json
import os
import subprocess
import sys

import pytest

from kvtier import vllm_kv as layout
from harness_util import assert_close, engine, prompt, reference

CASES = [(layout.BLOCK_FIRST, False), (layout.KV_FIRST, False), (layout.BLOCK_FIRST, True), (layout.KV_FIRST, True)]


@pytest.mark.parametrize("kind,layerwise", CASES)
def test_loaded_prefix_gives_full_prefill_logits(daemon, kind, layerwise):
    """Many chunks and a partial last chunk: 5 whole chunks of 16 load, 3 tokens compute."""
    model = f"many-{kind}-{layerwise}"
    p = prompt(1, 5 * 16 + 3)
    ref = reference(p)
    first = engine(daemon.socket_path, model, kind, layerwise=layerwise)
    assert_close(first.prefill(p), ref)
    assert first.steps[0].external_tokens == 0
    second = engine(daemon.socket_path, model, kind, layerwise=layerwise)
    assert_close(second.prefill(p), ref)
    assert [(s.external_tokens, s.num_scheduled) for s in second.steps] == [(80, 3)]


def test_zero_and_one_shared_chunk(daemon):
    base = prompt(2, 64)
    e = engine(daemon.socket_path, "shared", prefix_caching=False)
    e.prefill(base)
    other = prompt(3, 64)  # shares nothing
    assert_close(e.prefill(other), reference(other))
    assert e.steps[-1].external_tokens == 0
    one = base[:16] + prompt(4, 40)  # shares exactly the first chunk
    assert_close(e.prefill(one), reference(one))
    assert e.steps[-1].external_tokens == 16


def test_never_loads_the_last_token(daemon):
    """A prompt entirely in kvtier still leaves its last chunk's tokens to compute."""
    p = prompt(5, 64)
    e = engine(daemon.socket_path, "last-token", prefix_caching=False)
    e.prefill(p)
    assert_close(e.prefill(p), reference(p))
    assert (e.steps[-1].external_tokens, e.steps[-1].num_scheduled) == (48, 16)


@pytest.mark.parametrize("layerwise", [False, True])
def test_vllm_prefix_cache_tokens_are_not_loaded_again(daemon, layerwise):
    """vLLM holds 40 tokens (5 blocks of 8): kvtier loads 40..80, starting mid-chunk."""
    model = f"prefix-cache-{layerwise}"
    p = prompt(6, 90)
    engine(daemon.socket_path, model, layerwise=layerwise).prefill(p)  # kvtier now holds 80 tokens
    e = engine(daemon.socket_path, model, layerwise=layerwise)
    e.prefill(p[:41])  # fills e's own prefix cache with 5 blocks
    got = e.prefill(p)
    assert_close(got, reference(p))
    # 5 local blocks; kvtier's first 80 tokens include them, only 40 more are loaded.
    assert e.steps[-1].num_computed_before == 80 and e.steps[-1].external_tokens == 40


def test_chunked_prefill_saves_across_steps(daemon):
    p = prompt(7, 100)
    e = engine(daemon.socket_path, "chunked")
    e.token_budget = 24
    assert_close(e.prefill(p), reference(p))
    assert len(e.steps) == 5
    loader = engine(daemon.socket_path, "chunked")
    assert_close(loader.prefill(p), reference(p))
    assert loader.steps[0].external_tokens == 96


def test_consumer_does_not_store(daemon):
    p = prompt(8, 40)
    engine(daemon.socket_path, "roles", kv_role="kv_consumer").prefill(p)
    e = engine(daemon.socket_path, "roles")
    e.prefill(p)
    assert e.steps[0].external_tokens == 0


def _run(args):
    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, os.path.join(here, "proc_helper.py"), *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", [layout.KV_FIRST])
def test_store_in_one_process_load_in_another(daemon, kind):
    stored = _run(["vllm", daemon.socket_path, f"procs-{kind}", kind, "9", "75"])
    assert stored["external"] == 0 and stored["diff"] <= 1e-5
    loaded = _run(["vllm", daemon.socket_path, f"procs-{kind}", kind, "9", "75"])
    assert loaded["external"] == 64 and loaded["diff"] <= 1e-5


@pytest.mark.parametrize("value,want", [(True, True), ("on", True), ("YES", True), (1, True), ("1", True),
                                        (False, False), ("off", False), ("", False), (0, False), ("false", False)])
def test_boolean_settings_read_the_usual_words(value, want):
    from kvtier.vllm import Settings
    assert Settings.from_extra({"pd_layerwise": value}).pd_layerwise is want


@pytest.mark.parametrize("value", ["maybe", 2, "tru", 0.5])
def test_a_boolean_setting_that_is_no_boolean_is_an_error(value):
    """Not a silent false: "maybe" or 2 for a boolean key stops the engine at start, naming the key."""
    from kvtier.vllm import Settings, _take_use_layerwise
    from kvtier import vllm_pd
    with pytest.raises(ValueError, match="layerwise"):
        Settings.from_extra({"layerwise": value})
    with pytest.raises(ValueError, match="use_layerwise"):
        _take_use_layerwise({"use_layerwise": value}, {})
    with pytest.raises(ValueError, match="enable_pd"):
        vllm_pd.resolve_role(None, {"enable_pd": value})
