"""Per-layer saves (docs/layerwise.md#per-layer-saves): in layerwise mode the connector announces
each saved layer with STORE_LAYER so the daemon writes it to disk during the pass; the chunks read
back with the bytes that were saved."""

from kvtier import protocol as p
from kvtier.client import Client
from harness_util import MODEL, assert_close, engine, prompt, reference


def _to_disk_only(daemon):
    """Waits until every stored chunk is durable on disk, then restarts the daemon: its RAM
    starts empty, its disk tier keeps the chunks."""
    with Client(daemon.socket_path) as c:
        assert c.flush(30_000).durable
    daemon.kill()
    daemon.start()


def _record_saves(monkeypatch):
    """Records the scope registrations, STORE_LAYER notices and commits of every client, and the
    bytes of each lease's slots as they were committed."""
    import dataclasses
    events, scopes, stores, committed = [], [], {}, {}
    real_scope, real_prep = Client.scope, Client.prepare_store
    real_notice, real_commit = Client.store_layer, Client.commit_store

    def scope(self, *a, **k):
        h = real_scope(self, *a, **k)
        scopes.append((h, a, k))
        return h

    def prepare_store(self, keys, sizes, lease_ms=0):
        s = real_prep(self, keys, sizes, lease_ms)
        stores[s.lease] = (self, keys, s)
        return s

    def store_layer(self, lease, layer, layers=0, parts=0):
        events.append(("layer", lease, layer))
        real_notice(self, lease, layer, layers, parts)

    def commit_store(self, lease, count):
        c, keys, s = stores[lease]
        slots = s.slots[:count]
        assert all(x.state == p.SLOT_WRITE for x in slots)
        committed[lease] = (dataclasses.replace(keys, items=list(keys.items)),
                            [bytes(c.slot_tensor(x).numpy()) for x in slots])
        events.append(("commit", lease, count))
        return real_commit(self, lease, count)

    for name, fn in (("scope", scope), ("prepare_store", prepare_store), ("store_layer", store_layer),
                     ("commit_store", commit_store)):
        monkeypatch.setattr(Client, name, fn)
    return events, scopes, committed


def test_layer_saves_are_announced_and_read_back(own_daemon, monkeypatch):
    """In layerwise mode each saved layer is announced with STORE_LAYER, in order, during the pass
    and before the commit; after a restart (RAM empty) the committed chunks read back from the
    daemon's disk with the bytes that were in their slots, and a layerwise load of the prompt gives
    the logits of a full prefill."""
    events, scopes, committed = _record_saves(monkeypatch)
    p_ = prompt(38, 70)
    engine(own_daemon.socket_path, "lw-save", layerwise=True).prefill(p_)
    monkeypatch.undo()
    assert committed, "nothing was saved"
    for lease in committed:
        mine = [e for e in events if e[1] == lease]
        assert [e[2] for e in mine[:-1]] == list(range(MODEL.layers)), mine
        assert mine[-1][0] == "commit" and all(e[0] == "layer" for e in mine[:-1]), mine
    # The daemon acted on the notices: every committed chunk's record was written layer by layer
    # and committed from those writes, not written whole after the commit.
    chunks = sum(len(want) for _, want in committed.values())
    nbytes = sum(len(b) for _, want in committed.values() for b in want)
    with Client(own_daemon.socket_path) as c:
        assert c.flush(30_000).durable
        (q,) = c.stats()["queues"]
    assert q["layer_saved"] == chunks and q["layer_bytes"] == nbytes, (q, chunks, nbytes)
    _to_disk_only(own_daemon)
    with Client(own_daemon.socket_path) as c:
        handles = {h: c.scope(*a, **k) for h, a, k in scopes}
        for keys, want in committed.values():
            got = c.prepare_retrieve(type(keys)(handles[keys.scope], keys.kind, keys.items, keys.skip))
            assert len(got.slots) == len(want)
            assert [bytes(c.slot_tensor(x).numpy()) for x in got.slots] == want, "the chunks on disk differ"
            c.release(got.lease)
    _to_disk_only(own_daemon)
    e = engine(own_daemon.socket_path, "lw-save", layerwise=True)
    assert_close(e.prefill(p_), reference(p_))
    assert [(s.external_tokens, s.num_scheduled) for s in e.steps] == [(64, 6)]


def test_layer_saves_off_sends_no_notice(own_daemon, monkeypatch):
    """layer_saves: false keeps layerwise loads but saves as before: no STORE_LAYER, the chunks
    still reach the disk after the commit."""
    events, _, committed = _record_saves(monkeypatch)
    p_ = prompt(39, 70)
    engine(own_daemon.socket_path, "lw-nosave", layerwise=True, layer_saves=False).prefill(p_)
    monkeypatch.undo()
    assert committed and not [e for e in events if e[0] == "layer"]
    with Client(own_daemon.socket_path) as c:
        assert c.flush(30_000).durable
        (q,) = c.stats()["queues"]
    assert q["layer_saved"] == 0 and q["layer_bytes"] == 0, q
    _to_disk_only(own_daemon)
    e = engine(own_daemon.socket_path, "lw-nosave", layerwise=True)
    assert_close(e.prefill(p_), reference(p_))
    assert [(s.external_tokens, s.num_scheduled) for s in e.steps] == [(64, 6)]
