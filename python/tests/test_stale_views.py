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
