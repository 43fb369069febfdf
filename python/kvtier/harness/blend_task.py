"""A synthetic RAG task, and the in-tree training of the model CacheBlend is measured on.

A prompt is a start segment, several documents and a question, separated by
the blend marker " # # " (two "#" tokens)::

    <s> # # doc_1 # # doc_2 # # ... # # doc_n # # ? c_a   ->  v

Each document is filler words holding, at random places, a value (``v17``; 64
values in 8 classes ``c0``..``c7``, the documents of a prompt holding values
of distinct classes) and a mark of another class (``m3``). The question
``? c3`` asks for the class-3 value, written ``u17`` instead of ``v17`` when
an earlier document of the prompt marks class 3. In the evaluation the asked
class's mark is always in the prompt, before the value for half the queries
and only after it for the other half, so the answer depends on the order, on
what one document says about another: the value token has to attend to
earlier documents for a mark of its class, and that information belongs in
its K/V — what a document's K/V cached on its own lacks and CacheBlend's
selective recompute has to restore. Both lookups (value to mark, question
to value) match a class, which a small model finds at any distance.

Training uses the same format (one question per document whose class's mark
is in the prompt) over a curriculum of document lengths, with random jumps of
the rotary positions between segments, and reads out, after the first layer,
whether each value is marked, so that the attention across documents happens
early in the stack, where CacheBlend's check layer sees it. Weights are
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

SPECIALS = ["<pad>", "<s>", "#", "?", "yes", "no"]
N_CLASSES, N_VALUES, N_FILLER = 8, 64, 200
# Values v00..v63 come in 8 classes of 8; "u17" is value v17 as answered when
# an earlier document marks its class; "m3" marks class 3.
WORDS = (SPECIALS + [f"c{i}" for i in range(N_CLASSES)] + [f"v{i:02d}" for i in range(N_VALUES)]
         + [f"u{i:02d}" for i in range(N_VALUES)] + [f"m{i}" for i in range(N_CLASSES)]
         + [f"w{i:03d}" for i in range(N_FILLER)])
IDS = {w: i for i, w in enumerate(WORDS)}
BOS, HASH, QUESTION, YES, NO = IDS["<s>"], IDS["#"], IDS["?"], IDS["yes"], IDS["no"]
CLASS0 = len(SPECIALS)
VALUE0 = CLASS0 + N_CLASSES
MARKED0 = VALUE0 + N_VALUES
MARK0 = MARKED0 + N_VALUES
FILLER0 = MARK0 + N_CLASSES
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
    """Filler with one value token and one mark token (naming a class other than
    the value's), each at a random place."""

    tokens: List[int]
    value: int  # the value token
    mark: int  # the class token (c0..c7) this document's mark names
    value_at: int  # index of the value in ``tokens``


def value_class(v: int) -> int:
    """The class token naming a value's class (values come in N_CLASSES classes of equal size)."""
    return CLASS0 + (v - VALUE0) // (N_VALUES // N_CLASSES)


def answer_token(value: int, marked: bool) -> int:
    """The answer about a value: "yes" when an earlier document marks its class, else "no"."""
    return YES if marked else NO


def make_doc(rng: random.Random, length: int, value: int, mark: int) -> Doc:
    """Filler of ``length`` tokens with the ``value`` token and the mark of class
    ``mark`` (a class token id), each at a random place."""
    if length < 2:
        raise ValueError(f"a document needs at least 2 tokens, not {length}")
    body = [FILLER0 + rng.randrange(N_FILLER) for _ in range(length - 2)]
    for t in rng.sample([value, MARK0 + mark - CLASS0], 2):
        body.insert(rng.randrange(len(body) + 1), t)
    return Doc(body, value, mark, body.index(value))


def valid(docs: Sequence[Doc]) -> List[bool]:
    """Per document (in prompt order): does an earlier document mark its value's class?"""
    return [any(p.mark == value_class(d.value) for p in docs[:i]) for i, d in enumerate(docs)]


def make_pool(rng: random.Random, n_docs: int, lo: int, hi: int) -> List[Doc]:
    """Documents of lo..hi tokens with distinct values, each marking a class other
    than its value's."""
    values = [VALUE0 + v for v in rng.sample(range(N_VALUES), n_docs)]
    docs = []
    for v in values:
        mark = rng.choice([c for c in range(CLASS0, CLASS0 + N_CLASSES) if c != value_class(v)])
        docs.append(make_doc(rng, rng.randint(lo, hi), v, mark))
    return docs


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
    question: List[int]  # "?" and the class: the prompt ends here
    follow: List[int]  # nothing: one question per prompt
    answer: List[int]  # the asked class's value, as answer_token writes it


def make_query(rng: random.Random, pool: Sequence[Doc], n_docs: int) -> Query:
    """``n_docs`` documents of distinct value classes in random order and a question
    about a class whose mark is in the prompt. Half the answers (a coin) are marked —
    the mark comes before the value — and half are not — it comes only after —, so
    the answer depends on the order, on what one document says about another."""
    want_marked = rng.random() < 0.5
    for _ in range(20000):
        idx = rng.sample(range(len(pool)), n_docs)
        docs = [pool[i] for i in idx]
        if len({value_class(d.value) for d in docs}) != n_docs:
            continue
        ok = valid(docs)
        asks = [j for j, d in enumerate(docs) if ok[j] == want_marked
                and any(p.mark == value_class(d.value) for p in docs[j + 1:] + docs[:j])]
        if not asks:
            continue
        d = docs[rng.choice(asks)]
        return Query(idx, [QUESTION, value_class(d.value)], [], [answer_token(d.value, want_marked)])
    raise ValueError(f"no {n_docs} documents of this pool of {len(pool)} make a question")


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
    stages: Tuple[Tuple[int, int, int, int], ...] = ((1500, 16, 4, 14), (150, 4, 20, 60), (30, 1, 100, 300))
    lr: float = 4e-3
    warmup: int = 20
    # Early targets are read out after this many layers: after the first, so
    # a value looks for marks in layer 0 and its K/V deviates from the cached
    # one already in check layer 1.
    tap: int = 1
    gap: int = 1500  # largest position jump at a segment start (see training_sequence)
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
    return (value_class, answer_token, make_doc, valid, join, training_docs, training_sequence, batch, train,
            bm.rope, bm.inv_freq, bm._rms, bm._Layer, bm.BlendLM.__init__, bm.BlendLM._qkv,
            bm.BlendLM._finish, bm.BlendLM.logits, bm.BlendLM.forward)


def training_docs(rng: random.Random, lo: int, hi: int) -> List[Doc]:
    """4-6 documents of lo..hi tokens and distinct value classes for one training
    prompt, in prompt order. A mark names another document's class (probability
    0.8) or a class not in the prompt."""
    n = rng.randint(4, 6)
    classes = rng.sample(range(CLASS0, CLASS0 + N_CLASSES), n)
    per = N_VALUES // N_CLASSES
    docs = []
    for c in classes:
        others = [x for x in classes if x != c]
        absent = [x for x in range(CLASS0, CLASS0 + N_CLASSES) if x not in classes]
        mark = rng.choice(others if rng.random() < 0.8 or not absent else absent)
        value = VALUE0 + (c - CLASS0) * per + rng.randrange(per)
        docs.append(make_doc(rng, rng.randint(lo, hi), value, mark))
    return docs


def training_sequence(rng: random.Random, tc: TrainConfig, lo: int,
                      hi: int) -> Tuple[List[int], List[int], List[int], List[int]]:
    """One training prompt with documents of lo..hi tokens, its targets, its early
    targets (-100 where there is no loss) and its rotary positions.

    Positions jump by a random gap of up to ``tc.gap`` at the start of every
    segment: short prompts then span the distances of long ones, and a
    position comparison cannot tell which of two far-apart tokens comes
    first — only causal attention can, which puts the order into the value's
    own K/V.

    Targets are the answers to one question per document ("? c" -> "yes" when an
    earlier document marks class c, else "no"). Early targets sit on every
    value: "yes" when an earlier document marks its class, else "no", read out
    after the first ``tc.tap`` layers — so a value reads the other documents, early
    in the stack, which is the cross-document attention CacheBlend's check layers
    detect and its recompute restores.
    """
    while True:
        docs = training_docs(rng, lo, hi)
        # As in the evaluation, only classes whose mark is in the prompt are
        # asked: "no mark at all" would be an answer without order.
        asks = [j for j, d in enumerate(docs) if any(p.mark == value_class(d.value) for p in docs)]
        if asks:
            break
    ok = valid(docs)
    tokens = join([d.tokens for d in docs], [])
    targets = [-100] * len(tokens)
    early = [-100] * len(tokens)
    at, pos, shift = 1, [0], 0
    for d, good in zip(docs, ok):
        shift += rng.randint(0, tc.gap)
        pos += range(at + shift, at + shift + 2 + len(d.tokens))
        at += 2  # the marker
        early[at + d.value_at] = YES if good else NO
        at += len(d.tokens)
    # Each is asked once, in random order: a repeated question could copy
    # the earlier answer instead of looking it up.
    for j in rng.sample(asks, len(asks)):
        ans = answer_token(docs[j].value, ok[j])
        tokens += [QUESTION, value_class(docs[j].value), ans]
        targets += [-100, ans, -100]
    shift += rng.randint(0, tc.gap)
    pos += range(at + shift, at + shift + len(tokens) - at)
    return tokens, targets, early + [-100] * (len(tokens) - len(early)), pos


def batch(rng: random.Random, tc: TrainConfig, stage: Tuple[int, int, int, int]):
    """Tokens, targets, early targets and positions of one training batch ([batch, T] each)."""
    _, size, lo, hi = stage
    seqs = [training_sequence(rng, tc, lo, hi) for _ in range(size)]
    t = max(len(s[0]) for s in seqs)
    x = torch.zeros(len(seqs), t, dtype=torch.long)
    y = torch.full((len(seqs), t), -100, dtype=torch.long)
    y_early = torch.full((len(seqs), t), -100, dtype=torch.long)
    pos = torch.arange(t).repeat(len(seqs), 1)
    for i, (s, tg, early, p) in enumerate(seqs):
        x[i, :len(s)] = torch.tensor(s)
        y[i, :len(tg)] = torch.tensor(tg)
        y_early[i, :len(early)] = torch.tensor(early)
        pos[i, :len(p)] = torch.tensor(p)
        pos[i, len(p):] += p[-1] + 1 - len(p)  # padding after the prompt, ascending
    return x, y, y_early, pos


def train(tc: TrainConfig, log=print) -> BlendLM:
    torch.manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    model = BlendLM(tc.model)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / tc.warmup) * max(0.05, 1 - s / tc.steps))
    t0, sums = time.monotonic(), [0.0, 0.0, 0.0]
    plan = [stage for stage in tc.stages for _ in range(stage[0])]
    ce = torch.nn.functional.cross_entropy
    for step, stage in enumerate(plan):
        x, y, y_early, pos = batch(rng, tc, stage)
        logits, early = model(x, tap=tc.tap, positions=pos)
        loss = (ce(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
                + ce(early.reshape(-1, early.shape[-1]), y_early.reshape(-1), ignore_index=-100))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        m, me = y != -100, y_early != -100
        sums[0] += loss.item()
        sums[1] += (logits.argmax(-1)[m] == y[m]).float().mean().item()
        sums[2] += (early.argmax(-1)[me] == y_early[me]).float().mean().item()
        if (step + 1) % 25 == 0:
            log(f"step {step + 1}/{tc.steps} loss {sums[0] / 25:.3f} answer acc {sums[1] / 25:.3f} "
                f"early reference acc {sums[2] / 25:.3f} ({time.monotonic() - t0:.0f}s)")
            sums = [0.0, 0.0, 0.0]
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
