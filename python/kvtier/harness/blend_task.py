"""A synthetic RAG task, and the in-tree training of the model CacheBlend is measured on.

A prompt is a start segment, several documents and a question, separated by
the blend marker " # # " (two "#" tokens)::

    <s> # # doc_1 # # doc_2 # # ... # # doc_n # # ? c_a   ->  v_a, then c_b -> v_b

Each document is filler words with one value token ``v`` somewhere in it;
the 64 values come in 8 classes (``c0``..``c7``), and the documents of one
prompt hold values of distinct classes. The question names a class, the
answer is the value of that class; then a second class, held by another
document, and its value: the answer ``v_a v_b`` needs attention from the
question into both documents, and the value's position in a 300-1,000-token document is
random. Deviation of blended K/V from full prefill changes what the
question's tokens read, so it shows in the answer's logits and accuracy.

Training uses the same format (with six question groups per sequence so
each sequence gives more answer targets) over a curriculum of document
lengths, 4-14 tokens, then 20-60, then 100-300; with a rotary base of 1e6 the
lookup learnt there carries over to the evaluation's long-document workload
(:func:`workload`). Weights are
cached under ``~/.cache/kvtier`` (or $KVTIER_BLEND_CACHE) keyed by a hash of
the training settings and of the source of the code that trains the model,
so they are trained once per change, reproducibly from the seed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from .blend_model import BlendLM, BlendModelConfig

# ----- vocabulary -------------------------------------------------------

SPECIALS = ["<pad>", "<s>", "#", "?"]
N_CLASSES, N_VALUES, N_FILLER = 8, 64, 200
WORDS = (SPECIALS + [f"c{i}" for i in range(N_CLASSES)] + [f"v{i:02d}" for i in range(N_VALUES)]
         + [f"w{i:03d}" for i in range(N_FILLER)])
IDS = {w: i for i, w in enumerate(WORDS)}
BOS, HASH, QUESTION = IDS["<s>"], IDS["#"], IDS["?"]
CLASS0 = len(SPECIALS)
VALUE0 = CLASS0 + N_CLASSES
FILLER0 = VALUE0 + N_VALUES
VOCAB = 384  # >= len(WORDS), rounded up
MARKER = " # # "


def encode(text: str) -> List[int]:
    """Whitespace tokenizer of the synthetic vocabulary (the marker " # # " is two "#" tokens)."""
    try:
        return [IDS[w] for w in text.split()]
    except KeyError as e:
        raise ValueError(f"word {e.args[0]!r} is not in the task's vocabulary") from None


def decode(ids: Sequence[int]) -> str:
    return " ".join(WORDS[i] if 0 <= i < len(WORDS) else f"<{i}>" for i in ids)


# ----- documents and prompts --------------------------------------------


@dataclass
class Doc:
    tokens: List[int]
    value: int  # the document's one value token


def value_class(v: int) -> int:
    """The class token naming a value's class (values come in N_CLASSES classes of equal size)."""
    return CLASS0 + (v - VALUE0) // (N_VALUES // N_CLASSES)


def make_doc(rng: random.Random, length: int, cls: int) -> Doc:
    """Filler of ``length`` tokens with one value of class ``cls`` (0-based) at a random place."""
    per = N_VALUES // N_CLASSES
    v = VALUE0 + cls * per + rng.randrange(per)
    body = [FILLER0 + rng.randrange(N_FILLER) for _ in range(length - 1)]
    at = rng.randrange(len(body) + 1)
    return Doc(body[:at] + [v] + body[at:], v)


def make_pool(rng: random.Random, n_docs: int, lo: int, hi: int, distinct: bool = False) -> List[Doc]:
    """Documents of lo..hi tokens; with ``distinct``, no two share a value class."""
    classes = rng.sample(range(N_CLASSES), n_docs) if distinct else [rng.randrange(N_CLASSES) for _ in range(n_docs)]
    return [make_doc(rng, rng.randint(lo, hi), c) for c in classes]


