"""CacheBlend machinery: segment keys, the daemon as segment store, rotary delta, selective recompute.

These need correctness, not quality, so they use small random-weight models;
quality is measured on the trained model (test_blend_quality.py, docs/blend.md).
"""

import math
import random
from types import SimpleNamespace

import pytest
import torch

from kvtier import blend
from kvtier.blend import Blender, BlendError, BlendSettings, SegmentStore
from kvtier.client import Client
from kvtier.harness.blend_model import BlendLM, BlendModelConfig, inv_freq, rope
from kvtier.harness.blend_task import encode

TOL = 1e-5
MARK = encode(" # # ")
SMALL = BlendModelConfig(vocab_size=384, hidden=32, layers=4, heads=2, head_dim=16, intermediate=64, seed=3)


def doc(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(100, 380) for _ in range(n)]


def prompt(docs, question):
    out = [1]
    for d in docs:
        out += MARK + d
    return out + MARK + question


def settings(**kw):
    base = dict(enable=True, min_tokens=0, check_layers=[1], recompute_ratios=[0.15])
    base.update(kw)
    return BlendSettings(**base)


@pytest.fixture
def blender_for(daemon):
    clients = []

    def make(cfg=SMALL, model_name="blend-test", **kw):
        c = Client(daemon.socket_path)
        clients.append(c)
        store = SegmentStore(c, model_name, namespace=f"ns-{len(clients)}-{random.random()}")
        return Blender(BlendLM(cfg), store, settings(**kw), encode)

    yield make
    for c in clients:
        c.close()


# ----- segments and keys -----------------------------------------------------


def test_split_drops_markers_and_keeps_positions():
    d1, d2 = doc(1, 20), doc(2, 7)
    p = prompt([d1, d2], [3, 200])
    segs = blend.split(p, MARK)
    assert [list(s.tokens) for s in segs] == [[1], d1, d2, [3, 200]]
    for s in segs:
        assert p[s.start:s.end] == list(s.tokens)


def test_segment_keys_do_not_depend_on_position():
    d = doc(5, 70)
    a = blend.split(prompt([doc(6, 40), d], [3]), MARK)[2]
    b = blend.split(prompt([d, doc(7, 33), doc(8, 9)], [3]), MARK)[1]
    assert a.tokens == b.tokens and a.start != b.start
    ka, kb = blend.segment_keys(a.tokens, 16, "m"), blend.segment_keys(b.tokens, 16, "m")
    assert ka == kb and len(ka) == 5  # 70 tokens: four whole chunks and a short one
    assert blend.segment_keys(d, 16, "other-model") != ka
    assert blend.segment_keys(d, 16, "m", extra=("lora=x",)) != ka
    assert blend.segment_keys(d[:-1] + [d[-1] ^ 1], 16, "m")[-1] != ka[-1]
    assert blend.segment_keys(d[:-1] + [d[-1] ^ 1], 16, "m")[:-1] == ka[:-1]


def test_marker_absent_is_refused():
    with pytest.raises(BlendError, match="does not occur in the prompt"):
        blend.split([1, 5, 6, 7], MARK)


# ----- rotary delta ----------------------------------------------------------


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_delta_rotation_equals_rotation_at_new_position(style):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, 32, generator=g)
    freqs = inv_freq(32, 10000.0)
    pos = torch.arange(300)
    for delta in (1, 17, 1234, 5000):
        stored = rope(x, pos, freqs, style)
        moved = blend.rotate_keys_(stored.clone(), delta, freqs, style)
        want = rope(x, pos + delta, freqs, style)
        assert (moved - want).abs().max().item() <= TOL, (style, delta)
    # The two pairings really differ, so each test checks its own.
    assert (rope(x, pos, freqs, "neox") - rope(x, pos, freqs, "gptj")).abs().max() > 0.1


