"""Measures CacheBlend on the trained model: speed and quality against full prefill.

    /usr/bin/python3 -m kvtier.harness.blend_eval [--queries 200] [--ratios 0,5,10,15,25,50,100]

Loads (or trains and caches) the model of blend_task, starts a real
``kvtier serve``, stores every pool document's K/V in it (positions from 0),
then runs each query of the workload once as a full prefill and once per
recompute ratio through :class:`kvtier.blend.Blender`, which loads the
documents' K/V from the daemon, rotates it into place and recomputes the
selected tokens. Printed per ratio:

- TTFT ratio: total blended prefill time (load, rotate, compute) over total
  full prefill time, both measured in this run;
- KL: mean KL(full ‖ blended) of the first answer token's distribution;
- max logit err: the largest absolute logit difference over all queries;
- agree: share of queries whose greedy answer tokens equal full prefill's;
- task acc: share of queries answered correctly.

The first line gives the full prefill's own task accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import List

import torch

from .. import blend
from ..client import Client
from ..testing import Daemon, daemon_binary
from . import blend_task as bt

def greedy2(model, logits: torch.Tensor, kv, follow: List[int]) -> List[int]:
    """The greedy answers after a prefill with last logits ``logits`` and K/V ``kv``:
    the first, then — when the query has a ``follow`` question, after the first
    answer and those tokens, decoded over the same K/V — the second."""
    first = int(logits.argmax())
    if not follow:
        return [first]
    for tok in [first] + list(follow):
        out, kv = model.decode(tok, kv)
    return [first, int(out.argmax())]


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    lp, lq = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum())


def evaluate(model, queries, pool, blender, ratios, log=print, table_every: int = 0) -> dict:
    """Runs the queries; with ``table_every``, also logs the table over the queries
    done so far after every that many (a long run that is cut short still leaves figures)."""
    full_time, full_correct = 0.0, 0
    rows = {r: {"time": 0.0, "kl": 0.0, "maxerr": 0.0, "agree": 0, "correct": 0} for r in ratios}
    for qi, q in enumerate(queries):
        prompt = bt.join([pool[i].tokens for i in q.docs], q.question)
        t = time.perf_counter()
        want, kv = model.prefill(prompt)
        full_time += time.perf_counter() - t
        want_ans = greedy2(model, want, kv, q.follow)
        full_correct += want_ans == q.answer
        for r in ratios:
            t = time.perf_counter()
            res = blender.prefill(prompt, ratio=r / 100.0, store_misses=False)
            row = rows[r]
            row["time"] += time.perf_counter() - t
            row["kl"] += kl(want, res.logits)
            row["maxerr"] = max(row["maxerr"], float((want - res.logits).abs().max()))
            ans = greedy2(model, res.logits, res.kv, q.follow)
            row["agree"] += ans == want_ans
            row["correct"] += ans == q.answer
        if (qi + 1) % 10 == 0:
            log(f"  {qi + 1}/{len(queries)} queries")
        if table_every and (qi + 1) % table_every == 0 and qi + 1 < len(queries):
            log(table(_summary(qi + 1, full_correct, full_time, rows), blender.settings.check_layers))
    return _summary(len(queries), full_correct, full_time, rows)


def _summary(n: int, full_correct: int, full_time: float, rows: dict) -> dict:
    return {"queries": n, "full_acc": full_correct / n, "full_time": full_time,
            "rows": {r: {"ttft_ratio": v["time"] / full_time, "kl": v["kl"] / n, "max_logit_err": v["maxerr"],
                         "agree": v["agree"] / n, "task_acc": v["correct"] / n} for r, v in rows.items()}}


def table(result: dict, check_layers) -> str:
    lines = [f"queries: {result['queries']}, full prefill task accuracy {result['full_acc']:.3f}, "
             f"full prefill total {result['full_time']:.1f}s, check layers {list(check_layers)}",
             "| r | TTFT ratio | KL (first token) | KL / KL at 0% | max logit err | greedy agree | task acc |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    base = result["rows"].get(0.0, {}).get("kl")
    for r, v in result["rows"].items():
        rel = f"{v['kl'] / base:.3f}" if base else "—"  # no r = 0% row, or it has no deviation
        lines.append(f"| {r:g}% | {v['ttft_ratio']:.3f} | {v['kl']:.2e} | {rel} | {v['max_logit_err']:.2e} | "
                     f"{v['agree']:.3f} | {v['task_acc']:.3f} |")
    return "\n".join(lines)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    model = bt.load_or_train(log=lambda s: print(s, flush=True))
    w = bt.Workload(seed=args.seed, queries=args.queries, doc_min=args.doc_min, doc_max=args.doc_max)
    pool, queries = bt.workload(w)
    ratios = [float(r) for r in args.ratios.split(",")]
    settings = blend.BlendSettings(enable=True, check_layers=[int(c) for c in args.check_layers.split(",")],
                                   recompute_ratios=[0.15], min_tokens=0)
    with tempfile.TemporaryDirectory(prefix="kvtier-blend-") as work:
        d = Daemon(args.kvtier_bin or daemon_binary(work), work, chunk_size=256, ram_gb=1.0).start()
        try:
            with Client(d.socket_path) as c:
                store = blend.SegmentStore(c, "kvtier-blend-eval", namespace=bt.TrainConfig().digest())
                blender = blend.Blender(model, store, settings, bt.encode)
                for seg in [[bt.BOS]] + [doc.tokens for doc in pool]:
                    store.store(seg, blender.segment_kv(seg))
                print(f"stored {len(pool)} documents' K/V in the daemon; running {len(queries)} queries", flush=True)
                result = evaluate(model, queries, pool, blender, ratios, log=lambda s: print(s, flush=True),
                                  table_every=args.table_every)
        finally:
            d.stop()
    print(table(result, settings.check_layers))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--ratios", default="0,5,10,15,25,50,100", help="recompute ratios in percent")
    ap.add_argument("--check-layers", default="1")
    ap.add_argument("--seed", type=int, default=1, help="workload seed")
    ap.add_argument("--doc-min", type=int, default=300)
    ap.add_argument("--doc-max", type=int, default=1000)
    # One thread: on a shared 2-core machine a second torch thread waits on
    # the other load and made training steps ten times slower, not faster.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kvtier-bin", default=os.environ.get("KVTIER_BIN"))
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--table-every", type=int, default=0, metavar="N",
                    help="also print the table over the queries done so far after every N queries")
    args = ap.parse_args()
    bt.use_fast_blas("kvtier.harness.blend_eval")
    run(args)


if __name__ == "__main__":
    main()
