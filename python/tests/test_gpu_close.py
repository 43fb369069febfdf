"""Closing a connection whose arena the CUDA copier pinned (vllm_kv.CudaCopier, client.close).

The CUDA driver's registration of the arena (cudaHostRegister) points at the daemon's
physical pages, not at whatever the address range maps later: a device-to-host copy still
queued when the client detaches its arena would land in slots the daemon hands to other
connections. So close must, in order, stop new copies, wait for the queued ones, unregister
the range, and only then remap the arena and close the socket.

There is no GPU here. The copier makes every CUDA call through kvtier.cuda_host.runtime, and
these tests put a recorder there: the copies themselves are real CPU copies into the daemon's
real arena, and the recorder logs each CUDA call in order with what the address range maps
at that moment (read from /proc/self/maps) and whether the socket is still open.
"""

import contextlib
import logging
import threading

import pytest
import torch

from kvtier import client as kclient
from kvtier import cuda_host, vllm_kv
from kvtier.client import Client, ConnectionLost

from conftest import CHUNK
from harness_util import assert_close, engine, prompt, reference

DETACHED = "kvtier-detached-arena"  # the memfd client._remap_private maps over a closed arena


def daemons(name):
    """Whether a mapping is the daemon's arena (its memfd), not the detached replacement."""
    return name is not None and "memfd:kvtier" in name and DETACHED not in name


def mapping_of(ptr):
    """The path /proc/self/maps gives for the mapping holding ptr (the memfd's name)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return None


class FakeEvent:
    def __init__(self, n, stream):
        self.n, self.stream = n, stream

    def query(self):
        return True  # the "copies" are synchronous CPU copies: always done

    def __repr__(self):
        return f"event{self.n}"


class Recorder:
    """Stands in for cuda_host.Runtime: records every call in order, with the state of the
    watched client's arena mapping and socket."""

    def __init__(self):
        self.calls = []
        self.client = None  # whose socket state each call notes
        self.register_ok = True
        self.unregister_error = None
        self.on_save_record = None  # called inside to_host, after a save copy is issued
        self.on_synchronize = None  # called before a synchronize is recorded
        self.load_stream = "load-stream"
        self._n = 0
        self._lock = threading.Lock()

    def _add(self, *call):
        sock_open = self.client is not None and self.client._sock is not None
        with self._lock:
            self.calls.append(call + (sock_open, threading.current_thread()))

    def names(self):
        return [c[0] for c in self.calls]

    def register(self, ptr, nbytes):
        self._add("register", ptr, mapping_of(ptr))
        return self.register_ok

    def unregister(self, ptr):
        self._add("unregister", ptr, mapping_of(ptr))
        if self.unregister_error:
            raise RuntimeError(self.unregister_error)

    def synchronize(self, what):
        if self.on_synchronize is not None:
            self.on_synchronize()
        self._add("synchronize", what)

    def stream(self, device):
        return self.load_stream

    def on_stream(self, stream):
        return contextlib.nullcontext()

    def record(self, stream=None):
        with self._lock:
            self._n += 1
            ev = FakeEvent(self._n, stream)
        self._add("record", ev)
        if stream is None and self.on_save_record is not None:
            self.on_save_record(ev)
        return ev

    def wait(self, device, ev):
        self._add("wait", ev)

    def pinned(self, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)


@pytest.fixture
def cuda(monkeypatch):
    """The recorder in place of the CUDA runtime; the arena's remap logged in the same list."""
    rec = Recorder()
    monkeypatch.setattr(cuda_host, "runtime", rec)
    real_remap = kclient._remap_private

    def remap(addr, length):
        rec._add("remap", addr, mapping_of(addr))
        return real_remap(addr, length)
    monkeypatch.setattr(kclient, "_remap_private", remap)
    return rec


def copier():
    return vllm_kv.CudaCopier(torch.device("cpu"), bounce_bytes=1 << 20)


def stored_slot(c, name, nbytes=4096):
    s = c.scope(name, "uint8/KV_2LTD")
    slots = c.prepare_store(c.tokens(s, list(range(7, 7 + CHUNK))), [nbytes], lease_ms=60000)
    return c.slot_tensor(slots.slots[0])


def pattern(n, seed=3):
    return ((torch.arange(n) * 31 + seed) % 251).to(torch.uint8)