def partial_rope(x, pos, freqs, style, rdim):
    """Reference partial rotary embedding: rotate the first rdim dims, pass the rest."""
    return torch.cat((rope(x[..., :rdim], pos, freqs, style), x[..., rdim:]), dim=-1)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rdim", [8, 16, 24])
def test_delta_rotation_with_partial_rotary_dim(style, rdim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 4, 32, generator=g)
    freqs = inv_freq(rdim, 10000.0)
    pos = torch.arange(300)
    for delta in (1, 17, 1234, 5000):
        stored = partial_rope(x, pos, freqs, style, rdim)
        moved = blend.rotate_keys_(stored.clone(), delta, freqs, style, rotary_dim=rdim)
        want = partial_rope(x, pos + delta, freqs, style, rdim)
        assert (moved - want).abs().max().item() <= TOL, (style, rdim, delta)
        assert torch.equal(moved[..., rdim:], x[..., rdim:])  # the unrotated part is untouched
    # Rotating the whole head instead would be wrong, so the test can tell.
    whole = blend.rotate_keys_(partial_rope(x, pos, freqs, style, rdim), 17, inv_freq(32, 10000.0), style)
    assert (whole - partial_rope(x, pos + 17, freqs, style, rdim)).abs().max() > 0.1


def test_bad_rotary_dim_is_refused():
    keys = torch.zeros(2, 1, 16)
    for bad in (0, 3, 18, -2, True):
        with pytest.raises(BlendError, match="rotary_dim"):
            blend.rotate_keys_(keys, 3, inv_freq(8, 1e4), "neox", rotary_dim=bad)
    with pytest.raises(BlendError, match="4 rotary frequencies for rotary_dim 16: want 8"):
        blend.rotate_keys_(keys, 3, inv_freq(8, 1e4), "neox", rotary_dim=16)


def test_unsupported_position_scheme_is_refused(daemon):
    with pytest.raises(BlendError, match="position scheme 'alibi' is not supported"):
        blend.rotate_keys_(torch.zeros(2, 1, 4), 3, inv_freq(4, 1e4), "alibi")
    with Client(daemon.socket_path) as c:
        model = SimpleNamespace(cfg=SimpleNamespace(rope_style="alibi", layers=4, heads=2, head_dim=16))
        with pytest.raises(BlendError, match="position scheme 'alibi'"):
            Blender(model, SegmentStore(c, "m"), settings(), encode)
    with pytest.raises(ValueError, match="unsupported rotary style"):
        BlendLM(BlendModelConfig(rope_style="mrope"))


# ----- the daemon as segment store --------------------------------------------


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_document_hits_after_reordering(blender_for, style):
    cfg = BlendModelConfig(**{**SMALL.to_dict(), "rope_style": style})
    b = blender_for(cfg)
    d1, d2, d3 = doc(11, 45), doc(12, 16), doc(13, 33)
    first = b.prefill(prompt([d1, d2, d3], [3, 210, 220]))
    assert (first.hit_segments, first.missed_segments) == (0, 5)
    for d in (d1, d2, d3):
        assert b.store.contains(d)
    p = prompt([d3, d1, d2], [3, 230])
    second = b.prefill(p, ratio=0.0)
    assert (second.hit_segments, second.missed_segments) == (4, 1)  # start, three documents; not the question
    # Layer 0's keys depend only on the token and its position, so the loaded,
    # rotated keys must equal a full prefill's wherever they were reused.
    _, full_kv = b.model.prefill(p)
    for s in blend.split(p, MARK)[:-1]:
        got, want = second.kv[0][0][s.start:s.end], full_kv[0][0][s.start:s.end]
        assert (got - want).abs().max().item() <= TOL
    assert not second.recomputed[blend.split(p, MARK)[2].start:].all()  # r=0 reused document tokens


def test_loaded_bytes_are_the_stored_bytes(blender_for):
    b = blender_for()
    d = doc(21, 50)
    kv = b.segment_kv(d)
    assert b.store.store(d, kv) == 4
    got = b.store.load(d, b.shape, torch.float32)
    assert torch.equal(got, kv)
    assert b.store.load(doc(22, 50), b.shape, torch.float32) is None


