"""The SGLang HiCache backend: its interface, and prefills through the SGLang-like flow.

Every storing test reads the bytes back and compares them: a page that is
"found" but holds another rank's or another layout's bytes must fail here.
"""

import hashlib

import pytest
import torch

from kvtier._sglang_compat import PoolHitPolicy, PoolName, PoolTransfer
from kvtier.harness.sglang_flow import LAYOUTS, HostPool, StatePool
from kvtier.sglang import page_key, rank_scope
from harness_util import MODEL, assert_close, prompt, reference
from sglang_util import backend, engine_prefill, sglang_prefill
from test_vllm import _run

PAGE = 4


def _hex(i):
    return hashlib.sha256(str(i).encode()).hexdigest()


def _keys(tag, n):
    return [_hex(f"{tag}-{i}") for i in range(n)]


def _pool(layout="layer_first", mla=False, seed=None, pages=6, dtype=torch.float16):
    """A small host pool; with a seed, filled with distinct random values."""
    pool = HostPool(layers=3, heads=1 if mla else 2, head_dim=8, dtype=dtype, size=pages * PAGE, page_size=PAGE,
                    layout_name=layout, mla=mla)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        pool.kv_buffer.copy_(torch.randn(pool.kv_buffer.shape, generator=g).to(dtype))
    return pool


