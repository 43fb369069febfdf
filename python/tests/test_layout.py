"""KV_2LTD gather/scatter (kvtier.vllm_kv): byte layout and round trips for both legacy 5-D paged shapes."""

import pytest
import torch

from kvtier import vllm_kv as layout

CPU = torch.device("cpu")
COPY = layout.HostCopier()


def _paged(kind, nb=6, bs=4, h=2, d=3, layers=3, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    shape = (nb, 2, bs, h, d) if kind == layout.BLOCK_FIRST else (2, nb, bs, h, d)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(layers)]


def _k_v(kind, kv, block, off):
    if kind == layout.BLOCK_FIRST:
        return kv[block, 0, off], kv[block, 1, off]
    return kv[0, block, off], kv[1, block, off]


@pytest.mark.parametrize("kind", [layout.BLOCK_FIRST, layout.KV_FIRST])
def test_gather_matches_the_kv_2ltd_formula(kind):
    kvs = _paged(kind)
    paged = layout.Layout.detect(kvs[0])
    assert paged.form == kind
    block_ids = [5, 2, 3]
    slots = layout.token_index(block_ids, paged.block_size, 2, 9, CPU)  # 7 tokens crossing blocks
    raw = torch.zeros(paged.chunk_bytes(3, 7), dtype=torch.uint8)
    chunk = layout.chunk_view(raw, paged, 3)
    for l, kv in enumerate(kvs):
        layout.gather_layer(COPY, chunk, l, paged, kv, slots)
    flat = raw.view(torch.float32)
    H, T, L = 6, 7, 3
    for l, kv in enumerate(kvs):
        for t in range(T):
            tok = 2 + t
            k, v = _k_v(kind, kv, block_ids[tok // 4], tok % 4)
            # K: ((0*L + l)*T + t)*H ; V: ((1*L + l)*T + t)*H  (kvformat's KV_2LTD)
            assert torch.equal(flat[((0 * L + l) * T + t) * H:][:H], k.reshape(-1))
            assert torch.equal(flat[((1 * L + l) * T + t) * H:][:H], v.reshape(-1))


@pytest.mark.parametrize("kind", [layout.BLOCK_FIRST, layout.KV_FIRST])
def test_scatter_round_trips_and_respects_first(kind):
    src = _paged(kind)
    paged = layout.Layout.detect(src[0])
    slots = layout.token_index([1, 4], paged.block_size, 0, 8, CPU)
    raw = torch.empty(paged.chunk_bytes(3, 8), dtype=torch.uint8)
    chunk = layout.chunk_view(raw, paged, 3)
    for l, kv in enumerate(src):
        layout.gather_layer(COPY, chunk, l, paged, kv, slots)
    dst = [torch.zeros_like(kv) for kv in src]
    dst_slots = layout.token_index([0, 3], paged.block_size, 3, 8, CPU)  # skip the first 3 tokens
    for l, kv in enumerate(dst):
        layout.scatter_layer(COPY, chunk, l, paged, kv, dst_slots, first=3)
    for l in range(3):
        for tok in range(8):
            want = _k_v(kind, src[l], [1, 4][tok // 4], tok % 4)
            got = _k_v(kind, dst[l], [0, 3][tok // 4], tok % 4)
            if tok < 3:
                assert not got[0].any() and not got[1].any()
            else:
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_chunk_view_rejects_partial_tokens():
    paged = layout.Layout.detect(_paged(layout.KV_FIRST)[0])
    with pytest.raises(ValueError):
        layout.chunk_view(torch.zeros(7, dtype=torch.uint8), paged, 3)
    # Whole tokens view as (K/V, layer, token, row), aliasing the bytes.
    raw = torch.zeros(paged.chunk_bytes(3, 2), dtype=torch.uint8)
    view = layout.chunk_view(raw, paged, 3)
    assert view.shape == (2, 3, 2, paged.row_elems)
    view[1, 2, 1] = 1.5  # V, last layer, last token: the last row of the buffer
    flat = raw.view(torch.float32)
    assert torch.equal(flat[-paged.row_elems:], torch.full((paged.row_elems,), 1.5))
    assert not flat[:-paged.row_elems].any()
