"""A synthetic RAG task, and the in-tree training of the model CacheBlend is measured on.

A prompt is a start segment, several documents and a question, separated by
the blend marker " # # " (two "#" tokens)::

    <s> # # doc_1 # # doc_2 # # ... # # doc_n # # ? c_a   ->  v_a, then c_b -> v_b

Each document is filler words holding two facts, each one token at a random
place: a *definition* ``e05=2`` (entity 5 is in setting 2; 16 entities, 4
settings) and a *reference* ``c3>e11`` (the item of class 3 is entity 11). A
reference names an entity that another document defines, and the pool defines
each entity several times, in different settings, so what a reference means
depends on which documents share the prompt. The question names a class;
the answer is the value token of the entity its reference points to, then,
after a second class, the same for another reference: ``? c3`` -> ``e11=1``,
``c6`` -> ``e02=3``. Resolving a reference needs attention from one document
into another at that token — what a document's K/V, cached on its own,
lacks, and what CacheBlend's selective recompute has to restore.

Training uses the same format (with six question pairs per sequence so each
sequence gives more answer targets, and the value as a target at each
resolvable reference token too) over a curriculum of document lengths, 4-14
tokens, then 20-60, then 100-300; with a rotary base of 1e6 the lookups learnt
there carry over to the evaluation's long-document workload (:func:`workload`). Weights are
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
N_CLASSES, N_ENTITIES, N_SETTINGS, N_FILLER = 8, 16, 4, 200
# "e05=2" is one token: entity 5 is in setting 2. A reference is two tokens,
# "e11 c3": entity 11 is the item of class 3. Answers are value tokens.
WORDS = (SPECIALS + [f"c{i}" for i in range(N_CLASSES)] + [f"e{e:02d}" for e in range(N_ENTITIES)]
         + [f"e{e:02d}={s}" for e in range(N_ENTITIES) for s in range(N_SETTINGS)]
         + [f"w{i:03d}" for i in range(N_FILLER)])
IDS = {w: i for i, w in enumerate(WORDS)}
BOS, HASH, QUESTION = IDS["<s>"], IDS["#"], IDS["?"]
CLASS0 = len(SPECIALS)
ENTITY0 = CLASS0 + N_CLASSES
VALUE0 = ENTITY0 + N_ENTITIES
FILLER0 = VALUE0 + N_ENTITIES * N_SETTINGS
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


def value_token(entity: int, setting: int) -> int:
    """The token saying "entity ``entity`` is in setting ``setting``"."""
    return VALUE0 + entity * N_SETTINGS + setting


@dataclass
class Doc:
    """A document: filler with one definition (a value token: entity e is in
    setting s) and one reference (entity e' is the item of class c; another
    document defines e')."""

    tokens: List[int]
    entity: int  # the entity this document defines (0-based)
    value: int  # its value token
    ref_class: int  # the class this document's reference names (0-based)
    ref_entity: int  # the entity it points to (0-based)
    ref_at: int  # index in ``tokens`` of the reference's entity token (its class token follows)
    direct: bool = False  # the reference's first token is a value token, not an entity token


def make_doc(rng: random.Random, length: int, entity: int, ref_class: int, ref_entity: int,
             direct: bool = False) -> Doc:
    """Filler of ``length`` tokens holding a definition of ``entity`` (a random setting)
    and the reference, each at a random place. A ``direct`` reference (training
    only) names the entity by a value token of its own, "e11=2 c3", so it needs
    no other document."""
    if length < 3:
        raise ValueError(f"a document needs at least 3 tokens, not {length}")
    value = value_token(entity, rng.randrange(N_SETTINGS))
    body = [FILLER0 + rng.randrange(N_FILLER) for _ in range(length - 3)]
    at = rng.randrange(len(body) + 1)
    pointer = value_token(ref_entity, rng.randrange(N_SETTINGS)) if direct else ENTITY0 + ref_entity
    body[at:at] = [pointer, CLASS0 + ref_class]
    v = rng.randrange(len(body) + 1)
    if at < v <= at + 1:  # not between the reference's two tokens
        v = at
    body.insert(v, value)
    ref_at = at + (v <= at)
    return Doc(body, entity, value, ref_class, ref_entity, ref_at, direct)


def make_pool(rng: random.Random, n_docs: int, lo: int, hi: int) -> List[Doc]:
    """The workload's document pool: each document defines a random entity (an entity is
    defined by several documents, in different settings) and refers to an entity that
    some other document of the pool defines."""
    entities = [rng.randrange(N_ENTITIES) for _ in range(n_docs)]
    pool = []
    for i, e in enumerate(entities):
        others = sorted({x for j, x in enumerate(entities) if j != i and x != e})
        if not others:
            raise ValueError(f"a pool of {n_docs} documents defines too few entities to refer across documents")
        pool.append(make_doc(rng, rng.randint(lo, hi), e, rng.randrange(N_CLASSES), rng.choice(others)))
    return pool


def join(docs: Sequence[Sequence[int]], question: Sequence[int]) -> List[int]:
    """The prompt: start segment, documents, question, with the marker between segments."""
    marker = encode(MARKER)
    out = [BOS]
    for d in docs:
        out += marker + list(d)
    return out + marker + list(question)


def resolvable(docs: Sequence[Doc]) -> List[int]:
    """Indices (into ``docs``, in prompt order) of documents whose reference points to an
    entity defined by an earlier document."""
    return [i for i, d in enumerate(docs) if not d.direct and any(p.entity == d.ref_entity for p in docs[:i])]


@dataclass
class Query:
    docs: List[int]  # indices into the pool, in prompt order
    question: List[int]  # "?" and the first class: the prompt ends here
    follow: List[int]  # the second class, given after the first answer
    answer: List[int]  # the two values


def admissible(pool: Sequence[Doc], idx: Sequence[int]) -> bool:
    """No two of the documents define the same entity or refer by the same class."""
    docs = [pool[i] for i in idx]
    return (len({d.entity for d in docs}) == len(docs) and len({d.ref_class for d in docs}) == len(docs))


def make_query(rng: random.Random, pool: Sequence[Doc], n_docs: int) -> Query:
    """``n_docs`` documents in random order, among them two whose references resolve to a
    definition earlier in the prompt; the question names both references' classes, the
    answer is the two values they point to.

    Drawn as: two referring documents, for each a document defining what it points
    to, the rest at random — retried until no entity is defined twice and no class
    named twice — then shuffled, a definer moved before its referrer when needed.
    """
    definers: dict = {}
    for i, d in enumerate(pool):
        definers.setdefault(d.entity, []).append(i)
    for _ in range(10000):
        b1, b2 = rng.sample(range(len(pool)), 2)
        a1, a2 = (rng.choice(definers.get(pool[b].ref_entity, [b])) for b in (b1, b2))
        idx = list(dict.fromkeys([a1, b1, a2, b2]))
        if len(idx) > n_docs or b1 in (a1, a2) or b2 in (a1, a2) or pool[b1].ref_entity == pool[b2].ref_entity:
            continue
        rest = [i for i in range(len(pool)) if i not in idx]
        idx += rng.sample(rest, n_docs - len(idx))
        if not admissible(pool, idx):
            continue
        rng.shuffle(idx)
        for a, b in ((a1, b1), (a2, b2)):
            ia, ib = idx.index(a), idx.index(b)
            if ia > ib:
                idx[ia], idx[ib] = b, a
        docs = [pool[i] for i in idx]
        ok = {idx[j] for j in resolvable(docs)}
        if b1 not in ok or b2 not in ok:
            continue
        value = {d.entity: d.value for d in docs}
        return Query(idx, [QUESTION, CLASS0 + pool[b1].ref_class], [CLASS0 + pool[b2].ref_class],
                     [value[pool[b1].ref_entity], value[pool[b2].ref_entity]])
    raise ValueError(f"no {n_docs} documents of this pool of {len(pool)} make a query with two resolvable "
                     "references, distinct entities and distinct classes")


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
    stages: Tuple[Tuple[int, int, int, int], ...] = ((700, 16, 4, 14), (100, 4, 20, 60), (60, 1, 100, 300))
    lr: float = 4e-3
    warmup: int = 20
    groups: int = 6
    tap: int = 3  # early targets are read out after this many layers
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
    return (value_token, make_doc, resolvable, join, training_docs, training_sequence, batch, train,
            bm.rope, bm.inv_freq, bm._rms, bm._Layer, bm.BlendLM.__init__, bm.BlendLM._qkv,
            bm.BlendLM._finish, bm.BlendLM.logits, bm.BlendLM.forward)


def training_docs(rng: random.Random, lo: int, hi: int) -> List[Doc]:
    """4-6 documents of lo..hi tokens for one training prompt, in prompt order: distinct
    entities and reference classes; each reference after the first document points to
    an entity defined earlier, and not pointed to yet, with probability 0.8 (at
    least two do, when they can), else it is direct (half the time) or points to an
    entity defined later or nowhere. Distinct targets keep "the value most
    references point to" from being a good guess."""
    n = rng.randint(4, 6)
    entities = rng.sample(range(N_ENTITIES), n)
    classes = rng.sample(range(N_CLASSES), n)
    back = set(rng.sample(range(1, n), 2)) | {i for i in range(1, n) if rng.random() < 0.8}
    docs, pointed = [], set()
    for i in range(n):
        free = [e for e in entities[:i] if e not in pointed]
        if i in back and free:
            ref, direct = rng.choice(free), False
        else:
            direct = rng.random() < 0.5
            ref = rng.choice([e for e in range(N_ENTITIES) if e not in (entities if direct else entities[:i + 1])])
        pointed.add(ref)
        docs.append(make_doc(rng, rng.randint(lo, hi), entities[i], classes[i], ref, direct))
    return docs


def training_sequence(rng: random.Random, tc: TrainConfig, lo: int,
                      hi: int) -> Tuple[List[int], List[int], List[int]]:
    """One training prompt with documents of lo..hi tokens, its targets and its early
    targets (-100 where there is no loss).

    Targets are the answers to ``tc.groups`` question pairs. Early targets sit on
    both tokens of every reference that resolves to an earlier document's
    definition: the value it points to, read out after the first ``tc.tap``
    layers. So the document reads the other document at that token, and early
    in the stack — cross-document attention of the kind CacheBlend's check
    layers detect and its recompute restores.
    """
    docs = training_docs(rng, lo, hi)
    tokens = join([d.tokens for d in docs], [])
    targets = [-100] * len(tokens)
    early = [-100] * len(tokens)
    value = {d.entity: d.value for d in docs}
    ok = resolvable(docs)
    answer = {i: docs[i].tokens[docs[i].ref_at] if docs[i].direct else value[docs[i].ref_entity]
              for i in ok + [i for i, d in enumerate(docs) if d.direct]}
    at = 1
    for i, d in enumerate(docs):
        at += 2  # the marker
        if i in ok:
            early[at + d.ref_at] = early[at + d.ref_at + 1] = value[d.ref_entity]
        at += len(d.tokens)
    for _ in range(tc.groups):
        a, b = rng.sample(sorted(answer), 2)
        tokens += [QUESTION, CLASS0 + docs[a].ref_class, answer[a], CLASS0 + docs[b].ref_class, answer[b]]
        targets += [-100, answer[a], -100, answer[b], -100]
    return tokens, targets, early + [-100] * (len(tokens) - len(early))


def batch(rng: random.Random, tc: TrainConfig, stage: Tuple[int, int, int, int]):
    """Tokens, targets and early targets of one training batch ([batch, T] each)."""
    _, size, lo, hi = stage
    seqs = [training_sequence(rng, tc, lo, hi) for _ in range(size)]
    t = max(len(s[0]) for s in seqs)
    x = torch.zeros(len(seqs), t, dtype=torch.long)
    y = torch.full((len(seqs), t), -100, dtype=torch.long)
    y_early = torch.full((len(seqs), t), -100, dtype=torch.long)
    for i, (s, tg, early) in enumerate(seqs):
        x[i, :len(s)] = torch.tensor(s)
        y[i, :len(tg)] = torch.tensor(tg)
        y_early[i, :len(early)] = torch.tensor(early)
    return x, y, y_early


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
        x, y, y_early = batch(rng, tc, stage)
        logits, early = model(x, tap=tc.tap)
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
