"""The vLLM connector against current upstream shapes, bytes checked after save and re-load.

The harness (kvtier.harness.engine) follows vLLM main of November 2026:
preemption with resumed_req_ids (and the older resumed_from_preemption),
None block lists, LoRA / salt / multimodal extra keys, prompt embeddings,
publishable blocks, asynchronous loads, packed / standardized / cross-layer
/ MLA layouts. Every load is checked twice: logits against a plain full
prefill, and the loaded KV bytes against the bytes the saving engine held.
"""

import inspect
import json
import os
import time

import pytest
import torch

from kvtier import vllm_kv
from kvtier import vllm as kv_vllm
from kvtier.harness import vllm_hash
from kvtier.harness.engine import Engine, KVTransferConfig, Status
from harness_util import MLA_MODEL, MODEL, assert_close, engine, prompt, reference

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")


def loaded_equal_saved(loader, load_id, saver, save_id, tokens):
    """The first ``tokens`` tokens' KV in the loader equal, bit for bit, what the saver held."""
    got = loader.kv_snapshots[load_id][:, :tokens]
    want = saver.kv_snapshots[save_id][:, :tokens]
    assert got.shape == want.shape and got.numel() > 0
    assert torch.equal(got, want), "loaded KV bytes differ from the saved ones"


def external(eng, req_id):
    return sum(s.external_tokens for s in eng.steps if s.req_id == req_id)


# ------------------------------------------------------------- preemption


@pytest.mark.parametrize("legacy", [False, True])
def test_preempted_request_resumes_into_its_new_blocks(daemon, legacy):
    """Chunked prefill, preemption, resume with new blocks and a kvtier hit: no wrong KV anywhere.

    B decodes while A prefills in 32-token steps; when the pool runs out A
    (the newest) is preempted after 64 tokens (4 chunks saved), B's decode
    then overwrites A's old blocks, and A resumes with new blocks, loading
    its 64 tokens back. A's logits must match a full prefill, and a third
    engine loading A's prompt must get exactly the bytes A held.
    """
    model = f"preempt-{legacy}"
    pa, pb = prompt(40, 96), prompt(41, 32)
    e = engine(daemon.socket_path, model, num_blocks=14, token_budget=33, prefix_caching=False,
               legacy_preemption=legacy)
    b = e.add_request(pb, "B", max_tokens=60)
    a = e.add_request(pa, "A")
    e.run()
    assert a.num_preemptions == 1 and b.status == Status.FINISHED
    resumed = [s for s in e.steps if s.req_id == "A" and s.resumed]
    assert resumed and resumed[0].external_tokens == 64, resumed
    assert_close(a.logits[0], reference(pa))

    later = engine(daemon.socket_path, model, prefix_caching=False)
    got = later.prefill(pa, "C")
    assert external(later, "C") == 80
    assert_close(got, reference(pa))
    loaded_equal_saved(later, "C", e, "A", 80)


def test_cached_request_with_no_new_blocks(daemon):
    """new_block_ids entries may be None (no block this step): the request keeps its blocks."""
    p = prompt(42, 40)
    e = engine(daemon.socket_path, "none-blocks", token_budget=8, prefix_caching=False)
    r = e.add_request(p, max_tokens=3)
    e.run()
    assert r.status == Status.FINISHED and len(r.logits) == 3
    assert_close(r.logits[0], reference(p))


# ---------------------------------------------------------------- layouts

LAYOUTS = [vllm_kv.BLOCK_FIRST, vllm_kv.KV_FIRST, vllm_kv.PACKED, "LBNHC", "LBHNC", "LHBNC"]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_every_per_layer_layout_round_trips_bytes(daemon, kind):
    p = prompt(50, 5 * 16 + 3)
    saver = engine(daemon.socket_path, f"layout-{kind}", layout_kind=kind)
    saver.prefill(p, "s")
    loader = engine(daemon.socket_path, f"layout-{kind}", layout_kind=kind)
    assert_close(loader.prefill(p, "l"), reference(p))
    assert external(loader, "l") == 80
    loaded_equal_saved(loader, "l", saver, "s", 80)