def _idx(*pages):
    """Host indices of whole pages, one per token, as SGLang passes them."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def _page_bytes(pool, page):
    return pool.get_data_page(page * PAGE).contiguous().view(torch.uint8).clone()


# ----- the basic interface


def test_set_get_exists_round_trip(daemon):
    b = backend(daemon.socket_path, "sglang-basic")
    pages = [torch.arange(12, dtype=torch.float32) + 100 * i for i in range(3)]
    keys = [_hex(i + 1) for i in range(3)]
    assert not b.exists(keys[0]) and b.get(keys[0]) is None
    assert b.set(keys[0], pages[0])
    assert b.batch_set(keys[1:], pages[1:])
    assert b.batch_exists(keys + [_hex(99)]) == 3
    assert b.batch_exists([_hex(99)] + keys) == 0  # consecutive hits from the start only
    target = torch.zeros(12)
    assert b.get(keys[1], target) is target and torch.equal(target, pages[1])
    got = b.batch_get(keys)
    assert all(g is not None for g in got)
    assert all(torch.equal(g.view(torch.float32), want) for g, want in zip(got, pages))


def test_page_key_uses_the_digest_prefix():
    digest = "ab" * 32
    assert page_key(digest) == bytes.fromhex("ab" * 16)
    assert len(page_key("not hex at all")) == 16 and page_key("x") != page_key("y")


# ----- host layouts


@pytest.mark.parametrize("layout,mla", [(name, False) for name in LAYOUTS] +
                         [(name, True) for name in LAYOUTS if name != "page_head"])
def test_layout_pages_round_trip_bytes(daemon, layout, mla):
    """Zero-copy and generic set, then get into other host pages of a fresh pool: the same bytes."""
    src = _pool(layout, mla, seed=1)
    b = backend(daemon.socket_path, f"sglang-layout-{layout}-{mla}", ranks={"is_mla_model": mla})
    b.register_mem_pool_host(src)
    keys = _keys(f"v1-{layout}-{mla}", 2)
    assert b.batch_set_v1(keys, _idx(1, 3)) == [True, True]
    generic = _keys(f"generic-{layout}-{mla}", 2)
    assert b.batch_set(generic, [src.get_data_page(p * PAGE) for p in (0, 2)])

    dst = _pool(layout, mla)
    reader = backend(daemon.socket_path, f"sglang-layout-{layout}-{mla}", ranks={"is_mla_model": mla})
    reader.register_mem_pool_host(dst)
    assert reader.batch_exists(keys + generic) == 4
    assert reader.batch_get_v1(keys, _idx(4, 0)) == [True, True]
    assert torch.equal(_page_bytes(dst, 4), _page_bytes(src, 1))
    assert torch.equal(_page_bytes(dst, 0), _page_bytes(src, 3))
    got = reader.batch_get(generic, [dst.get_dummy_flat_data_page() for _ in generic])
    for page, g in zip((0, 2), got):
        dst.set_from_flat_data_page(5 * PAGE, g)
        assert torch.equal(_page_bytes(dst, 5), _page_bytes(src, page))
    b.close(), reader.close()


def test_layouts_with_the_same_page_bytes_share_and_others_do_not(daemon):
    src = _pool("layer_first", seed=2)
    b = backend(daemon.socket_path, "sglang-cross-layout")
    b.register_mem_pool_host(src)
    keys = _keys("cross", 2)
    assert b.batch_set_v1(keys, _idx(0, 1)) == [True, True]

    direct = _pool("page_first_direct")
    d = backend(daemon.socket_path, "sglang-cross-layout")
    d.register_mem_pool_host(direct)
    assert d.batch_get_v1(keys, _idx(2, 3)) == [True, True]  # the same [2, L, page, H, D] bytes
    assert torch.equal(_page_bytes(direct, 2), _page_bytes(src, 0))
    assert torch.equal(direct.layer_pages(1)[:, 3], src.layer_pages(1)[:, 1])

    for other in ("page_first", "page_head"):
        o, pool = backend(daemon.socket_path, "sglang-cross-layout"), _pool(other)
        o.register_mem_pool_host(pool)
        assert o.batch_exists(keys) == 0, other  # another byte order: another scope
        assert o.batch_get_v1(keys, _idx(0, 1)) == [False, False]
        assert not pool.kv_buffer.any()
        o.close()
    b.close(), d.close()


@pytest.mark.parametrize("layout,mla", [("page_first_kv_split", False), ("page_first_kv_split", True),
                                        ("page_head", True), ("some_future_layout", False)])
def test_unsupported_layouts_are_refused_at_setup(daemon, layout, mla):
    b = backend(daemon.socket_path, "sglang-refused", ranks={"is_mla_model": mla})
    pool = _pool()
    pool.layout = layout
    with pytest.raises(ValueError, match=layout):
        b.register_mem_pool_host(pool)
    if not mla:  # auxiliary pools are not MLA-shaped: page_head is a layout they may have
        with pytest.raises(ValueError, match=layout):
            b.register_mem_host_pool_v2(pool, PoolName.SWA)
    b.close()


def test_page_first_flag_is_honoured_before_the_pool_is_registered(daemon):
    keys = _keys("flag", 1)
    flagged = backend(daemon.socket_path, "sglang-flag", ranks={"is_page_first_layout": True})
    plain = backend(daemon.socket_path, "sglang-flag")
    page = torch.arange(8, dtype=torch.float16)
    assert flagged.set(keys[0], page)
    assert plain.batch_exists(keys) == 0 and plain.get(keys[0], torch.zeros(8, dtype=torch.float16)) is None
    got = torch.zeros(8, dtype=torch.float16)
    assert flagged.get(keys[0], got) is got and torch.equal(got, page)
    flagged.close(), plain.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefill_through_each_host_layout_matches_full_prefill(daemon, layout):
    p = prompt(40, 16 * 3 + 7)
    ref = reference(p)
    logits, loaded = sglang_prefill(daemon.socket_path, f"sglang-flow-{layout}", p, host_layout=layout)
    assert loaded == 0
    assert_close(logits, ref)
    logits, loaded = sglang_prefill(daemon.socket_path, f"sglang-flow-{layout}", p, host_layout=layout)
    assert loaded == 48
    assert_close(logits, ref)


# ----- the SGLang-like flow


def test_prefill_through_the_backend_matches_full_prefill(daemon):
    p = prompt(30, 16 * 4 + 5)
    ref = reference(p)
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-flow", p)
    assert loaded == 0
    assert_close(logits, ref)
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-flow", p)
    assert loaded == 64
    assert_close(logits, ref)
    q = p[:16] + prompt(31, 30)  # shares one page
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-flow", q)
    assert loaded == 16
    assert_close(logits, reference(q))


def test_generic_path_without_interface_v1_interoperates_with_zero_copy(daemon):
    p = prompt(32, 16 * 3 + 2)
    _, loaded = sglang_prefill(daemon.socket_path, "sglang-generic", p, interface_v1=False)
    assert loaded == 0
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-generic", p)  # zero-copy reads them
    assert loaded == 48
    assert_close(logits, reference(p))
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-generic", p, interface_v1=False)
    assert loaded == 48
    assert_close(logits, reference(p))


def test_sglang_across_processes(daemon):
    first = _run(["sglang", daemon.socket_path, "sglang-procs", "kv_first", "32", "50"])
    second = _run(["sglang", daemon.socket_path, "sglang-procs", "kv_first", "32", "50"])
    assert (first["external"], second["external"]) == (0, 48)
    assert first["diff"] <= 1e-5 and second["diff"] <= 1e-5


# ----- rank scoping


def _store_and_read(daemon, model, a_ranks, b_ranks, tag):
    """Rank a stores page bytes A; rank b, same key: does it see A? Then b stores B; each reads its own."""
    a, b = (backend(daemon.socket_path, model, ranks=r) for r in (a_ranks, b_ranks))
    mla = bool(a_ranks.get("is_mla_model"))
    pa, pb = _pool(mla=mla, seed=10), _pool(mla=mla, seed=11)
    a.register_mem_pool_host(pa)
    b.register_mem_pool_host(pb)
    keys = _keys(tag, 1)
    assert a.batch_set_v1(keys, _idx(0)) == [True]
    shared = b.batch_exists(keys) == 1
    if shared:
        assert b.batch_get_v1(keys, _idx(2)) == [True]
        assert torch.equal(_page_bytes(pb, 2), _page_bytes(pa, 0))
    else:
        assert b.batch_set_v1(keys, _idx(1)) == [True]
        for backend_, pool in ((a, pa), (b, pb)):
            pool.set_from_flat_data_page(3 * PAGE, pool.get_dummy_flat_data_page())
            assert backend_.batch_get_v1(keys, _idx(3)) == [True]
        assert torch.equal(_page_bytes(pa, 3), _page_bytes(pa, 0))
        assert torch.equal(_page_bytes(pb, 3), _page_bytes(pb, 1))
    a.close(), b.close()
    return shared


@pytest.mark.parametrize("what,a,b", [
    ("pp", {"pp_size": 2, "pp_rank": 0}, {"pp_size": 2, "pp_rank": 1}),
    ("attn_cp", {"attn_cp_size": 2, "attn_cp_rank": 0}, {"attn_cp_size": 2, "attn_cp_rank": 1}),
    ("tp", {"tp_size": 2, "tp_rank": 0}, {"tp_size": 2, "tp_rank": 1}),
    ("pp-under-mla", {"pp_size": 2, "pp_rank": 0, "is_mla_model": True},
     {"pp_size": 2, "pp_rank": 1, "is_mla_model": True}),
    ("cp-under-mla", {"attn_cp_size": 2, "attn_cp_rank": 0, "is_mla_model": True},
     {"attn_cp_size": 2, "attn_cp_rank": 1, "is_mla_model": True}),
    ("tp2-vs-pp2", {"tp_size": 2, "tp_rank": 1}, {"pp_size": 2, "pp_rank": 1}),
])
def test_ranks_holding_different_pages_do_not_share(daemon, what, a, b):
    assert not _store_and_read(daemon, f"sglang-ranks-{what}", a, b, what)


@pytest.mark.parametrize("what,a,b", [
    ("attn_dp", {"dp_size": 2, "dp_rank": 0, "tp_size": 2, "tp_rank": 1},
     {"dp_size": 2, "dp_rank": 1, "tp_size": 2, "tp_rank": 1}),
    ("tp-under-mla", {"tp_size": 2, "tp_rank": 0, "is_mla_model": True},
     {"tp_size": 2, "tp_rank": 1, "is_mla_model": True}),
])
def test_ranks_holding_the_same_pages_share(daemon, what, a, b):
    assert _store_and_read(daemon, f"sglang-ranks-{what}", a, b, what)


def test_rank_scope_folds_exactly_the_separating_ranks():
    class Cfg:
        tp_size, tp_rank, pp_size, pp_rank, attn_cp_size, attn_cp_rank, dp_size, dp_rank = 4, 3, 2, 1, 2, 1, 8, 5

    s = rank_scope(Cfg, replicated=False)
    assert (s.world, s.rank) == (16, (1 * 2 + 1) * 4 + 3) and s.shape == "pp2.cp2.tp4"
    assert rank_scope(Cfg, replicated=True).world == 4
    Cfg.pp_rank = 2
    with pytest.raises(ValueError, match="pp_rank"):
        rank_scope(Cfg, replicated=False)


def test_pipeline_stages_do_not_load_each_others_pages_in_the_flow(daemon):
    p = prompt(34, 16 * 3 + 3)
    stage = lambda r: {"pp_size": 2, "pp_rank": r}  # noqa: E731
    assert sglang_prefill(daemon.socket_path, "sglang-pp-flow", p, ranks=stage(0))[1] == 0
    assert sglang_prefill(daemon.socket_path, "sglang-pp-flow", p, ranks=stage(1))[1] == 0
    logits, loaded = sglang_prefill(daemon.socket_path, "sglang-pp-flow", p, ranks=stage(1))
    assert loaded == 48
    assert_close(logits, reference(p))


# ----- hybrid models (v2)


def _states(seed, slots=6):
    pool = StatePool(layers=3, head_dim=8, slots=slots)
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


def _hybrid(daemon, model, kv, states, indexer=None, ranks=None):
    b = backend(daemon.socket_path, model, ranks=ranks)
    b.register_mem_pool_host(kv)
    b.register_mem_host_pool_v2(kv, PoolName.KV)
    b.register_mem_host_pool_v2(states, PoolName.MAMBA)
    if indexer is not None:
        b.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
    return b


def test_v2_set_and_get_move_every_pools_bytes(daemon):
    kv, states, indexer = _pool(seed=20), _states(21), _pool("page_first", seed=22)
    b = _hybrid(daemon, "sglang-v2-bytes", kv, states, indexer)
    keys = _keys("v2", 2)
    put = [PoolTransfer(PoolName.KV, host_indices=_idx(0, 1), keys=keys),
           PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([4, 5]), keys=keys),
           PoolTransfer(PoolName.INDEXER, host_indices=_idx(2, 3), keys=keys,
                        indices_from_pool=PoolName.KV)]
    assert b.batch_set_v2(put) == {PoolName.KV: [True, True], PoolName.MAMBA: [True, True],
                                   PoolName.INDEXER: [True, True]}

    kv2, states2, indexer2 = _pool(), StatePool(layers=3, head_dim=8, slots=6), _pool("page_first")
    r = _hybrid(daemon, "sglang-v2-bytes", kv2, states2, indexer2)
    get = [PoolTransfer(PoolName.KV, host_indices=_idx(5, 4), keys=keys),
           PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0, 1]), keys=keys),
           PoolTransfer(PoolName.INDEXER, host_indices=_idx(0, 1), keys=keys)]
    assert r.batch_get_v2(get) == {PoolName.KV: [True, True], PoolName.MAMBA: [True, True],
                                   PoolName.INDEXER: [True, True]}
    assert torch.equal(_page_bytes(kv2, 5), _page_bytes(kv, 0)) and torch.equal(_page_bytes(kv2, 4), _page_bytes(kv, 1))
    assert torch.equal(states2.buffer[0], states.buffer[4]) and torch.equal(states2.buffer[1], states.buffer[5])
    assert torch.equal(_page_bytes(indexer2, 0), _page_bytes(indexer, 2))
    # the pools are separate scopes: the same key holds each pool's own page
    assert not torch.equal(_page_bytes(indexer2, 0), _page_bytes(kv2, 5))
    # wrong index counts and unregistered pools fail per page instead of raising
    bad = r.batch_get_v2([PoolTransfer(PoolName.KV, host_indices=_idx(0)[:-1], keys=keys[:1]),
                          PoolTransfer(PoolName.SWA, host_indices=_idx(0), keys=keys[:1])])
    assert bad == {PoolName.KV: [False], PoolName.SWA: [False]}
    b.close(), r.close()


def test_batch_exists_v2_applies_each_pools_hit_policy(daemon):
    kv, states, indexer = _pool(seed=30), _states(31), _pool("page_first", seed=32)
    b = _hybrid(daemon, "sglang-v2-policy", kv, states, indexer)
    keys = _keys("policy", 5)
    assert b.batch_set_v1(keys[:4], _idx(0, 1, 2, 3)) == [True] * 4  # KV: pages 0-3
    states_at = [keys[0], keys[2]]  # states after pages 0 and 2 only
    b.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0, 1]), keys=states_at),
                    PoolTransfer(PoolName.INDEXER, host_indices=_idx(0, 1), keys=keys[:2])])

    def usable(*transfers):
        res = b.batch_exists_v2(keys, list(transfers))
        return res.kv_hit_pages, {str(k): v for k, v in res.extra_pool_hit_pages.items()}

    trailing = lambda n: PoolTransfer(PoolName.MAMBA, keys=keys[:n], hit_policy=PoolHitPolicy.TRAILING_PAGES)  # noqa: E731
    every = PoolTransfer(PoolName.INDEXER, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)
    assert usable() == (4, {"kv": 4})
    assert usable(trailing(1)) == (3, {"kv": 4, "mamba": 3})  # the state after page 2 ends a usable prefix
    assert usable(trailing(2)) == (1, {"kv": 4, "mamba": 1})  # no two consecutive states but page 0's
    assert usable(every) == (2, {"kv": 4, "indexer": 2})
    assert usable(trailing(1), every) == (2, {"kv": 4, "mamba": 3, "indexer": 2})
    unregistered = PoolTransfer(PoolName.SWA, keys=keys)
    assert usable(unregistered) == (0, {"kv": 4})
    b.close()


def test_hybrid_prefill_loads_kv_and_its_state_through_v2(daemon):
    p = prompt(36, 16 * 4 + 9)
    ref = reference(p)
    logits, loaded, eng = engine_prefill(daemon.socket_path, "sglang-hybrid", p, hybrid=True)
    assert loaded == 0 and eng.state_loads == []
    assert_close(logits, ref)
    logits, loaded, eng = engine_prefill(daemon.socket_path, "sglang-hybrid", p, hybrid=True,
                                         host_layout="page_first")
    assert loaded == 0  # page_first KV is another scope: nothing to resume from
    logits, loaded, eng = engine_prefill(daemon.socket_path, "sglang-hybrid", p, hybrid=True)
    assert loaded == 64 and eng.state_loads == [True]
    assert_close(logits, ref)
    q = p[:32] + prompt(37, 20)
    logits, loaded, eng = engine_prefill(daemon.socket_path, "sglang-hybrid", q, hybrid=True)
    assert loaded == 32 and eng.state_loads == [True]  # the state after page 1, not page 3
    assert_close(logits, reference(q))


def test_mla_shares_kv_over_tp_but_not_mamba_state(daemon):
    mla = lambda r: {"is_mla_model": True, "tp_size": 2, "tp_rank": r}  # noqa: E731
    kv0, st0 = _pool(mla=True, seed=40), _states(41)
    kv1, st1 = _pool(mla=True), _states(42)
    r0 = _hybrid(daemon, "sglang-mla-mamba", kv0, st0, ranks=mla(0))
    r1 = _hybrid(daemon, "sglang-mla-mamba", kv1, st1, ranks=mla(1))
    keys = _keys("mla-mamba", 1)
    assert r0.batch_set_v2([PoolTransfer(PoolName.KV, host_indices=_idx(0), keys=keys),
                            PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0]), keys=keys)]) == \
        {PoolName.KV: [True], PoolName.MAMBA: [True]}
    got = r1.batch_get_v2([PoolTransfer(PoolName.KV, host_indices=_idx(1), keys=keys),
                           PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([1]), keys=keys)])
    assert got == {PoolName.KV: [True], PoolName.MAMBA: [False]}  # rank 0's KV, never rank 0's state
    assert torch.equal(_page_bytes(kv1, 1), _page_bytes(kv0, 0))
    assert not torch.equal(st1.buffer[1], st0.buffer[0])
    r0.close(), r1.close()


# ----- metrics and failures


def test_get_stats_reports_what_sglangs_metrics_collector_reads(daemon):
    b = backend(daemon.socket_path, "sglang-stats", ranks={"enable_storage_metrics": True})
    pool = _pool(seed=50)
    b.register_mem_pool_host(pool)
    keys = _keys("stats", 3)
    assert b.batch_set_v1(keys, _idx(0, 1, 2)) == [True] * 3
    assert b.batch_get_v1(keys[:2], _idx(3, 4)) == [True, True]
    m = b.get_stats()
    assert type(m).__name__ == "StorageMetrics"
    assert (m.backup_pgs, m.prefetch_pgs) == ([3], [2])
    assert all(v > 0 for v in m.backup_bandwidth + m.prefetch_bandwidth)
    assert b.get_stats().backup_pgs == []  # drained
    assert isinstance(b.daemon_stats(), dict)
    b.close()



def test_dead_daemon_reads_as_misses(own_daemon):
    p = prompt(33, 40)
    b = backend(own_daemon.socket_path, "sglang-dead")
    sglang_prefill(own_daemon.socket_path, "sglang-dead", p)
    own_daemon.kill()
    assert b.batch_exists(["00" * 32]) == 0
    assert b.set(_hex(1), torch.zeros(4)) is False
    assert b.get(_hex(1)) is None
    logits, loaded = sglang_prefill(own_daemon.socket_path, "sglang-dead", p)
    assert loaded == 0
    assert_close(logits, reference(p))
    own_daemon.start()
    assert b.set(_hex(1), torch.ones(4))  # reconnected
    assert b.exists(_hex(1))