# ----- selective recompute -------------------------------------------------


def test_full_ratio_equals_full_prefill(blender_for):
    b = blender_for(check_layers=[1, 2], recompute_ratios=[1.0, 1.0])
    docs = [doc(31, 60), doc(32, 25), doc(33, 40)]
    b.prefill(prompt(docs, [3, 250]))
    p = prompt(docs[::-1], [3, 251, 252])
    res = b.prefill(p, ratio=1.0)
    assert res.hit_segments == 4
    want, want_kv = b.model.prefill(p)
    assert (res.logits - want).abs().max().item() <= TOL
    for (k, v), (wk, wv) in zip(res.kv, want_kv):
        assert (k - wk).abs().max().item() <= TOL and (v - wv).abs().max().item() <= TOL
    assert res.recomputed.all()


def test_ratio_selects_that_share_of_reused_tokens(blender_for):
    b = blender_for(check_layers=[2])
    docs = [doc(41, 64), doc(42, 36)]
    b.prefill(prompt(docs, [3, 5]))
    p = prompt(docs[::-1], [3, 6])
    want, _ = b.model.prefill(p)
    reused = 1 + 64 + 36
    fresh = len(p) - reused
    errs = {}
    for r in (0.0, 0.1, 0.5):
        res = b.prefill(p, ratio=r)
        assert int(res.recomputed.sum()) == fresh + math.ceil(r * reused - 1e-9)
        errs[r] = (res.logits - want).abs().max().item()
    assert errs[0.0] > 1e-4  # reuse without recompute really changes the logits on this model


def test_bad_settings_get_clear_errors(blender_for):
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(BlendError, match=r"outside \[0, 1\]"):
            settings(recompute_ratios=[bad])
    with pytest.raises(BlendError, match="not supported"):
        settings(thresholds=[0.5])
    with pytest.raises(BlendError, match="one per check layer"):
        settings(check_layers=[1, 2, 3], recompute_ratios=[0.1, 0.2])
    with pytest.raises(BlendError, match="not a layer index"):
        blender_for(check_layers=[4])
    with pytest.raises(BlendError, match="enable_blending is off"):
        Blender(BlendLM(SMALL), None, BlendSettings(), encode)
    b = blender_for()
    with pytest.raises(BlendError, match=r"request recompute ratio: 2 is outside \[0, 1\]"):
        b.prefill(prompt([doc(1, 5)], [3]), ratio=2)
    with pytest.raises(BlendError, match="does not occur"):
        b.prefill(doc(2, 40))


def test_settings_from_lmcache_keys():
    s = BlendSettings.from_lmcache({"enable_blending": True, "blend_special_str": " ## ",
                                    "blend_recompute_ratios": [0.25], "blend_check_layers": [2],
                                    "blend_min_tokens": 32, "chunk_size": 256})
    assert (s.enable, s.special_str, list(s.recompute_ratios), list(s.check_layers), s.min_tokens) == \
        (True, " ## ", [0.25], [2], 32)
    d = BlendSettings.from_lmcache({})
    assert (d.enable, d.special_str, list(d.recompute_ratios), list(d.check_layers)) == \
        (False, " # # ", [0.15], [1])