def test_chunks_are_interchangeable_between_layouts(daemon):
    """KV_2LTD chunks do not depend on the engine's layout: a packed engine loads a legacy one's."""
    p = prompt(51, 48)
    saver = engine(daemon.socket_path, "cross-form", layout_kind=vllm_kv.BLOCK_FIRST)
    saver.prefill(p, "s")
    loader = engine(daemon.socket_path, "cross-form", layout_kind="LHBNC")
    assert_close(loader.prefill(p, "l"), reference(p))
    loaded_equal_saved(loader, "l", saver, "s", 32)


@pytest.mark.parametrize("kind", [vllm_kv.BLOCK_FIRST, "LBNHC"])
def test_mla_latents_round_trip(daemon, kind):
    """MLA caches one latent per token; it is stored once ([1, L, T, latent])."""
    p = prompt(52, 64 + 5)
    saver = engine(daemon.socket_path, f"mla-{kind}", layout_kind=kind, model=MLA_MODEL)
    saver.prefill(p, "s")
    loader = engine(daemon.socket_path, f"mla-{kind}", layout_kind=kind, model=MLA_MODEL)
    assert_close(loader.prefill(p, "l"), reference(p, MLA_MODEL))
    assert external(loader, "l") == 64
    loaded_equal_saved(loader, "l", saver, "s", 64)
    assert loader.worker_connector._layout.parts == 1


@pytest.mark.parametrize("kind", vllm_kv.CROSS_LAYER_LAYOUTS)
def test_cross_layer_blocks_round_trip(daemon, kind):
    p = prompt(53, 4 * 16 + 9)
    saver = engine(daemon.socket_path, f"xl-{kind}", layout_kind=kind, cross_layer=True)
    assert saver.worker_connector._cross is not None
    saver.prefill(p, "s")
    loader = engine(daemon.socket_path, f"xl-{kind}", layout_kind=kind, cross_layer=True)
    assert_close(loader.prefill(p, "l"), reference(p))
    assert external(loader, "l") == 64
    loaded_equal_saved(loader, "l", saver, "s", 64)


def test_required_layout_and_cross_layer_preference():
    cfg = Engine(MODEL, layout_kind="BLHNC").vllm_config
    assert kv_vllm.KVTierConnector.get_required_kvcache_layout(cfg) is None
    cfg.kv_transfer_config = KVTransferConfig(kv_connector_extra_config={"cross_layer": True})
    assert kv_vllm.KVTierConnector.get_required_kvcache_layout(cfg) == "BLHNC"


def test_ambiguous_legacy_tensor_is_refused_until_named():
    t = torch.zeros(2, 2, 8, 2, 16)
    with pytest.raises(ValueError, match="ambiguous"):
        vllm_kv.Layout.detect(t)
    assert vllm_kv.Layout.detect(t, form=vllm_kv.KV_FIRST).num_blocks == 2


def test_cross_layer_copy_beats_per_layer_copies():
    """One copy per block of every layer against per-layer gathers (printed; not a pass/fail timing)."""
    layers, nb, h, bs, c = 32, 64, 8, 16, 256
    logical, per_layer = vllm_kv.allocate_standard("BLHNC", layers, nb, h, bs, c, torch.float16)
    cross = vllm_kv.CrossLayer.of(logical, "BLHNC", layers)
    lay = vllm_kv.Layout.detect(per_layer[0], form=vllm_kv.PACKED)
    copier = vllm_kv.HostCopier()
    blocks = list(range(0, 32, 2))  # 16 blocks = 256 tokens
    raw = torch.empty(cross.chunk_bytes(len(blocks)), dtype=torch.uint8)
    bidx = torch.as_tensor(blocks)
    index = vllm_kv.token_index(blocks, bs, 0, len(blocks) * bs, torch.device("cpu"))
    chunk = vllm_kv.chunk_view(torch.empty(lay.chunk_bytes(layers, len(blocks) * bs), dtype=torch.uint8), lay, layers)

    def per_layer_copy():
        for i, kv in enumerate(per_layer):
            vllm_kv.gather_layer(copier, chunk, i, lay, kv, index)

    def cross_copy():
        cross.gather(copier, cross.chunk_view(raw), bidx)

    def best(f):
        f()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return min(times)

    per, one = best(per_layer_copy), best(cross_copy)
    print(f"\ncross-layer save of 256 tokens x 32 layers: {one * 1e6:.0f} us, per-layer: {per * 1e6:.0f} us, "
          f"ratio {per / one:.1f}x")
    assert raw.numel() == chunk.numel() * chunk.element_size()


