"""Slot views that outlive their connection (client.py, Client._detach_arena).

A save gathers KV into arena slots layer by layer; if its connection closes in the
middle of the step, the daemon ends the connection's leases and hands those slots to
other connections. The stale views must then neither crash nor write into the
daemon's memory: another connection's chunk stored into the freed slots keeps its bytes.
"""

import time

import torch

from kvtier import protocol as p
from kvtier.client import Client

from conftest import CHUNK

SIZE = 64 * 1024


def _fill(slot_views, value):
    for v in slot_views:
        v.fill_(value)


def _reused_slots(daemon, a_offsets, scope_name, tokens, deadline_s=30.0):
    """B's PREPARE_STORE, retried until the daemon has ended A's lease and hands B A's slots."""
    b = Client(daemon.socket_path)
    s = b.scope(scope_name, "uint8/KV_2LTD")
    end = time.monotonic() + deadline_s  # a safety bound only: the daemon frees them on the close
    while True:
        slots = b.prepare_store(b.tokens(s, tokens), [SIZE] * 4, lease_ms=60000)
        if {x.offset for x in slots.slots} & a_offsets or time.monotonic() > end:
            return b, s, slots
        b.commit_store(slots.lease, 0)
        time.sleep(0.01)


def test_stale_save_views_do_not_touch_reused_slots(own_daemon):
    a = Client(own_daemon.socket_path)
    sa = a.scope("stale-a", "uint8/KV_2LTD")
    got = a.prepare_store(a.tokens(sa, list(range(100, 100 + 4 * CHUNK))), [SIZE] * 4, lease_ms=60000)
    assert all(x.state == p.SLOT_WRITE for x in got.slots)
    stale = [a.slot_tensor(x) for x in got.slots]
    _fill(stale, 0x11)  # layer 0 of A's save, gathered while its lease held
    a.close()  # the link failed for another request of the step: the daemon ends A's lease

    tokens = list(range(900, 900 + 4 * CHUNK))
    b, sb, slots = _reused_slots(own_daemon, {x.offset for x in got.slots}, "stale-b", tokens)
    try:
        assert {x.offset for x in slots.slots} & {x.offset for x in got.slots}, "the daemon did not reuse A's slots"
        want = [torch.full((SIZE,), 0x40 + i, dtype=torch.uint8) for i in range(len(slots.slots))]
        for x, w in zip(slots.slots, want):
            b.slot_tensor(x).copy_(w)
        assert b.commit_store(slots.lease, len(slots.slots)) == len(slots.slots)
        # A's save goes on with its later layers through the stale views: no segfault,
        # and none of it reaches the daemon's memory.
        _fill(stale, 0xEE)
        assert all(int(v.max()) == 0xEE for v in stale)
        back = b.prepare_retrieve(b.tokens(sb, tokens))
        assert len(back.slots) == len(want)
        for x, w in zip(back.slots, want):
            assert torch.equal(b.slot_tensor(x), w), "a closed connection's stale view overwrote another's chunk"
        b.release(back.lease)
    finally:
        b.close()
    del stale  # the last views go: the mmap object unmaps the (private) range


# ----- the connector: a step whose connection closes after some saves and loads were prepared

import pytest  # noqa: E402

from kvtier import client as kclient  # noqa: E402
from harness_util import assert_close, engine, prompt, reference  # noqa: E402


def _chunks_held(socket_path, model, tokens):
    with Client(socket_path) as c:
        return c.lookup(c.tokens(c.scope(model, "float32/KV_2LTD"), tokens)).chunks


def test_save_whose_connection_closed_mid_step_leaves_reused_slots_alone(own_daemon, monkeypatch):
    """Request B's PREPARE_STORE fails, the link closes the connection, the daemon ends A's
    store lease (prepared earlier in the same step) and gives its slots to another
    connection; A's layers gathered afterwards must not land in that connection's chunks."""
    recorded = []  # every PREPARE_STORE's slots, in order: A's first
    real_prepare_store = kclient.Client.prepare_store

    def prepare_store(self, keys, sizes, lease_ms=0):
        got = real_prepare_store(self, keys, sizes, lease_ms)
        recorded.append(got)
        return got
    monkeypatch.setattr(kclient.Client, "prepare_store", prepare_store)

    e = engine(own_daemon.socket_path, "stale-save")
    conn = e.worker_connector
    real = conn._prepare_save
    other = {}

    def prepare_save(req):
        if not other.get("a"):
            other["a"] = real(req)
            return other["a"]
        # B's prepare fails: the link closes the connection (and A's lease with it).
        a_slots = recorded[0].slots
        conn.link.fail(kclient.ConnectionLost("kvtier: test: B's PREPARE_STORE failed"))
        tokens = list(range(5000, 5000 + 4 * CHUNK))
        size = conn._chunk_bytes()
        b = Client(own_daemon.socket_path)
        s = b.scope("stale-save-other", "float32/KV_2LTD")
        for _ in range(3000):  # until the daemon hands A's slots over (it does on the close)
            slots = real_prepare_store(b, b.tokens(s, tokens), [size] * 4, 60000)
            if {x.offset for x in slots.slots} & {x.offset for x in a_slots}:
                break
            b.commit_store(slots.lease, 0)
            time.sleep(0.01)
        else:
            pytest.fail("the daemon never reused A's slots")
        want = [torch.full((size,), 0x30 + i, dtype=torch.uint8) for i in range(4)]
        for x, w in zip(slots.slots, want):
            b.slot_tensor(x).copy_(w)
        assert b.commit_store(slots.lease, 4) == 4
        other.update(b=b, s=s, tokens=tokens, want=want)
        return None

    conn._prepare_save = prepare_save
    pa, pb = prompt(40, 70), prompt(41, 70)
    ra, rb = e.add_request(pa), e.add_request(pb)
    e.run()  # A's save gathers its three layers through views of the closed connection: no crash
    assert_close(ra.logits[0], reference(pa))
    assert_close(rb.logits[0], reference(pb))
    b, s = other["b"], other["s"]
    try:
        back = b.prepare_retrieve(b.tokens(s, other["tokens"]))
        assert len(back.slots) == 4
        for x, w in zip(back.slots, other["want"]):
            assert torch.equal(b.slot_tensor(x), w), "A's stale save wrote into another connection's chunk"
        b.release(back.lease)
    finally:
        b.close()
    assert _chunks_held(own_daemon.socket_path, "stale-save", pa) == 0  # A's save was dropped, not committed


@pytest.mark.parametrize("layerwise", [False, True])
def test_load_whose_connection_closed_mid_copy_becomes_load_errors(own_daemon, layerwise):
    """A whole-chunk load's connection closes after its first layer is copied: the rest of
    its slots are no longer leased (the client detached them: they read zeros), so the
    load's blocks become load errors and are recomputed — same logits, no zeros used as KV."""
    p = prompt(42, 70)
    engine(own_daemon.socket_path, "stale-load").prefill(p)
    assert _chunks_held(own_daemon.socket_path, "stale-load", p) == 4
    e = engine(own_daemon.socket_path, "stale-load", layerwise=layerwise, prefix_caching=False)
    conn = e.worker_connector
    real = conn._await_layer
    closed = []

    def await_layer(link, load, layer):
        real(link, load, layer)
        if layer == 1 and not closed and load.client is not None:
            closed.append(load.req.req_id)
            load.client.close()  # as link.fail does when another call on it breaks
    conn._await_layer = await_layer
    assert_close(e.prefill(p), reference(p))
    assert closed
    assert any(s.load_error_blocks for s in e.steps), "the load from a closed connection was not failed"
