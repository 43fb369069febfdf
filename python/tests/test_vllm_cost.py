"""Scheduler-side cost of the vLLM connector for a 32k-token prompt (printed, not asserted).

Measured: get_num_new_matched_tokens (key tokens, LOOKUP round trip to a real
daemon), update_state_after_alloc and build_connector_meta, for a prompt
whose 32,768 tokens are all cached, with the daemon's default 256-token
chunks. Timing is reported, never a pass/fail condition on a shared machine;
the test asserts the work was real (a full hit).
"""

import time

import pytest

from kvtier.harness.engine import KVCacheBlocks, NewRequestData, Request, SchedulerOutput, CachedRequestData
from kvtier.harness.vllm_hash import block_hashes
from kvtier.testing import Daemon
from harness_util import engine, prompt

TOKENS = 32768


@pytest.fixture
def daemon256(kvtier_bin, tmp_path):
    d = Daemon(kvtier_bin, str(tmp_path), chunk_size=256, ram_gb=0.25).start()
    yield d
    d.stop()


@pytest.mark.parametrize("key_mode", ["tokens", "block_hashes"])
def test_scheduler_cost_of_a_32k_prompt(daemon256, key_mode, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    p = [t % 250 for t in prompt(80, 1024)] * (TOKENS // 1024)
    e = engine(daemon256.socket_path, f"cost-{key_mode}", block_size=16, num_blocks=8, key_mode=key_mode)
    sched = e.scheduler_connector
    c = sched._client()
    first = Request("warm", p)
    first.block_hashes = block_hashes(first, 16)
    keys = sched._key_tokens(first).build(c, sched.link.scope, TOKENS, 0)
    c.store(keys, [_zeros(c) for _ in range(TOKENS // 256)])
    sched.request_finished(first, [])
    blocks = list(range(TOKENS // 16))
    samples = []
    for i in range(30):
        req = Request(f"r{i}", p)
        req.block_hashes = first.block_hashes  # vLLM computes them when the request arrives
        t0 = time.perf_counter()
        n, is_async = sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, KVCacheBlocks(blocks), n)
        out = SchedulerOutput([NewRequestData(req.request_id, p, [], (blocks,), n, None)], CachedRequestData(),
                              {req.request_id: TOKENS - n}, TOKENS - n, set())
        meta = sched.build_connector_meta(out)
        samples.append(time.perf_counter() - t0)
        sched.request_finished(req, blocks)
        assert n == TOKENS - 256 and not is_async and meta.requests[0].load_end == n
    samples.sort()
    print(f"\nscheduler side, 32k-token prompt, key_mode {key_mode}: median {samples[len(samples) // 2] * 1e6:.0f} us, "
          f"best {samples[0] * 1e6:.0f} us")
    e.close()


def _zeros(c):
    import torch
    return torch.zeros(16, dtype=torch.uint8)