# ------------------------------------------------------------- extra keys


def test_lora_adapters_do_not_share_kv(daemon):
    p = prompt(60, 48)
    e = engine(daemon.socket_path, "lora", prefix_caching=False)
    e.prefill(p, "a1", lora="adapter-a")
    for rid, lora in (("b", "adapter-b"), ("base", None)):
        got = e.prefill(p, rid, lora=lora)
        assert external(e, rid) == 0, rid
        assert_close(got, reference(p))
    e.prefill(p, "a2", lora="adapter-a")
    assert external(e, "a2") == 32
    loaded_equal_saved(e, "a2", e, "a1", 32)


def test_cache_salts_do_not_share_kv(daemon):
    p = prompt(61, 48)
    e = engine(daemon.socket_path, "salt", prefix_caching=False)
    e.prefill(p, "t1", cache_salt="tenant-1")
    e.prefill(p, "t2", cache_salt="tenant-2")
    e.prefill(p, "none")
    assert external(e, "t2") == 0 and external(e, "none") == 0
    e.prefill(p, "t1b", cache_salt="tenant-1")
    assert external(e, "t1b") == 32


def test_multimodal_items_separate_the_chunks_they_touch(daemon):
    """Same placeholder tokens, different images: only chunks before the placeholder are shared."""
    p = prompt(62, 64)
    e = engine(daemon.socket_path, "mm", prefix_caching=False)
    e.prefill(p, "cat", mm=[("cat-image-hash", 40, 8)])
    e.prefill(p, "dog", mm=[("dog-image-hash", 40, 8)])
    assert external(e, "dog") == 32  # chunks [0,16), [16,32); [32,48) holds the placeholder
    e.prefill(p, "cat2", mm=[("cat-image-hash", 40, 8)])
    assert external(e, "cat2") == 48
    loaded_equal_saved(e, "cat2", e, "cat", 48)


def test_harness_block_hashes_follow_the_shared_vectors():
    """vLLM's sha256_cbor block hash, as ../shared/testvectors/vllm_block_hash.md gives it."""
    b0 = vllm_hash.block_hash(None, list(range(16)), None)
    b1 = vllm_hash.block_hash(b0, list(range(16, 32)), None)
    assert vllm_hash.none_hash().hex() == "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    assert b0.hex() == "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"
    assert b1.hex() == "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"
    assert int.from_bytes(b0[-8:], "big") == 12687895063098490012


# Extra-key vectors: the same inputs hashed by the Go VLLMHasher (chunk/vllm_test.go,
# TestVLLMExtraKeyVectorsMatchPython); the two implementations must agree.
EXTRA_KEY_VECTORS = {
    "lora": ("lora-a", None, None),
    "salt": (None, "salt-1", None),
    "mm": (None, None, ("img", 4)),
}


@pytest.mark.parametrize("name", sorted(EXTRA_KEY_VECTORS))
def test_extra_key_vectors_match_go(name):
    want = json.load(open(os.path.join(os.path.dirname(__file__), "testdata", "vllm_extra_keys.json")))[name]
    lora, salt, mm = EXTRA_KEY_VECTORS[name]
    extra = [k for k in (lora, mm and list(mm), salt) if k]
    assert vllm_hash.block_hash(None, list(range(16)), extra).hex() == want


def test_block_hash_keys_need_a_fixed_hash_seed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        kv_vllm.Settings.from_extra({"key_mode": "block_hashes"})