def test_evaluation_command_pieces(daemon):
    """The measurement loop on a small random model: every ratio gets a row, and r=100% adds no error."""
    from kvtier.harness import blend_eval, blend_task
    model = BlendLM(SMALL)
    pool, queries = blend_task.workload(blend_task.Workload(queries=3, pool=16, doc_min=30, doc_max=60))
    with Client(daemon.socket_path) as c:
        store = SegmentStore(c, "blend-eval-test", namespace=str(random.random()))
        b = Blender(model, store, settings(), encode)
        for seg in [[blend_task.BOS]] + [d.tokens for d in pool]:
            store.store(seg, b.segment_kv(seg))
        res = blend_eval.evaluate(model, queries, pool, b, [0, 15, 100], log=lambda s: None)
    assert sorted(res["rows"]) == [0, 15, 100]
    assert res["rows"][100]["max_logit_err"] <= TOL and res["rows"][100]["agree"] == 1.0
    assert res["rows"][0]["max_logit_err"] > TOL
    text = blend_eval.table(res, [1])
    assert "| 15% |" in text and "full prefill task accuracy" in text
    cells = {line.split("|")[1].strip(): line.split("|")[4].strip() for line in text.splitlines()
             if line.startswith("| ") and "%" in line.split("|")[1]}
    assert cells["0%"] == "1.000"  # KL relative to r = 0%
    assert cells["15%"] == f"{res['rows'][15]['kl'] / res['rows'][0]['kl']:.3f}"


def test_deviation_measures():
    m = BlendLM(SMALL)
    k, v = torch.zeros(3, 2, 16), torch.zeros(3, 2, 16)
    lk, lv = k.clone(), v.clone()
    lk[0, 0, 0] = 2.0  # token 0: key off by 2 in head 0
    lv[1, 1, 0] = 1.0  # token 1: value off by 1 in head 1
    v[2, 0] = 10.0  # token 2: value off by 1 in head 0, whose fresh values are large
    lv[2, 0] = 10.0
    lv[2, 0, 0] = 9.0
    want = {"k": [4, 0, 0], "v": [0, 1, 1], "kv": [4, 1, 1]}
    for mode, dev in want.items():
        m.selection = mode
        assert m.deviation(k, v, lk, lv).tolist() == dev
    # Normalised per head: head 1's fresh values are all zero (the floor
    # applies), head 0's mean squared norm is 1600/3, so token 2 counts less.
    m.selection = "v-norm"
    d = m.deviation(k, v, lk, lv)
    assert d[1] > 1e6 and d[2] == pytest.approx(3 / 1600)
    m.selection = "q"
    with pytest.raises(ValueError, match="unknown deviation measure 'q'"):
        m.deviation(k, v, lk, lv)



def test_workload_answer_depends_on_another_document():
    """Each query asks a class held by one document of the prompt, whose mark another
    document holds; the answer is written marked (u..) exactly when a mark of that class
    comes earlier, and about half the answers are marked."""
    from kvtier.harness import blend_task as bt
    pool, queries = bt.workload(bt.Workload(queries=60))
    assert all(300 <= len(d.tokens) <= 1000 for d in pool)
    assert len({d.value for d in pool}) == len(pool)
    assert all(d.mark != bt.value_class(d.value) for d in pool)
    marked = 0
    for q in queries:
        assert 4 <= len(q.docs) <= 6 and len(set(q.docs)) == len(q.docs) and q.follow == []
        docs = [pool[i] for i in q.docs]
        cls = q.question[-1]
        assert len({bt.value_class(d.value) for d in docs}) == len(docs)
        (j,) = [j for j, d in enumerate(docs) if bt.value_class(d.value) == cls]
        earlier = any(d.mark == cls for d in docs[:j])
        assert any(d.mark == cls for d in docs[:j] + docs[j + 1:])
        assert q.answer == [bt.answer_token(docs[j].value, earlier)]
        assert docs[j].tokens[docs[j].value_at] == docs[j].value
        marked += earlier
    assert 0.3 < marked / len(queries) < 0.7


def test_training_forward_taps_early_layers():
    m = BlendLM(SMALL)
    x = torch.tensor([doc(1, 12)])
    full = m(x)
    logits, early = m(x, tap=2)
    assert torch.equal(full, logits)
    # The early read-out equals a model cut after two layers.
    cut = BlendLM(SMALL)
    cut.load_state_dict(m.state_dict())
    cut.layers = cut.layers[:2]
    assert torch.allclose(early, cut(x), atol=1e-6)
