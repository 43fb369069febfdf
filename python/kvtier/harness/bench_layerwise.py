"""Time to first token with the harness's CPU model, layerwise against whole-chunk loads.

    python -m kvtier.harness.bench_layerwise --bin /tmp/kvtier --workdir /tmp/lw-ttft

A 32-layer model (docs/layerwise.md gives the shapes) and a cached prefix of
``--prefix`` tokens. Each measured request is the prefix plus ``n`` new
tokens the engine computes; the prefix comes from the daemon. Three parts,
all in one run:

1. Calibration. ``compute(n)``: the engine's own prefix cache holds the
   prefix, so a request computes its n new tokens and nothing is loaded.
   ``load``: TTFT of a whole-chunk disk hit with one new token, minus
   compute(1). From a line through compute(16) and compute(64) it picks n so
   that compute ≈ load (and compute ≈ 4 × load); n = 1 is load ≫ compute.
2. Disk. Before every request the daemon's RAM tier is cleared (its admin
   API; ``--evict restart`` restarts the daemon instead), so its disk tier
   alone holds the prefix, and one request runs in each
   mode: ``layerwise`` (PREPARE_RETRIEVE_LAYERS, layer i copied by the
   connector's copier thread while layer i-1 computes), ``inline`` (the same,
   with layer_inline: wait_for_layer_load waits for layer i and copies it on
   the forward pass's thread), ``whole`` (load_async off: the whole prefix is
   promoted and copied, then the pass runs) and ``async`` (the connector's
   default without layerwise: loaded in the background, the request waits
   for it). The order of the modes rotates round by round. Figures are
   medians over rounds of each mode's TTFT and of the per-round ratio to
   ``whole``, with the ratios' min–max, the bound (compute + load) /
   max(compute, load) per round, and CPU time per request: the engine
   process's, the daemon's, and the forward pass's thread's run and runnable
   wait (/proc schedstat), which show how much of the machine it got.
3. RAM. The prefix stays in the daemon's RAM; pairs of requests, layerwise
   and not (order alternating), with n for compute ≈ load. It prints the
   median of the paired ratios layerwise / not and their interquartile range
   and min–max.

TTFT is the engine's prefill of the request, without the harness's copy of
the finished request's KV (a test aid; ``--snapshots`` puts it back). The
daemon runs in a session of its own (``--own-session``), as a service would:
with the kernel's autogroup scheduling a child in the engine's session would
share the engine's CPU share instead of having its own.

Every request's logits are checked against the calibration engine's (the
same model computing the prefix itself), so a wrong byte fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import sys
import threading
import time
import urllib.request
from typing import Dict, List, Optional

import torch

from .. import vllm_kv
from ..client import Client
from ..testing import Daemon
from . import engine as engine_mod
from .engine import Engine, KVTransferConfig
from .model import Llama, LlamaConfig

BLOCK = 16
TOL = 1e-4


def model_config(layers: int, hidden: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=256, hidden=hidden, layers=layers, heads=4, kv_heads=4, head_dim=64,
                       intermediate=2 * hidden, seed=7)


class Bench:
    def __init__(self, args):
        self.args = args
        self.cfg = model_config(args.layers, args.hidden)
        self.rng = random.Random(11)
        self.prefix = [self.rng.randrange(self.cfg.vocab_size) for _ in range(args.prefix)]
        os.makedirs(args.workdir, exist_ok=True)
        shutil.rmtree(os.path.join(args.workdir, "daemon"), ignore_errors=True)
        prefix_bytes = args.prefix * args.layers * 2 * self.cfg.kv_heads * self.cfg.head_dim * 4
        ram_gb = max(0.25, 3 * prefix_bytes / 2**30)
        self.admin = f"127.0.0.1:{free_port()}"
        self.daemon = Daemon(args.bin, os.path.join(args.workdir, "daemon"), chunk_size=args.chunk,
                             ram_gb=ram_gb, disk_gb=2 * ram_gb, extra_env={"KVTIER_ADMIN_ADDR": self.admin},
                             own_session=args.own_session).start()
        self.chunks = -(-args.prefix // args.chunk)
        self.prefix_bytes = prefix_bytes
        self.blocks = (args.prefix + args.max_new) // BLOCK + 4
        self._model = None
        self.compute_engine = self._engine(None)
        self.engines: Dict[str, Engine] = {}

    def _engine(self, mode: Optional[str]) -> Engine:
        kv = None
        if mode is not None:
            extra = {"socket_path": self.daemon.socket_path, "timeout": 30.0, "reconnect_interval": 0.0,
                     "layerwise": mode in ("layerwise", "inline"), "layer_inline": mode == "inline",
                     "load_async": mode == "async"}
            kv = KVTransferConfig(kv_role="kv_consumer" if mode != "store" else "kv_both",
                                  kv_connector_extra_config=extra)
        if self._model is None:
            self._model = Llama(self.cfg)
        real = engine_mod.Llama
        engine_mod.Llama = lambda cfg: self._model  # the same weights everywhere, built once
        try:
            return Engine(self.cfg, model_name="lw-ttft", num_blocks=self.blocks, block_size=BLOCK,
                          layout_kind=vllm_kv.BLOCK_FIRST, kv_transfer=kv, prefix_caching=mode is None,
                          kv_snapshots=self.args.snapshots)
        finally:
            engine_mod.Llama = real

    def engine(self, mode: str) -> Engine:
        if mode not in self.engines:
            self.engines[mode] = self._engine(mode)
        return self.engines[mode]

    def drop_engines(self) -> None:
        """Closes the connectors: after a daemon restart each engine starts with new connections."""
        for e in self.engines.values():
            e.close()
        self.engines.clear()

    def suffix(self, n: int) -> List[int]:
        return [self.rng.randrange(self.cfg.vocab_size) for _ in range(n)]

    def store_prefix(self) -> None:
        """Computes the prefix once in the calibration engine (its own prefix cache) and once
        through a storing connector, then waits until the daemon's disk tier holds it."""
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            for e in (self.compute_engine, self._engine("store")):
                e.add_request(self.prefix + [1])
                e.run(timeout=1800)
            e.close()
        finally:
            torch.set_num_threads(threads)
        with Client(self.daemon.socket_path) as c:
            assert c.flush(120_000).durable, "the prefix did not reach the disk tier"

    def reference(self, prompt: List[int]) -> torch.Tensor:
        return self.compute_engine.prefill(prompt)

    def compute(self, n: int, reps: int = 3) -> float:
        return statistics.median(self.compute_prompt(self.prefix + self.suffix(n)) for _ in range(reps))

    def compute_prompt(self, p: List[int]) -> float:
        """TTFT of the request with its prefix in the engine's own prefix cache: compute only."""
        n = len(p) - len(self.prefix)
        t = time.perf_counter()
        self.compute_engine.prefill(p)
        dt = time.perf_counter() - t
        last = self.compute_engine.steps[-1]
        if (last.num_computed_before, last.num_scheduled) != (len(self.prefix), n):
            raise AssertionError(f"calibration computed {last.num_scheduled} tokens after "
                                 f"{last.num_computed_before}, not {n} after the prefix")
        return dt

    def ttft(self, mode: str, prompt: List[int], want: Optional[torch.Tensor]) -> float:
        e = self.engine(mode)
        rid = f"{mode}-{len(e.requests)}"
        d, s = daemon_cpu(self.daemon.proc.pid), schedstat()
        t, c = time.perf_counter(), time.process_time()
        got = e.prefill(prompt, rid)
        dt = time.perf_counter() - t
        self.last_cpu = time.process_time() - c
        self.last_daemon_cpu = daemon_cpu(self.daemon.proc.pid) - d
        self.last_main = tuple(b - a for a, b in zip(s, schedstat()))
        steps = [s for s in e.steps if s.req_id == rid]
        loaded = e.async_loaded.get(rid, 0) + sum(s.external_tokens for s in steps)
        errors = set().union(*(s.load_error_blocks for s in steps))
        if loaded != len(self.prefix) or errors or steps[-1].num_scheduled != len(prompt) - len(self.prefix):
            raise AssertionError(f"{mode}: loaded {loaded} of {len(self.prefix)} tokens, errors {sorted(errors)}, "
                                 f"computed {[s.num_scheduled for s in steps]}")
        if want is not None:
            diff = (got - want).abs().max().item()
            if diff > TOL:
                raise AssertionError(f"{mode}: logits differ from the model's own by {diff}")
        return dt

    def restart(self) -> None:
        """An empty RAM: the prefix is on disk only."""
        self.drop_engines()
        self.daemon.kill()
        self.daemon.start()

    def evict(self) -> None:
        """The prefix on disk only: ``--evict clear`` drops every chunk from the running
        daemon's RAM (its admin API's clear of the RAM tier), as eviction would in a daemon
        that has served for a while: its arena's pages are in use already and the engines keep
        their connections. ``--evict restart`` restarts the daemon instead, so every read also
        commits fresh arena pages and every engine maps the new arena again."""
        if self.args.evict == "restart":
            self.restart()
            return
        req = urllib.request.Request(f"http://{self.admin}/api/v1/cluster/clear", data=b'{"tier":"mem"}',
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            json.load(r)
        with Client(self.daemon.socket_path) as c:
            tiers = c.stats()["tiers"]
        if tiers[0]["objects"] != 0 or tiers[1]["objects"] < self.chunks:
            raise AssertionError(f"after clearing RAM: {tiers[0]['objects']} chunks in RAM, "
                                 f"{tiers[1]['objects']} on disk (want 0 and {self.chunks})")


def schedstat() -> tuple:
    """Seconds this (the forward pass's) thread has run and waited runnable for a core."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        run, wait, _ = f.read().split()
    return int(run) / 1e9, int(wait) / 1e9


def daemon_cpu(pid: int) -> float:
    """CPU seconds the daemon's threads have run (/proc schedstat, nanoseconds; a Go
    process keeps its threads, so the sum over the live ones is the process's)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9


def autogroup() -> str:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return "on" if f.read().strip() == "1" else "off"
    except OSError:
        return "unknown"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fmt(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("KVTIER_BIN", "kvtier"))
    ap.add_argument("--workdir", default="/tmp/kvtier-lw-ttft")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--prefix", type=int, default=1024, help="cached prefix tokens")
    ap.add_argument("--chunk", type=int, default=256, help="the daemon's chunk size in tokens")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ram-pairs", type=int, default=30)
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="sys.setswitchinterval for the run, seconds (0: Python's default, 5 ms)")
    ap.add_argument("--evict", choices=("clear", "restart"), default="clear",
                    help="how the prefix leaves RAM before a disk hit: clear the running daemon's RAM tier, "
                         "or restart the daemon (fresh arena pages, new connections)")
    ap.add_argument("--own-session", action=argparse.BooleanOptionalAction, default=True,
                    help="start the daemon in a session of its own, as a service is: with the kernel's "
                         "autogroup scheduling it then has its own CPU share rather than part of the engine's")
    ap.add_argument("--snapshots", action=argparse.BooleanOptionalAction, default=False,
                    help="let the harness engine copy each finished request's KV (a test aid) inside the TTFT")
    ap.add_argument("--ram-new", type=int, default=1, help="new tokens of the RAM pairs when --rounds is 0")
    ap.add_argument("--max-new", type=int, default=2048, help="most new tokens a case may use")
    ap.add_argument("--cases", default="1,eq,4x", help="n per case: a number, eq (compute ≈ load), 4x")
    args = ap.parse_args(argv)
    threads, interval = torch.get_num_threads(), sys.getswitchinterval()
    torch.set_num_threads(1)  # the model on one core, the daemon and the copier on the other
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    b = Bench(args)
    try:
        return run(b, args)
    finally:
        torch.set_num_threads(threads)
        sys.setswitchinterval(interval)
        b.drop_engines()
        b.compute_engine.close()
        b.daemon.kill()