def test_block_hash_keys_round_trip_and_carry_vllms_extra_keys(daemon, monkeypatch):
    """key_mode block_hashes: chunks keyed by vLLM's own hashes (harness: PYTHONHASHSEED=0)."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    p = prompt(68, 5 * 16 + 3)
    saver = engine(daemon.socket_path, "hash-keys", prefix_caching=False, key_mode="block_hashes")
    saver.prefill(p, "s")
    saver.prefill(p, "other-lora", lora="adapter-x")
    assert external(saver, "other-lora") == 0
    loader = engine(daemon.socket_path, "hash-keys", prefix_caching=False, key_mode="block_hashes")
    assert_close(loader.prefill(p, "l"), reference(p))
    assert external(loader, "l") == 80
    loaded_equal_saved(loader, "l", saver, "s", 80)
    tokens_mode = engine(daemon.socket_path, "hash-keys", prefix_caching=False)
    tokens_mode.prefill(p, "t")
    assert external(tokens_mode, "t") == 0  # the two key spaces never meet


# ------------------------------------------------- embeds, publishable


def test_prompt_embeds_are_skipped_cleanly(daemon):
    p = prompt(63, 40)
    e = engine(daemon.socket_path, "embeds", prefix_caching=False)
    r = e.add_request(None, "emb", prompt_embeds=torch.as_tensor(p))
    e.run()
    assert r.status == Status.FINISHED and external(e, "emb") == 0
    assert_close(r.logits[0], reference(p))
    e.prefill(p, "tokens")
    assert external(e, "tokens") == 0  # nothing was stored for the embeddings request


def test_only_publishable_blocks_are_stored(daemon):
    p = prompt(64, 64)
    e = engine(daemon.socket_path, "publishable", prefix_caching=False)
    r = e.add_request(p, "draft")
    r.publishable = 2  # 2 blocks of 8 = one 16-token chunk
    e.run()
    e.prefill(p, "again")
    assert external(e, "again") == 16


# ------------------------------------------------------------ async loads


def test_disk_hit_loads_asynchronously(own_daemon):
    """Chunks only on disk (after a daemon restart) are loaded in the background: done_recving."""
    p = prompt(65, 5 * 16 + 3)
    saver = engine(own_daemon.socket_path, "async", prefix_caching=False)
    saver.prefill(p, "s")
    _wait_flushed(own_daemon)
    own_daemon.restart()
    loader = engine(own_daemon.socket_path, "async", prefix_caching=False)
    got = loader.prefill(p, "l")
    assert "l" in loader.async_loaded and loader.async_loaded["l"] == 80
    assert_close(got, reference(p))
    loaded_equal_saved(loader, "l", saver, "s", 80)


def _wait_flushed(d, timeout=10.0):
    """Disk writes are queued behind RAM; wait until the disk tier reports the chunks."""
    from kvtier.client import Client
    deadline = time.monotonic() + timeout
    stats = {}
    with Client(d.socket_path) as c:
        while time.monotonic() < deadline:
            stats = c.stats()
            disk = [t for t in stats.get("tiers", [])[1:] if t.get("objects", 0) >= 5]
            if disk and all(q.get("depth", 0) == 0 for q in stats.get("queues", [])):
                return
            time.sleep(0.05)
    raise AssertionError(f"disk tier did not report the chunks: {stats}")


def test_load_failure_policy_fail_fails_the_request(own_daemon):
    """With kv_load_failure_policy=fail a request whose load breaks finishes with an error."""
    p = prompt(66, 48)
    engine(own_daemon.socket_path, "fail-policy", prefix_caching=False).prefill(p)
    e = engine(own_daemon.socket_path, "fail-policy", prefix_caching=False, fail_policy="fail")
    wc = e.worker_connector
    real = wc._prepare_load
    wc._prepare_load = lambda req, link: (own_daemon.kill(), real(req, link))[1]
    r = e.add_request(p, "doomed")
    e.run()
    assert r.status == Status.FINISHED_ERROR


# ------------------------------------------------------------ hooks, stats


def test_stats_hooks_and_refusals(daemon):
    p = prompt(67, 48)
    e = engine(daemon.socket_path, "stats", prefix_caching=False)
    e.prefill(p, "s")
    e.prefill(p, "l")
    wstats = e.worker_connector.get_kv_connector_stats()
    sstats = e.scheduler_connector.get_kv_connector_stats()
    assert wstats.data["load_bytes"] > 0 and wstats.data["save_bytes"] > 0
    assert sstats.data["queries"] == 2 and sstats.data["hit_tokens"] == 32
    merged = kv_vllm.KVTierConnector.build_kv_connector_stats(dict(wstats.data)).aggregate(sstats)
    assert merged.reduce()["hit_tokens"] == 32 and not merged.is_empty()
    assert e.worker_connector.get_kv_connector_stats() is None  # taken
    assert e.scheduler_connector.reset_cache() is True
    assert kv_vllm.KVTierConnector.requires_piecewise_for_cudagraph({}) is True
    assert kv_vllm.KVTierConnector.build_prom_metrics(None, None, None, None) is None


def test_hybrid_models_are_refused_with_the_model_kind():
    class FullAttentionSpec:
        pass

    class MambaSpec:
        pass

    class Group:
        def __init__(self, spec):
            self.kv_cache_spec = spec

    class KVCacheConfig:
        kv_cache_groups = [Group(FullAttentionSpec()), Group(MambaSpec())]

    cfg = Engine(MODEL).vllm_config
    cfg.kv_transfer_config = KVTransferConfig()
    with pytest.raises(ValueError, match="MambaSpec"):
        kv_vllm.KVTierConnector(cfg, kv_vllm.KVConnectorRole.SCHEDULER, KVCacheConfig())


# --------------------------------------------------------- device discipline


class RecordingCopier(vllm_kv.HostCopier):
    """Stands in for the CUDA copier: records every host copy and checks it crosses devices."""

    def __init__(self):
        self.copies = []

    def to_host(self, dst, src, owner=None):
        assert dst.device.type == "cpu" and src.device.type == "meta", (dst.device, src.device)
        self.copies.append(("to_host", tuple(src.shape)))

    def to_device(self, dst, src):
        assert dst.device.type == "meta" and src.device.type == "cpu", (dst.device, src.device)
        self.copies.append(("to_device", tuple(dst.shape)))


@pytest.mark.parametrize("kind", [vllm_kv.BLOCK_FIRST, "LBHNC", "mla"])
def test_every_index_op_runs_on_the_kv_device(daemon, kind):
    """KV on torch's meta device: index tensors must live there too, bytes cross only via the copier."""
    mla = kind == "mla"
    cfg = MLA_MODEL if mla else MODEL
    e = Engine(cfg, layout_kind=vllm_kv.BLOCK_FIRST if mla else kind, block_size=8, num_blocks=16,
               device="meta", model_name=f"meta-{kind}")
    conn = kv_vllm.KVTierConnector(e.vllm_config, kv_vllm.KVConnectorRole.WORKER)
    conn.settings.socket_path = daemon.socket_path
    conn.link = conn._new_link(conn.link.scope_args)
    conn.link.socket_path = daemon.socket_path
    conn.register_kv_caches(e.kv_caches)
    copier = conn.copier = RecordingCopier()
    tokens = kv_vllm.TokenKeys(kv_vllm.array.array("I", prompt(70 + len(kind), 32)))
    save = kv_vllm.ReqMeta("r", "", tokens, [3, 5, 7, 9], save_start=0, save_end=32)
    for step in ([save], [kv_vllm.ReqMeta("r2", "", tokens, [2, 4, 6, 8], load_start=0, load_end=32)]):
        conn.bind_connector_metadata(kv_vllm.KVTierConnectorMetadata(step))
        conn.start_load_kv(None)
        for name, kv in e.kv_caches.items():
            conn.wait_for_layer_load(name)
            conn.save_kv_layer(name, kv, None)
        conn.wait_for_save()
        conn.clear_connector_metadata()
    assert conn.get_block_ids_with_load_errors() == set()
    parts = 1 if mla else 2
    # 2 chunks x layers x parts copies each way, nothing else
    assert sum(1 for c in copier.copies if c[0] == "to_host") == 2 * cfg.layers * parts
    assert sum(1 for c in copier.copies if c[0] == "to_device") == 2 * cfg.layers * parts
    conn.shutdown()


