"""The connector-facing transfer operations (PUSH, PUSH_STATUS, WAIT) against
two real daemons: a producer the client pushes from and a consumer with a TCP
port it pushes to."""

import re
import time

import pytest
import torch

from kvtier import protocol as p
from kvtier.client import BadRequest, Client, NotFound
from kvtier.testing import Daemon

CHUNK = 16


def _tcp_daemon(kvtier_bin, workdir):
    d = Daemon(kvtier_bin, workdir, chunk_size=CHUNK, ram_gb=0.0625,
               extra_env={"KVTIER_TCP_ADDR": "127.0.0.1:0", "KVTIER_LOG_LEVEL": "info"}).start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(r'msg="tcp protocol listening" addr=(\S+)', d.log())
        if m:
            d.tcp_addr = m.group(1)
            return d
        time.sleep(0.02)
    d.kill()
    raise RuntimeError("the consumer daemon did not log its TCP address: " + d.log())


@pytest.fixture
def pair(kvtier_bin, tmp_path):
    prod = Daemon(kvtier_bin, str(tmp_path / "prod"), chunk_size=CHUNK, ram_gb=0.0625).start()
    cons = _tcp_daemon(kvtier_bin, str(tmp_path / "cons"))
    yield prod, cons
    prod.kill()
    cons.kill()


def _chunk(seed, nbytes=4096):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def _until_ended(c, transfer):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        st = c.push_status(transfer)
        if st.state != p.TRANSFER_PENDING:
            return st
        time.sleep(0.01)
    raise AssertionError(f"transfer {transfer} still pending: {st}")


def test_push_then_wait_then_load(pair):
    prod, cons = pair
    tokens = list(range(500, 500 + 6 * CHUNK))
    chunks = [_chunk(i) for i in range(6)]
    with Client(prod.socket_path) as w:
        s = w.scope("pd-model", "uint8/KV_2LTD")
        assert w.store(w.tokens(s, tokens), chunks) == 6
        # Saved layer by layer, pushed as saved: two PUSHes, the second last.
        assert w.push(41, cons.tcp_addr, w.tokens(s, tokens[: 3 * CHUNK])) == 3
        assert w.push(41, cons.tcp_addr, w.tokens(s, tokens, skip=3 * CHUNK), last=True) == 6
        st = _until_ended(w, 41)
        assert st.done and (st.queued, st.pushed, st.message) == (6, 6, "")
        with pytest.raises(BadRequest):
            w.push(41, cons.tcp_addr, w.tokens(s, tokens[:CHUNK]), last=True)
        with pytest.raises(NotFound):
            w.push_status(999)
    with Client(cons.socket_path) as r:
        s = r.scope("pd-model", "uint8/KV_2LTD")
        got = r.wait(r.tokens(s, tokens), timeout_ms=5000)
        assert (got.chunks, got.tokens) == (6, 6 * CHUNK)
        slots = r.prepare_retrieve(r.tokens(s, tokens))
        assert len(slots.slots) == 6
        for slot, want in zip(slots.slots, chunks):
            assert torch.equal(r.slot_tensor(slot), want)
        r.release(slots.lease)
        # Chunks that never come: the wait ends with what is there.
        more = tokens + list(range(9000, 9000 + CHUNK))
        got = r.wait(r.tokens(s, more), timeout_ms=50)
        assert got.chunks == 6


def test_failed_push_is_reported(pair, tmp_path):
    prod, cons = pair
    tokens = list(range(700, 700 + 2 * CHUNK))
    with Client(prod.socket_path) as w:
        s = w.scope("pd-model", "uint8/KV_2LTD")
        w.store(w.tokens(s, tokens), [_chunk(10), _chunk(11)])
        w.push(42, "127.0.0.1:1", w.tokens(s, tokens), last=True)  # nobody listens there
        st = _until_ended(w, 42)
        assert st.failed and st.pushed == 0 and "127.0.0.1:1" in st.message
        # A chunk the producer does not hold fails the push at once.
        with pytest.raises(NotFound):
            w.push(43, cons.tcp_addr, w.tokens(s, tokens + list(range(CHUNK))), last=True)
        assert w.push_status(43).failed
        # Nothing stays held for the failed transfers (released by their
        # sending goroutine as it stops, so poll).
        deadline = time.monotonic() + 10
        while w.stats()["arena"]["pinned_bytes"] != 0:
            assert time.monotonic() < deadline, "the producer still holds chunks of failed transfers"
            time.sleep(0.01)


def test_pd_decoders_reject_malformed_bodies():
    ok = p.unpack_push_status(bytes([2, 0, 0, 0]) + (3).to_bytes(4, "little") + (1).to_bytes(4, "little") + b"\x02\x00no")
    assert ok.failed and (ok.queued, ok.pushed, ok.message) == (3, 1, "no")
    for bad in (b"", bytes([7, 0, 0, 0]) + bytes(10), bytes([0, 1, 0, 0]) + bytes(10), bytes(14) + b"x"):
        with pytest.raises(p.ProtocolError):
            p.unpack_push_status(bad)
    assert p.unpack_wait_reply(bytes(8)) == p.WaitReply(0, 0)
    with pytest.raises(p.ProtocolError):
        p.unpack_wait_reply(bytes(9))
    with pytest.raises(ValueError):
        p.pack_push(0, "h:1", p.Keys(1, p.KIND_TOKENS, [1]))