def join(docs: Sequence[Sequence[int]], question: Sequence[int]) -> List[int]:
    """The prompt: start segment, documents, question, with the marker between segments."""
    marker = encode(MARKER)
    out = [BOS]
    for d in docs:
        out += marker + list(d)
    return out + marker + list(question)


@dataclass
class Query:
    docs: List[int]  # indices into the pool, in prompt order
    question: List[int]  # "?" and the first class: the prompt ends here
    follow: List[int]  # the second class, given after the first answer
    answer: List[int]  # the two values


def make_query(rng: random.Random, pool: Sequence[Doc], n_docs: int) -> Query:
    """n_docs documents of distinct value classes, in random order, and a question naming two classes."""
    order = list(range(len(pool)))
    rng.shuffle(order)
    idx, seen = [], set()
    for i in order:
        c = value_class(pool[i].value)
        if c not in seen:
            idx.append(i)
            seen.add(c)
            if len(idx) == n_docs:
                break
    if len(idx) < n_docs:
        raise ValueError(f"the pool has documents of only {len(idx)} value classes; {n_docs} wanted")
    a, b = rng.sample(idx, 2)
    va, vb = pool[a].value, pool[b].value
    return Query(idx, [QUESTION, value_class(va)], [value_class(vb)], [va, vb])


@dataclass(frozen=True)
class Workload:
    """The evaluation workload: queries over a pool of long documents."""

    seed: int = 1
    queries: int = 200
    pool: int = 50
    min_docs: int = 4
    max_docs: int = 6
    doc_min: int = 300
    doc_max: int = 1000


def workload(w: Workload) -> Tuple[List[Doc], List[Query]]:
    rng = random.Random(w.seed)
    pool = make_pool(rng, w.pool, w.doc_min, w.doc_max)
    return pool, [make_query(rng, pool, rng.randint(w.min_docs, w.max_docs)) for _ in range(w.queries)]


# ----- training ------------------------------------------------------------


def _long_context_model() -> BlendModelConfig:
    # A rotary base of 1e6 (Llama 3 uses 5e5) leaves the lowest frequencies
    # nearly still over a 6,000-token prompt, so attention from the question
    # can match a value token by content at any distance; with 1e4 the
    # lowest pair turns by ~2 rad over such a prompt and a lookup learnt on
    # short documents does not carry over.
    return BlendModelConfig(rope_theta=1e6)


@dataclass(frozen=True)
class TrainConfig:
    model: BlendModelConfig = field(default_factory=_long_context_model)
    # Curriculum: (steps, batch, doc_min, doc_max) per stage. The task is
    # learnt on short documents, then the same lookup is trained over longer
    # ones so attention keeps finding the one value token among more filler.
    stages: Tuple[Tuple[int, int, int, int], ...] = ((300, 8, 4, 14), (100, 4, 20, 60), (60, 1, 100, 300))
    lr: float = 4e-3
    warmup: int = 20
    groups: int = 6
    seed: int = 0

    @property
    def steps(self) -> int:
        return sum(s[0] for s in self.stages)

    def digest(self) -> str:
        """Hash of the settings and of the code that makes the weights.

        The code is the source of the functions that generate training data,
        train, and define the model's parameters and training forward — not
        whole files, so editing a comment or the inference passes does not
        force a retrain.
        """
        h = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        h.update(" ".join(WORDS).encode())
        for fn in _TRAINING_CODE():
            h.update(inspect.getsource(fn).encode())
        return h.hexdigest()[:16]


def _TRAINING_CODE():
    from . import blend_model as bm
    return (make_doc, make_pool, join, make_query, training_sequence, batch, train,
            bm.rope, bm.inv_freq, bm._rms, bm._Layer, bm.BlendLM.__init__, bm.BlendLM._qkv,
            bm.BlendLM._finish, bm.BlendLM.logits, bm.BlendLM.forward)