def run(b: Bench, args) -> int:
    cfg = b.cfg
    print(f"model: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, {cfg.kv_heads} KV heads x "
          f"{cfg.head_dim}, fp32; prefix {args.prefix} tokens = {b.prefix_bytes / 2**20:.0f} MiB of KV "
          f"({b.prefix_bytes / cfg.layers / 2**20:.1f} MiB per layer), chunks of {args.chunk} tokens; "
          f"torch threads 1, GIL switch interval {sys.getswitchinterval() * 1e3:g} ms; "
          f"daemon in {'a session of its own' if args.own_session else 'the engine process' + chr(39) + 's session'} "
          f"(autogroup scheduling {autogroup()}); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    b.store_prefix()

    if not args.rounds:  # RAM pairs only
        ram_pairs(b, args.ram_new, args.ram_pairs)
        return 0

    # 1. calibration
    c1, c16, c64 = b.compute(1), b.compute(16), b.compute(64)
    slope = max((c64 - c16) / 48, 1e-6)
    loads = []
    for _ in range(3):
        b.evict()
        loads.append(b.ttft("whole", b.prefix + b.suffix(1), None) - c1)
    load = statistics.median(loads)
    print(f"calibration: compute(1) {_fmt(c1)}, compute(16) {_fmt(c16)}, compute(64) {_fmt(c64)} "
          f"({slope * 1e3:.2f} ms per new token); whole disk load {_fmt(load)} "
          f"(median of {_fmt(min(loads))}..{_fmt(max(loads))})")

    def n_for(target: float) -> int:
        return int(min(args.max_new, max(1, round(16 + (target - c16) / slope))))

    cases = []
    for c in args.cases.split(","):
        n = {"eq": n_for(load), "4x": n_for(4 * load)}.get(c)
        cases.append(n if n is not None else int(c))
    eq_n = cases[args.cases.split(",").index("eq")] if "eq" in args.cases.split(",") else cases[0]

    # 2. disk
    modes = ["layerwise", "whole", "async", "compute", "inline"]
    if args.evict == "clear":  # each engine's first request maps the arena's pages: not measured
        for m in modes:
            if m != "compute":
                b.evict()
                b.ttft(m, b.prefix + b.suffix(1), None)
    how = "RAM tier cleared" if args.evict == "clear" else "daemon restarted"
    print(f"\ndisk hit ({how} before every request; compute = the same request with the prefix in "
          "the engine's own cache, nothing loaded; load = whole - compute, per round; bound = "
          "(compute + load) / max(compute, load), the most layerwise can gain, per round):")
    print("| new tokens | compute | load | compute / load (min..max) | whole | async | layerwise | inline | "
          "whole / layerwise (min..max) | bound (min..max) | whole / inline (min..max) | "
          "layerwise / inline (min..max) | async / layerwise (min..max) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cpu_lines = []
    for n in cases if args.rounds else []:
        times: Dict[str, List[float]] = {m: [] for m in modes}
        cpu: Dict[str, List[tuple]] = {m: [] for m in modes}
        for r in range(args.rounds):
            prompt = b.prefix + b.suffix(n)
            want = b.reference(prompt) if r == 0 else None
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for m in order:
                if m == "compute":
                    times[m].append(b.compute_prompt(prompt))
                    continue
                b.evict()
                times[m].append(b.ttft(m, prompt, want))
                cpu[m].append((b.last_cpu, b.last_daemon_cpu) + b.last_main)
        loads = [w - c for w, c in zip(times["whole"], times["compute"])]
        # a round whose whole-chunk request was quicker than its compute-only one says
        # nothing about the load: the machine's noise was larger than it
        cl = [c / l for c, l in zip(times["compute"], loads) if l > 0] or [float("inf")]
        rw = [w / l for w, l in zip(times["whole"], times["layerwise"])]
        bound = [(c + l) / max(c, l) for c, l in zip(times["compute"], loads) if l > 0] or [1.0]
        ri = [w / i for w, i in zip(times["whole"], times["inline"])]
        li = [l / i for l, i in zip(times["layerwise"], times["inline"])]
        ra = [a / l for a, l in zip(times["async"], times["layerwise"])]
        med = {m: statistics.median(v) for m, v in times.items()}
        print(f"| {n} | {_fmt(med['compute'])} | {_fmt(statistics.median(loads))} | {statistics.median(cl):.2f} "
              f"({min(cl):.2f}..{max(cl):.2f}) | {_fmt(med['whole'])} | {_fmt(med['async'])} | "
              f"{_fmt(med['layerwise'])} | {_fmt(med['inline'])} | "
              f"{statistics.median(rw):.2f}x ({min(rw):.2f}..{max(rw):.2f}) | "
              f"{statistics.median(bound):.2f}x ({min(bound):.2f}..{max(bound):.2f}) | "
              f"{statistics.median(ri):.2f}x ({min(ri):.2f}..{max(ri):.2f}) | "
              f"{statistics.median(li):.2f}x ({min(li):.2f}..{max(li):.2f}) | "
              f"{statistics.median(ra):.2f}x ({min(ra):.2f}..{max(ra):.2f}) |", flush=True)
        cpu_lines.append(f"| {n} | " + " | ".join(
            " / ".join(f"{statistics.median(x[i] for x in cpu[m]) * 1e3:.1f}" for i in range(4)) + " ms"
            for m in ("whole", "async", "layerwise", "inline")) + " |")
    if cpu_lines:
        print("\nCPU time per request, medians: the engine process (all its threads) / the daemon / the forward "
              "pass's thread ran / that thread waited, runnable, for a core")
        print("| new tokens | whole | async | layerwise | inline |\n|---:|---:|---:|---:|---:|")
        print("\n".join(cpu_lines), flush=True)

    # 3. RAM
    if args.ram_pairs:
        ram_pairs(b, eq_n, args.ram_pairs)
    return 0


def ram_pairs(b: Bench, n: int, pairs: int) -> None:
    b.evict()
    b.ttft("whole", b.prefix + b.suffix(1), None)  # promotes the prefix back into RAM
    b.ttft("layerwise", b.prefix + b.suffix(1), None)  # warm both paths
    ratios, lw, wh, cpu = [], [], [], []
    for i in range(pairs):
        prompt = b.prefix + b.suffix(n)
        want = b.reference(prompt) if i == 0 else None
        for m in (["whole", "layerwise"] if i % 2 else ["layerwise", "whole"]):
            t = b.ttft(m, prompt, want)
            if m == "whole":
                w, wc = t, b.last_cpu
            else:
                l, lc = t, b.last_cpu
        lw.append(l)
        wh.append(w)
        ratios.append(l / w)
        cpu.append(lc / wc)
    q = statistics.quantiles(ratios, n=4)
    boot = random.Random(5)
    meds = sorted(statistics.median(boot.choices(ratios, k=len(ratios))) for _ in range(2000))
    print(f"\nRAM hit, {n} new tokens, {pairs} interleaved pairs:")
    print(f"layerwise {_fmt(statistics.median(lw))}, not layerwise {_fmt(statistics.median(wh))}; "
          f"paired ratio layerwise / not: median {statistics.median(ratios):.3f} "
          f"(95 % bootstrap interval of the median {meds[50]:.3f}..{meds[1949]:.3f}), "
          f"interquartile {q[0]:.3f}..{q[2]:.3f}, min..max {min(ratios):.3f}..{max(ratios):.3f}", flush=True)
    print("ratios: " + " ".join(f"{r:.3f}" for r in ratios))
    cmeds = sorted(statistics.median(boot.choices(cpu, k=len(cpu))) for _ in range(2000))
    cq = statistics.quantiles(cpu, n=4)
    print(f"the engine process's CPU time (all its threads), paired ratio layerwise / not: median "
          f"{statistics.median(cpu):.3f} (95 % bootstrap interval of the median {cmeds[50]:.3f}..{cmeds[1949]:.3f}), "
          f"interquartile {cq[0]:.3f}..{cq[2]:.3f}, min..max {min(cpu):.3f}..{max(cpu):.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
