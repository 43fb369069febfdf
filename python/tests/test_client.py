"""The Python client against a real daemon: every operation and its errors."""

import os
import struct

import pytest
import torch

from kvtier import protocol as p
from kvtier.client import Client, ConnectionLost, NotFound, BadRequest
from conftest import CHUNK


def test_hello_maps_the_arena(daemon):
    with Client(daemon.socket_path) as c:
        assert c.chunk_tokens == CHUNK
        assert c.hello.arena_bytes > 0
        assert c.ping(b"echo me") == b"echo me"


def test_scope_handles_are_stable_per_connection(daemon):
    with Client(daemon.socket_path) as c:
        a = c.scope("m", "float32/KV_2LTD")
        assert a != 0
        assert c.scope("m", "float32/KV_2LTD") == a
        assert c.scope("m", "float32/KV_2LTD", namespace="other") != a


def _chunk(seed, nbytes=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def test_store_then_retrieve_in_place_across_connections(daemon):
    tokens = list(range(1000, 1000 + 3 * CHUNK + 5))  # three whole chunks and a partial one
    chunks = [_chunk(i) for i in range(3)]
    with Client(daemon.socket_path) as w:
        s = w.scope("store-retrieve", "uint8/KV_2LTD")
        assert w.lookup(w.tokens(s, tokens)).tokens == 0
        assert w.store(w.tokens(s, tokens), chunks) == 3
    with Client(daemon.socket_path) as r:
        s = r.scope("store-retrieve", "uint8/KV_2LTD")
        hit = r.lookup(r.tokens(s, tokens), lease_ms=1000)
        assert (hit.tokens, hit.chunks) == (3 * CHUNK, 3)
        assert hit.lease != 0 and hit.by_tier[0] == 3
        r.release(hit.lease)
        got = r.prepare_retrieve(r.tokens(s, tokens[: 3 * CHUNK], skip=CHUNK))
        assert got.tokens == 2 * CHUNK and len(got.slots) == 2
        for slot, want in zip(got.slots, chunks[1:]):
            assert torch.equal(r.slot_tensor(slot), want)
        r.release(got.lease)
        with pytest.raises(NotFound):
            r.release(got.lease)


def test_prepare_store_marks_cached_chunks(daemon):
    tokens = list(range(5000, 5000 + 2 * CHUNK))
    with Client(daemon.socket_path) as c:
        s = c.scope("marks", "uint8/KV_2LTD")
        assert c.store(c.tokens(s, tokens[:CHUNK]), [_chunk(7)]) == 1
        slots = c.prepare_store(c.tokens(s, tokens), [256, 256])
        assert [x.state for x in slots.slots] == [p.SLOT_STORED, p.SLOT_WRITE]
        assert c.commit_store(slots.lease, 0) == 0  # dropped unseen
        assert c.lookup(c.tokens(s, tokens)).chunks == 1
        # The chunk stored first keeps its bytes; the abandoned one left none.
        got = c.prepare_retrieve(c.tokens(s, tokens))
        assert len(got.slots) == 1 and torch.equal(c.slot_tensor(got.slots[0]), _chunk(7))
        c.release(got.lease)


def test_hash_keys_renew_prefetch_clear_stats(daemon):
    hashes = [bytes([i]) * 16 for i in range(1, 4)]
    with Client(daemon.socket_path) as c:
        s = c.scope("hashes", "uint8/page")
        assert c.store(c.hashes(s, hashes[:2]), [_chunk(1), _chunk(2)]) == 2
        hit = c.lookup(c.hashes(s, hashes), lease_ms=500)
        assert (hit.tokens, hit.chunks) == (0, 2)
        c.renew(hit.lease, 2000)
        c.release(hit.lease)  # the renewed lease is still there to release ...
        with pytest.raises(NotFound):
            c.release(hit.lease)  # ... once
        got = c.prepare_retrieve(c.hashes(s, hashes))
        assert len(got.slots) == 2
        for slot, want in zip(got.slots, [_chunk(1), _chunk(2)]):
            assert torch.equal(c.slot_tensor(slot), want)
        c.release(got.lease)
        assert c.prefetch(c.hashes(s, hashes)) is True  # an idle daemon's prefetch queue has room
        st = c.stats()
        mem = next(t for t in st["tiers"] if t["name"] == "mem")
        assert mem["capacity_bytes"] == 256 << 20  # the fixture's 0.25 GB RAM tier
        assert mem["objects"] >= 2 and mem["puts"] >= 2 and mem["used_bytes"] >= 2 * 256
        assert c.clear(s) == 2
        assert c.lookup(c.hashes(s, hashes)).chunks == 0
        after = next(t for t in c.stats()["tiers"] if t["name"] == "mem")
        assert after["objects"] == mem["objects"] - 2 and after["removes"] >= mem["removes"] + 2


def test_error_statuses_raise_typed_exceptions(daemon):
    with Client(daemon.socket_path) as c:
        with pytest.raises(NotFound):
            c.lookup(c.tokens(999, [1, 2, 3]))  # unknown scope handle
        s = c.scope("errors", "uint8/KV_2LTD")
        with pytest.raises(BadRequest):
            c.lookup(c.tokens(s, list(range(40)), skip=3))  # skip not a chunk multiple
        assert c.ping(b"still usable") == b"still usable"


def test_unreachable_daemon_is_connection_lost(tmp_path):
    with pytest.raises(ConnectionLost):
        Client(str(tmp_path / "nobody.sock"), timeout=0.5)


def test_silent_peer_times_out(tmp_path):
    """A peer that accepts but never answers must not hang the caller."""
    import socket
    path = str(tmp_path / "silent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    try:
        with pytest.raises(ConnectionLost):
            Client(path, timeout=0.3)
    finally:
        srv.close()


def test_decoders_reject_malformed_bodies():
    with pytest.raises(p.ProtocolError):
        p.unpack_slots(struct.pack("<QII", 1, 0, 2))  # announces 2 slots, carries none
    with pytest.raises(p.ProtocolError):
        p.unpack_lookup_reply(struct.pack("<IIQB", 0, 0, 0, 9) + b"\0" * 36)
    with pytest.raises(p.ProtocolError):
        p.unpack_u32(b"\0" * 5, "x")
    with pytest.raises(p.ProtocolError):
        p.unpack_header(p.pack_header(0, 1, 1, status=77))


def test_flush_makes_stores_survive_a_kill(own_daemon):
    """Chunks stored before a FLUSH are on disk: a SIGKILL right after loses none."""
    tokens = list(range(7000, 7000 + 8 * CHUNK))
    chunks = [_chunk(100 + i, 4096) for i in range(8)]
    with Client(own_daemon.socket_path) as c:
        s = c.scope("flush", "uint8/KV_2LTD")
        assert c.store(c.tokens(s, tokens), chunks) == 8
        reply = c.flush(timeout_ms=30_000)
        assert [t.name for t in reply.tiers] == ["disk"]
        assert reply.durable, reply
    own_daemon.restart()  # SIGKILL, then start again on the same disk
    with Client(own_daemon.socket_path) as c:
        s = c.scope("flush", "uint8/KV_2LTD")
        got = c.prepare_retrieve(c.tokens(s, tokens))
        assert len(got.slots) == 8
        for slot, want in zip(got.slots, chunks):
            assert torch.equal(c.slot_tensor(slot), want)
        c.release(got.lease)


def test_flush_reply_decoder():
    body = struct.pack("<B", 1) + p.pack_str("disk") + struct.pack("<III", 2, 3, 0)
    reply = p.unpack_flush_reply(body)
    assert reply.tiers == [p.FlushTier("disk", 2, 3, 0)] and not reply.durable
    assert p.unpack_flush_reply(b"\0").durable
    with pytest.raises(p.ProtocolError):
        p.unpack_flush_reply(body[:-1])  # cut short
    with pytest.raises(p.ProtocolError):
        p.unpack_flush_reply(struct.pack("<B", 9))  # more tiers than a daemon has
    with pytest.raises(p.ProtocolError):
        p.unpack_flush_reply(struct.pack("<BH", 1, 2) + b"\xff\xfe" + struct.pack("<III", 0, 0, 0))


def test_lookup_batch_matches_single_lookups(daemon):
    """LOOKUP_BATCH answers each prompt as LOOKUP does, in one round trip;
    a failing lookup fails alone, as the exception lookup() would raise."""
    from kvtier.client import StatusError
    whole = list(range(7000, 7000 + 3 * CHUNK))
    with Client(daemon.socket_path) as c:
        s = c.scope("batch", "uint8/KV_2LTD")
        assert c.store(c.tokens(s, whole), [_chunk(i) for i in range(3)]) == 3
        keys = [
            c.tokens(s, whole),
            c.tokens(s, whole[:CHUNK] + list(range(1, 1 + CHUNK))),  # first chunk only
            c.tokens(s, list(range(90000, 90000 + 2 * CHUNK))),        # a miss
            c.tokens(s, whole, skip=CHUNK),
            c.tokens(999, whole),                                      # unknown scope handle
            c.tokens(s, whole, skip=3),                                # skip not a chunk multiple
        ]
        got = c.lookup_batch(keys)
        assert len(got) == len(keys)
        for k, g in zip(keys, got):
            try:
                want = c.lookup(k)
            except StatusError as e:
                assert isinstance(g, type(e)) and g.message == e.message
                continue
            assert g == want
        assert [g.chunks for g in got[:4]] == [3, 1, 0, 3]
        assert isinstance(got[4], NotFound) and isinstance(got[5], BadRequest)
        leased = c.lookup_batch(keys[:1], lease_ms=1000)[0]
        assert leased.lease != 0
        c.release(leased.lease)
        with pytest.raises(ValueError):
            c.lookup_batch([])
        with pytest.raises(ValueError):
            c.lookup_batch([keys[0]] * (p.MAX_BATCH + 1))
        assert c.ping(b"still usable") == b"still usable"


def test_lookup_batch_reply_decoder():
    ok = struct.pack("<IIIQB", 0, 32, 2, 0, 1) + struct.pack("<I", 2)
    err = struct.pack("<IH", 3, 2) + b"no"
    got = p.unpack_lookup_batch_reply(struct.pack("<I", 2) + ok + err)
    assert got[0].status == 0 and got[0].reply.tokens == 32 and got[0].reply.by_tier == [2]
    assert (got[1].status, got[1].message) == (3, "no")
    for bad in (
        struct.pack("<I", 3) + ok + err,          # announces more results than it carries
        struct.pack("<I", 1) + ok + b"\0",        # trailing bytes
        struct.pack("<II", 1, 77) + b"\0\0",      # unknown status
        struct.pack("<I", 5000) + b"\0" * 64,     # over MAX_BATCH
    ):
        with pytest.raises(p.ProtocolError):
            p.unpack_lookup_batch_reply(bad)


def test_request_buffer_lookups_match(daemon):
    """With a request buffer, lookups leave their tokens in shared memory
    and answer exactly as lookups that send them; a batch whose tokens do
    not all fit sends the rest in the frame."""
    prompts = [list(range(20000 + 1000 * i, 20000 + 1000 * i + 3 * CHUNK)) for i in range(6)]
    big = list(range(60000, 60000 + 1200))  # 4,800 bytes: more than a 4 KiB buffer's room
    with Client(daemon.socket_path) as plain, Client(daemon.socket_path, request_buffer=p.MIN_REQUEST_BUFFER) as shared:
        assert shared.shares_tokens and not plain.shares_tokens
        s = plain.scope("reqbuf", "uint8/KV_2LTD")
        for i, t in enumerate(prompts):
            assert plain.store(plain.tokens(s, t[: (1 + i % 3) * CHUNK]), [_chunk(i)] * (1 + i % 3)) == 1 + i % 3
        h = shared.scope("reqbuf", "uint8/KV_2LTD")
        for t in prompts + [big]:
            assert shared.lookup(shared.tokens(h, t)) == plain.lookup(plain.tokens(s, t))
        want = plain.lookup_batch([plain.tokens(s, t) for t in prompts + [big]])
        got = shared.lookup_batch([shared.tokens(h, t) for t in prompts + [big]])
        assert got == want
        assert [g.chunks for g in got[:3]] == [1, 2, 3]
        assert shared.lookup(shared.tokens(h, prompts[0], skip=CHUNK)).chunks == 1
        with pytest.raises(BadRequest):
            shared.lookup(shared.tokens(h, prompts[0], skip=3))
    with pytest.raises(ValueError):
        Client(daemon.socket_path, request_buffer=100)