# ------------------------------------------------------------ conformance


def _conformance(name):
    path = os.path.join(SHARED, "conformance", name)
    if not os.path.exists(path):
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing (required under CI)")
        pytest.skip(f"{path} is missing (../shared not beside the checkout; outside CI only)")
    return json.load(open(path))


# Optional hooks kvtier implements; each must carry upstream's parameter names.
IMPLEMENTED_OPTIONAL = {
    "register_kv_caches", "register_cross_layers_kv_cache", "handle_preemptions", "get_finished",
    "get_block_ids_with_load_errors", "shutdown", "get_kv_connector_stats", "request_finished",
    "get_required_kvcache_layout", "requires_piecewise_for_cudagraph", "build_kv_connector_stats",
    "build_prom_metrics", "reset_cache",
}


def _params(fn):
    out = []
    for p in list(inspect.signature(fn).parameters.values()):
        if p.name in ("self", "cls"):
            continue
        out.append("**" + p.name if p.kind == p.VAR_KEYWORD else p.name)
    return out


def test_vllm_connector_matches_upstream_interface():
    facts = _conformance("vllm_kv_connector_v1.json")
    cls = kv_vllm.KVTierConnector
    assert _params(cls.__init__) == facts["constructor"]["params"]
    for m in facts["methods"]:
        name = m["name"]
        if not (m["abstract"] or name in IMPLEMENTED_OPTIONAL):
            continue
        assert name in cls.__dict__, f"{name} is not implemented"
        assert _params(getattr(cls, name)) == m["params"], name


