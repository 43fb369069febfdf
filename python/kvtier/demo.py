"""Time to first token with and without kvtier: ``python -m kvtier.demo``.

Starts a real ``kvtier serve`` (RAM and disk tiers) in a temporary directory,
then prefills one long prompt (8,192 tokens by default) through the harness
engine and the vLLM connector:

1. full prefill, no connector: the baseline;
2. the same prompt through kvtier: a miss, computed and stored;
3. a fresh engine (empty vLLM prefix cache): the prefix is loaded from RAM;
4. the daemon restarted (RAM empty): the prefix is loaded from the disk tier.

It prints each time to first token, the ratios to the baseline, and the
largest logit difference to the baseline (loaded KV must give the same
logits). The model is the harness's small Llama on this machine's CPU, so the
absolute numbers say little about a GPU; the ratio is the point.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import torch

from . import defaults
from .client import Client
from .harness.engine import Engine, KVTransferConfig
from .harness.model import LlamaConfig
from .testing import Daemon, daemon_binary

MODEL = LlamaConfig(vocab_size=4096, hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, intermediate=768)


def _engine(socket_path: str, blocks: int, block_size: int, connector: bool) -> Engine:
    ktc = KVTransferConfig(kv_connector_extra_config={"socket_path": socket_path, "timeout": 30.0}) if connector else None
    return Engine(MODEL, model_name="kvtier-demo-llama", num_blocks=blocks, block_size=block_size, kv_transfer=ktc)


def _timed_prefill(eng: Engine, prompt):
    t0 = time.perf_counter()
    logits = eng.prefill(prompt)
    return time.perf_counter() - t0, logits


def _wait_for_disk(socket_path: str, chunks: int, limit: float = 120.0) -> None:
    """The disk tier is written behind RAM; wait until it holds every chunk."""
    deadline = time.monotonic() + limit
    with Client(socket_path) as c:
        while True:
            disk = next(t for t in c.stats()["tiers"] if t["name"] == "disk")
            if disk["objects"] >= chunks or time.monotonic() > deadline:
                return
            time.sleep(0.1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--chunk-size", type=int, default=defaults.CHUNK_TOKENS)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of the RAM load (median shown)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    prompt = [random.Random(1).randrange(MODEL.vocab_size) for _ in range(args.tokens)]
    blocks = -(-args.tokens // args.block_size) + 2

    with tempfile.TemporaryDirectory(prefix="kvtier-demo-") as work:
        daemon = Daemon(daemon_binary(work), work, chunk_size=args.chunk_size, ram_gb=1.0, disk_gb=2.0).start()
        try:
            _engine(daemon.socket_path, 64, args.block_size, False).prefill(prompt[:512])  # warm torch up
            full_s, ref = _timed_prefill(_engine(daemon.socket_path, blocks, args.block_size, False), prompt)
            store_s, _ = _timed_prefill(_engine(daemon.socket_path, blocks, args.block_size, True), prompt)
            ram = []
            for _ in range(args.repeat):
                eng = _engine(daemon.socket_path, blocks, args.block_size, True)
                s, logits = _timed_prefill(eng, prompt)
                ram.append((s, (logits - ref).abs().max().item(), eng.steps[0].external_tokens))
                eng.close()
            _wait_for_disk(daemon.socket_path, args.tokens // args.chunk_size)
            daemon.stop()
            daemon.start()
            eng = _engine(daemon.socket_path, blocks, args.block_size, True)
            disk_s, disk_logits = _timed_prefill(eng, prompt)
            disk_loaded = eng.steps[0].external_tokens
        finally:
            daemon.kill()

    ram_s = statistics.median(r[0] for r in ram)
    kv_mib = args.tokens * MODEL.layers * 2 * MODEL.kv_heads * MODEL.head_dim * 4 / 2**20
    print(f"model: Llama-style, {MODEL.layers} layers, hidden {MODEL.hidden}, {MODEL.heads} heads / "
          f"{MODEL.kv_heads} KV heads, fp32 on CPU ({torch.get_num_threads()} threads); "
          f"prompt {args.tokens} tokens, chunk {args.chunk_size}, KV {kv_mib:.0f} MiB")
    print(f"TTFT full prefill (no connector):     {full_s * 1000:8.1f} ms")
    print(f"TTFT first request via kvtier (miss): {store_s * 1000:8.1f} ms  ({store_s / full_s:.3f}x, includes storing)")
    print(f"TTFT prefix from kvtier RAM:          {ram_s * 1000:8.1f} ms  ({ram_s / full_s:.3f}x; "
          f"{ram[0][2]} tokens loaded, median of {len(ram)}, max |dlogit| {max(r[1] for r in ram):.2e})")
    print(f"TTFT prefix from kvtier disk:         {disk_s * 1000:8.1f} ms  ({disk_s / full_s:.3f}x; "
          f"{disk_loaded} tokens loaded, max |dlogit| {(disk_logits - ref).abs().max().item():.2e})")


if __name__ == "__main__":
    main()