def test_close_waits_for_copies_then_unpins_then_remaps(daemon, cuda):
    c = Client(daemon.socket_path)
    cuda.client = c
    cp = copier()
    cp.pin(c)
    base = c._arena_bytes.data_ptr()
    view = stored_slot(c, "gpuclose-order")
    src = pattern(view.numel())
    with c.copies:
        cp.to_host(view, src)
    assert torch.equal(view, src)  # the pinned path copied into the shared slot
    assert not cp._drain, "a copy into the pinned arena went through the bounce buffer"
    c.close()

    assert cuda.names() == ["register", "record", "synchronize", "synchronize", "unregister", "remap"]
    reg, rec, sync_save, sync_load, unreg, remap = cuda.calls
    assert reg[1] == unreg[1] == remap[1] == base
    assert daemons(reg[2]), reg
    assert sync_save[1] is rec[1], "close did not wait for the last save copy's event"
    assert sync_load[1] == cuda.load_stream
    # Unpinned while the range still maps the daemon's pages and the lease is still held.
    assert daemons(unreg[2]) and unreg[3], unreg
    assert remap[3], "the socket closed before the arena was remapped"
    assert DETACHED in mapping_of(base)
    assert c.closed and c._sock is None and not cp.registered


def test_close_twice_and_from_two_threads_unpins_once(daemon, cuda):
    for threads in (1, 2):
        cuda.calls.clear()
        c = Client(daemon.socket_path)
        cp = copier()
        cp.pin(c)
        keep = c._arena_bytes[:16]  # a view that outlives the client keeps the range mapped
        base = keep.data_ptr()
        start = threading.Barrier(threads)

        def close():
            start.wait()
            c.close()
        ts = [threading.Thread(target=close) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in ts)
        c.close()  # and once more: nothing left to do
        assert cuda.names().count("register") == 1
        assert cuda.names().count("unregister") == 1, cuda.names()
        assert cuda.names().count("remap") == 1
        assert DETACHED in mapping_of(base)


def test_close_with_nothing_pinned(daemon, cuda):
    c = Client(daemon.socket_path)  # no copier pinned it
    c.close()
    assert cuda.names() == ["remap"]

    cuda.calls.clear()
    cuda.register_ok = False  # CUDA refuses the registration: copies go through the bounce buffer
    c = Client(daemon.socket_path)
    cp = copier()
    cp.pin(c)
    cp.pin(c)  # not tried again for the same arena
    assert not cp.registered
    view = stored_slot(c, "gpuclose-bounce")
    src = pattern(view.numel(), seed=9)
    with c.copies:
        cp.to_host(view, src)
    assert cp._drain, "a copy into an unpinned arena did not go through the bounce buffer"
    cp.fence()
    assert torch.equal(view, src)
    c.close()
    assert cuda.names() == ["register", "record", "synchronize", "synchronize", "remap"]  # fence's two


def test_no_copy_and_no_pin_after_close(daemon, cuda):
    c = Client(daemon.socket_path)
    view = stored_slot(c, "gpuclose-after")
    c.close()
    with pytest.raises(ConnectionLost):
        with c.copies:
            view.fill_(1)  # never reached
    assert c.on_close(lambda: None) is False
    cp = copier()
    cp.pin(c)
    assert not cp.registered and "register" not in cuda.names()


def test_unregister_error_is_logged_not_raised(daemon, cuda, caplog):
    cuda.unregister_error = "cudaErrorHostMemoryNotRegistered"
    c = Client(daemon.socket_path)
    cp = copier()
    cp.pin(c)
    keep = c._arena_bytes[:16]
    base = keep.data_ptr()
    with caplog.at_level(logging.ERROR, logger="kvtier"):
        c.close()
    assert "cudaErrorHostMemoryNotRegistered" in caplog.text
    assert cuda.names()[-2:] == ["unregister", "remap"]
    assert c.closed and c._sock is None and DETACHED in mapping_of(base)


def _chunks_held(socket_path, conn, tokens):
    """How many chunks of the prompt the daemon holds under the connector's scope."""
    model, fmt, world, rank = conn.link.scope_args
    with Client(socket_path) as c:
        return c.lookup(c.tokens(c.scope(model, fmt, world_size=world, rank=rank), tokens)).chunks