def test_sglang_backend_matches_upstream_interface():
    from kvtier.sglang import KVTierStorage

    facts = _conformance("sglang_hicache_storage.json")
    for m in facts["methods"]:
        name = m["name"]
        assert name in KVTierStorage.__dict__, f"{name} is not implemented"
        want = [p.split("=")[0] for p in m["params"]]
        assert _params(getattr(KVTierStorage, name)) == want, name
    assert _params(KVTierStorage.__init__) == ["storage_config", "kwargs"]


@pytest.mark.parametrize("form", [vllm_kv.BLOCK_FIRST, vllm_kv.KV_FIRST])
def test_legacy_hnd_strides_round_trip(form):
    """Pre-0.26 5-D caches in HND order (heads before tokens in memory) are read through strides."""
    g = torch.Generator().manual_seed(3)
    B, N, H, D, L = 6, 4, 2, 3, 2
    if form == vllm_kv.BLOCK_FIRST:
        kvs = [torch.randn(B, 2, H, N, D, generator=g).permute(0, 1, 3, 2, 4) for _ in range(L)]
    else:
        kvs = [torch.randn(2, B, H, N, D, generator=g).permute(0, 1, 3, 2, 4) for _ in range(L)]
    assert not kvs[0].is_contiguous()
    lay = vllm_kv.Layout.detect(kvs[0], form=form)
    copier = vllm_kv.HostCopier()
    blocks, T = [5, 2], 7
    index = vllm_kv.token_index(blocks, N, 1, 1 + T, torch.device("cpu"))
    chunk = vllm_kv.chunk_view(torch.zeros(lay.chunk_bytes(L, T), dtype=torch.uint8), lay, L)
    for layer, kv in enumerate(kvs):
        vllm_kv.gather_layer(copier, chunk, layer, lay, kv, index)
    for layer, kv in enumerate(kvs):
        for t in range(T):
            tok = 1 + t
            b, o = blocks[tok // N], tok % N
            k, v = (kv[b, 0, o], kv[b, 1, o]) if form == vllm_kv.BLOCK_FIRST else (kv[0, b, o], kv[1, b, o])
            assert torch.equal(chunk[0, layer, t], k.reshape(-1)) and torch.equal(chunk[1, layer, t], v.reshape(-1))
    dst = [torch.zeros_like(kv) for kv in kvs]
    for layer, kv in enumerate(dst):
        vllm_kv.scatter_layer(copier, chunk, layer, lay, kv, index)
    for a, b in zip(kvs, dst):
        got = lay.canonical(b)[index[0], :, index[1]]
        assert torch.equal(got, lay.canonical(a)[index[0], :, index[1]])
