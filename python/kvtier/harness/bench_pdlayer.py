"""Decode time to first token with the harness's CPU model: a pushed prompt read layer by layer
in the decode's step (``pd_layerwise``) against today's asynchronous whole-chunk load.

    python -m kvtier.harness.bench_pdlayer --bin /tmp/kvtier --workdir /tmp/pd-ttft

Two real daemons on loopback TCP and two harness engines in this process,
sharing one 32-layer model (docs/layerwise.md gives the shapes): a producer
(layerwise, per-layer saves, so its daemon pushes each layer as it is saved)
and a consumer. Each measured request is a fresh prompt of ``--prefix``
tokens in whole chunks plus ``--tail`` tokens the decode computes itself.
Two flows, both modes in each, the order alternating round by round:

- ``with``: the proxy sends the decode together with the prefill (it chose
  the transfer id, so it knows the decode's parameters); TTFT runs from
  sending both until the decode's first token, and ``after commit`` from the
  producer's COMMIT_STORE (the end of its save) until then.
- ``after``: the usual proxy order, the decode sent once the prefill has
  answered (its push is then over or nearly); TTFT from sending the decode.

Modes: ``layer`` (``pd_layerwise``: WAIT with IN_PROGRESS, then
PREPARE_RETRIEVE_LAYERS and a LAYER_WAIT per layer in the decode's step) and
``whole`` (the default: the pushed chunks are waited for and loaded in the
background, then the request is scheduled). Every decode's logits are
compared with the producer's (the model computing the whole prompt), and a
load error or a short load fails the run. It prints medians (min–max) of
each mode's TTFT and of the per-round ratio layer / whole.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import sys
import threading
import time
from typing import Dict, List, Tuple

from .. import vllm_kv
from .. import vllm_pd as pd
from ..testing import Daemon
from . import engine as engine_mod
from .engine import Engine, KVTransferConfig
from .model import Llama, LlamaConfig

BLOCK = 16
TOL = 1e-4
MODES = ("layer", "whole")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Bench:
    def __init__(self, args):
        self.args = args
        self.cfg = LlamaConfig(vocab_size=256, hidden=args.hidden, layers=args.layers, heads=4, kv_heads=4,
                               head_dim=64, intermediate=2 * args.hidden, seed=7)
        self.rng = random.Random(13)
        os.makedirs(args.workdir, exist_ok=True)
        prompt_bytes = args.prefix * args.layers * 2 * self.cfg.kv_heads * self.cfg.head_dim * 4
        ram_gb = max(0.25, 4 * prompt_bytes / 2**30)
        self.daemons = {}
        for side in ("prefill", "decode"):
            wd = os.path.join(args.workdir, side)
            shutil.rmtree(wd, ignore_errors=True)
            addr = f"127.0.0.1:{free_port()}"
            d = Daemon(args.bin, wd, chunk_size=args.chunk, ram_gb=ram_gb,
                       extra_env={"KVTIER_TCP_ADDR": addr}, own_session=True).start()
            d.tcp_addr = addr
            self.daemons[side] = d
        self.blocks = 2 * ((args.prefix + args.tail) // BLOCK + 4)
        self.model = Llama(self.cfg)
        p, d = self.daemons["prefill"], self.daemons["decode"]
        self.producer = self._engine(p, "kv_producer", {"tcp_addr": p.tcp_addr, "pd_peers": d.tcp_addr})
        self.consumers = {m: self._engine(d, "kv_consumer", {"pd_peers": p.tcp_addr, "pd_layerwise": m == "layer"})
                          for m in MODES}
        self.commit_at = 0.0
        conn = self.producer.worker_connector
        real_wait = conn.wait_for_save

        def wait_for_save():
            saving = bool(conn._saves)
            real_wait()
            if saving:
                self.commit_at = time.perf_counter()

        conn.wait_for_save = wait_for_save
        self.n = 0

    def _engine(self, d: Daemon, role: str, extra: Dict) -> Engine:
        cfg = {"socket_path": d.socket_path, "timeout": 30.0, "reconnect_interval": 0.0, "layerwise": True}
        cfg.update(extra)
        real = engine_mod.Llama
        engine_mod.Llama = lambda c: self.model  # one set of weights, built once
        try:
            return Engine(self.cfg, model_name="pd-ttft", num_blocks=self.blocks, block_size=BLOCK,
                          layout_kind=vllm_kv.BLOCK_FIRST, prefix_caching=False, kv_snapshots=False,
                          kv_transfer=KVTransferConfig(kv_role=role, kv_connector_extra_config=cfg))
        finally:
            engine_mod.Llama = real

    def prompt(self) -> List[int]:
        return [self.rng.randrange(self.cfg.vocab_size) for _ in range(self.args.prefix + self.args.tail)]

    def one(self, mode: str, flow: str) -> Tuple[float, float]:
        """(TTFT, decode's first token after the producer's commit) of one decode."""
        self.n += 1
        tid, prompt = f"b{self.n}", self.prompt()
        cons, prod = self.consumers[mode], self.producer
        pre = {"do_remote_decode": True, "kvtier_transfer_id": tid, "kvtier_push_to": self.daemons["decode"].tcp_addr}
        src = self.daemons["prefill"].tcp_addr
        params = pd.decode_params(pd.PushRequest(tid, ""), prod.scheduler_connector.link.scope_args, "",
                                  self.args.chunk, self.args.prefix, src, True)
        errors: List[BaseException] = []
        if flow == "after":
            r = prod.add_request(prompt, f"P{self.n}", kv_transfer_params=pre)
            prod.run(timeout=600)
            if prod.output_params[r.request_id] != params:
                raise AssertionError(f"the producer answered {prod.output_params[r.request_id]}")
            t0 = time.perf_counter()
            d = cons.add_request(prompt, f"D{self.n}", kv_transfer_params=params)
            cons.run(timeout=600)
            done = time.perf_counter()
        else:
            d = cons.add_request(prompt, f"D{self.n}", kv_transfer_params=params)
            r = prod.add_request(prompt, f"P{self.n}", kv_transfer_params=pre)
            finished = {}

            def run(name, e):
                try:
                    e.run(timeout=600)
                    finished[name] = time.perf_counter()
                except BaseException as ex:  # noqa: BLE001 - reported below
                    errors.append(ex)

            t0 = time.perf_counter()
            ts = [threading.Thread(target=run, args=(n, e)) for n, e in (("d", cons), ("p", prod))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if errors:
                raise errors[0]
            done = finished["d"]
        self.check(mode, cons, d, r)
        return done - t0, done - self.commit_at

    def check(self, mode, cons, d, r) -> None:
        steps = [s for s in cons.steps if s.req_id == d.request_id]
        loaded = cons.async_loaded.get(d.request_id, 0) + sum(s.external_tokens for s in steps)
        errs = set().union(*(s.load_error_blocks for s in steps))
        if (mode == "layer") == (d.request_id in cons.async_loaded):
            raise AssertionError(f"{mode}: loaded {'asynchronously' if mode == 'layer' else 'in the step'}")
        if loaded != self.args.prefix or errs or d.status.name != "FINISHED":
            raise AssertionError(f"{mode}: loaded {loaded} of {self.args.prefix} tokens, errors {sorted(errs)}")
        diff = (d.logits[0] - r.logits[0]).abs().max().item()
        if diff > TOL:
            raise AssertionError(f"{mode}: the decode's logits differ from the prefill's by {diff}")

    def close(self) -> None:
        for e in [self.producer, *self.consumers.values()]:
            e.close()
        for d in self.daemons.values():
            d.kill()


def _ms(xs: List[float]) -> str:
    return f"{statistics.median(xs) * 1000:.1f} ms ({min(xs) * 1000:.1f}–{max(xs) * 1000:.1f})"


def _ratio(xs: List[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("KVTIER_BIN", "kvtier"))
    ap.add_argument("--workdir", default="/tmp/kvtier-pd-ttft")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--prefix", type=int, default=1024, help="prompt tokens in whole chunks (pushed)")
    ap.add_argument("--tail", type=int, default=7, help="prompt tokens after them (the decode computes them)")
    ap.add_argument("--chunk", type=int, default=256, help="the daemons' chunk size in tokens")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flows", default="with,after")
    args = ap.parse_args(argv)
    if args.prefix % args.chunk or args.tail < 1:
        ap.error("--prefix must be whole chunks and --tail at least 1")
    b = Bench(args)
    try:
        b.one("layer", "after")  # warm-up: connections, arena mappings, the model's first pass
        b.one("whole", "after")
        for flow in args.flows.split(","):
            got: Dict[str, List[Tuple[float, float]]] = {m: [] for m in MODES}
            for rnd in range(args.rounds):
                order = MODES if rnd % 2 == 0 else MODES[::-1]
                for m in order:
                    got[m].append(b.one(m, flow))
            print(f"flow {flow}: {args.rounds} rounds, {args.layers} layers, prefix {args.prefix}, tail {args.tail}")
            for m in MODES:
                line = f"  {m:5s} TTFT {_ms([x[0] for x in got[m]])}"
                if flow == "with":
                    line += f"; after the producer's commit {_ms([x[1] for x in got[m]])}"
                print(line)
            ratios = [a[0] / w[0] for a, w in zip(got["layer"], got["whole"])]
            print(f"  layer / whole TTFT, per round: {_ratio(ratios)}")
            sys.stdout.flush()
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