@pytest.mark.parametrize("mode", ["pinned", "bounce", "layerwise", "cross_layer"])
def test_cuda_copier_saves_and_loads_exact_bytes(own_daemon, cuda, mode):
    """The CUDA copier's own logic (pinned copies; the bounce buffer when CUDA refuses the
    arena; per-layer save events with layerwise; whole blocks with cross-layer KV) moves the
    right bytes: a prompt saved through it loads back with the same logits."""
    cuda.register_ok = mode != "bounce"
    kw = {"layerwise": True} if mode == "layerwise" else {}
    if mode == "cross_layer":
        kw = {"layout_kind": "BLHNC", "cross_layer": True}
    name = f"gpuclose-bytes-{mode}"
    p = prompt(61, 70)
    e = engine(own_daemon.socket_path, name, prefix_caching=False, **kw)
    e.worker_connector.copier = copier()
    assert_close(e.prefill(p), reference(p))
    assert _chunks_held(own_daemon.socket_path, e.worker_connector, p) == 4
    assert_close(e.prefill(p), reference(p))
    assert any(s.external_tokens for s in e.steps), "the second prefill loaded nothing"
    assert not any(s.load_error_blocks for s in e.steps)
    e.close()
    names = cuda.names()
    assert names.count("register") == 1
    assert names.count("unregister") == (0 if mode == "bounce" else 1)


def test_cpu_connector_makes_no_cuda_call(own_daemon, cuda):
    p = prompt(62, 70)
    e = engine(own_daemon.socket_path, "gpuclose-cpu", prefix_caching=False)
    assert type(e.worker_connector.copier) is vllm_kv.HostCopier
    assert_close(e.prefill(p), reference(p))
    assert_close(e.prefill(p), reference(p))
    assert any(s.external_tokens for s in e.steps), "the second prefill loaded nothing"
    e.close()
    assert set(cuda.names()) <= {"remap"}, cuda.names()


def test_close_on_another_thread_during_a_save(own_daemon, cuda):
    """The forward pass is issuing a layer's save copies into the pinned arena when another
    thread closes the connection (Link.fail, as a failed call on it does). The close waits
    until those copies are issued, then waits for them, unpins, remaps, closes the socket;
    the save issues nothing more into that arena and is dropped; a reconnected client is
    pinned anew, and shutdown unpins it."""
    e = engine(own_daemon.socket_path, "gpuclose-race", prefix_caching=False)
    conn = e.worker_connector
    conn.copier = copier()
    state = {}

    def on_save_record(ev):
        state["n"] = state.get("n", 0) + 1
        if state["n"] != 10:  # layer 1's second copy (8 per layer: 4 chunks x K, V)
            return
        c = conn.link.client
        cuda.client = c
        state["client"], state["gate"] = c, len(cuda.calls)
        closer = threading.Thread(target=conn.link.fail, args=(ConnectionLost("test: another call broke"),))
        state["closer"] = closer
        closer.start()
        closer.join(timeout=0.5)
        # This thread holds the client's copy lock: the close must not have started its hooks.
        state["closer_waited"] = closer.is_alive()
        state["early"] = [x[0] for x in cuda.calls[state["gate"]:] if x[0] in ("synchronize", "unregister", "remap")]
    cuda.on_save_record = on_save_record

    def on_synchronize():
        # The forward pass's own fence (wait_for_save) waits for the close to finish, so the
        # close always finds the step's last save copy still to wait for.
        closer = state.get("closer")
        if closer is not None and threading.current_thread() is not closer:
            closer.join(timeout=30)
    cuda.on_synchronize = on_synchronize
    p = prompt(63, 70)
    assert_close(e.prefill(p), reference(p))
    state["closer"].join(timeout=30)
    assert not state["closer"].is_alive()
    assert state["closer_waited"] and state["early"] == [], state

    calls = cuda.calls[state["gate"]:]
    closer = [i for i, x in enumerate(calls) if x[-1] is state["closer"]]
    assert [calls[i][0] for i in closer] == ["synchronize", "synchronize", "unregister", "remap"], calls
    sync, unreg, remap = closer[0], closer[2], closer[3]
    saves = [x for x in calls[:sync] if x[0] == "record" and x[1].stream is None]
    assert calls[sync][1] is saves[-1][1], "close waited for an event older than the last save copy"
    assert calls[closer[1]][1] == cuda.load_stream
    assert not [x for x in calls[sync:] if x[0] == "record" and x[1].stream is None], \
        "a save copy was issued into the arena after the close began"
    assert daemons(calls[unreg][2]) and calls[unreg][3], "unpinned after the remap or the socket close"
    assert calls[remap][3], "the socket closed before the arena was remapped"
    assert state["client"].closed and state["client"]._sock is None
    assert _chunks_held(own_daemon.socket_path, conn, p) == 0  # the save was dropped

    cuda.on_save_record = cuda.on_synchronize = None
    assert_close(e.prefill(p), reference(p))  # reconnects: its arena is pinned, the save lands
    assert _chunks_held(own_daemon.socket_path, conn, p) == 4
    e.close()
    names = cuda.names()
    assert names.count("register") == 2 and names.count("unregister") == 2, names
    assert names.index("unregister") < names.index("register", names.index("register") + 1)