def training_sequence(rng: random.Random, tc: TrainConfig, lo: int, hi: int) -> Tuple[List[int], List[int]]:
    """One training prompt with documents of lo..hi tokens, and its targets (-100 where there is no loss)."""
    n = rng.randint(4, 6)
    pool = make_pool(rng, n, lo, hi, distinct=True)
    tokens = join([d.tokens for d in pool], [])
    targets = [-100] * len(tokens)
    for _ in range(tc.groups):
        q = make_query(rng, pool, n)
        tokens += q.question + [q.answer[0]] + q.follow + [q.answer[1]]
        targets += [-100, q.answer[0], -100, q.answer[1], -100]
    return tokens, targets


def batch(rng: random.Random, tc: TrainConfig, stage: Tuple[int, int, int, int]) -> Tuple[torch.Tensor, torch.Tensor]:
    _, size, lo, hi = stage
    seqs = [training_sequence(rng, tc, lo, hi) for _ in range(size)]
    t = max(len(s) for s, _ in seqs)
    x = torch.zeros(len(seqs), t, dtype=torch.long)
    y = torch.full((len(seqs), t), -100, dtype=torch.long)
    for i, (s, tg) in enumerate(seqs):
        x[i, :len(s)] = torch.tensor(s)
        y[i, :len(tg)] = torch.tensor(tg)
    return x, y


def train(tc: TrainConfig, log=print) -> BlendLM:
    torch.manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    model = BlendLM(tc.model)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / tc.warmup) * max(0.05, 1 - s / tc.steps))
    t0, acc_sum, loss_sum = time.monotonic(), 0.0, 0.0
    plan = [stage for stage in tc.stages for _ in range(stage[0])]
    for step, stage in enumerate(plan):
        x, y = batch(rng, tc, stage)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        m = y != -100
        acc_sum += (logits.argmax(-1)[m] == y[m]).float().mean().item()
        loss_sum += loss.item()
        if (step + 1) % 25 == 0:
            log(f"step {step + 1}/{tc.steps} loss {loss_sum / 25:.3f} answer-token acc {acc_sum / 25:.3f} "
                f"({time.monotonic() - t0:.0f}s)")
            acc_sum = loss_sum = 0.0
    model.eval()
    return model


def cache_dir() -> str:
    return os.environ.get("KVTIER_BLEND_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kvtier")


def weights_path(tc: TrainConfig) -> str:
    return os.path.join(cache_dir(), f"blend-{tc.digest()}.pt")


def load_or_train(tc: Optional[TrainConfig] = None, log=print) -> BlendLM:
    """The trained model: from the weight cache, or trained now and cached."""
    tc = tc or TrainConfig()
    path = weights_path(tc)
    model = BlendLM(tc.model)
    if os.path.exists(path):
        model.load_state_dict(torch.load(path))
        model.eval()
        return model
    log(f"training the blend model ({tc.steps} steps); weights go to {path}")
    model = train(tc, log)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)
    return model


OPENBLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-pthread"


def use_fast_blas(module: str) -> None:
    """Re-executes ``python -m module`` with Debian's OpenBLAS when it is installed but not chosen.

    Debian's torch calls the system BLAS, which is the reference
    implementation unless an optimized one is selected; for this model that
    is about ten times slower. Nothing happens when OpenBLAS is absent or
    this process was already re-executed. The numbers do not depend on it
    beyond float rounding.
    """
    if os.environ.get("KVTIER_BLAS_CHOSEN") or not os.path.exists(os.path.join(OPENBLAS_DIR, "libblas.so.3")):
        return
    env = dict(os.environ, KVTIER_BLAS_CHOSEN="1", OPENBLAS_NUM_THREADS="1",
               LD_LIBRARY_PATH=":".join(p for p in (OPENBLAS_DIR, os.environ.get("LD_LIBRARY_PATH")) if p))
    os.execve(sys.executable, [sys.executable, "-m", module] + sys.argv[1:], env)


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description="Train (or find cached) the CacheBlend evaluation model.")
    # One thread: on a shared 2-core machine a second torch thread waits on
    # the other load and made training steps ten times slower, not faster.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    use_fast_blas("kvtier.harness.blend_task")
    torch.set_num_threads(args.threads)
    tc = TrainConfig()
    load_or_train(tc)
    print(weights_path(tc))


if __name__ == "__main__":
    main()
