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
        self.on_register = None  # called inside register, before it returns
        self.on_stream_enter = None  # called on entering on_stream(stream), with the stream
        self.load_stream = "load-stream"
        self.compute_stream = "compute-stream"  # the forward pass's (the main thread's) current stream
        self.default_stream = "default-stream"  # any other thread's, as in torch
        self._n = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # the calling thread's stack of current streams

    def _add(self, *call):
        sock_open = self.client is not None and self.client._sock is not None
        with self._lock:
            self.calls.append(call + (sock_open, threading.current_thread()))

    def names(self):
        return [c[0] for c in self.calls]

    def register(self, ptr, nbytes, device=None):
        self._add("register", ptr, mapping_of(ptr))
        if self.on_register is not None:
            self.on_register()
        return self.register_ok

    def unregister(self, ptr, device=None):
        self._add("unregister", ptr, mapping_of(ptr))
        if self.unregister_error:
            raise RuntimeError(self.unregister_error)

    def synchronize(self, what):
        if self.on_synchronize is not None:
            self.on_synchronize()
        self._add("synchronize", what)

    def stream(self, device):
        return self.load_stream

    def current(self):
        """The stream the calling thread queues work on now."""
        stack = getattr(self._local, "stack", None)
        if stack:
            return stack[-1]
        return self.compute_stream if threading.current_thread() is threading.main_thread() else self.default_stream

    def current_stream(self, device):
        return self.current()

    @contextlib.contextmanager
    def on_stream(self, stream):
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(stream)
        self._add("enter", stream)
        try:
            if self.on_stream_enter is not None:
                self.on_stream_enter(stream)
            yield
        finally:
            stack.pop()
            self._add("exit", stream)

    def keep(self, tensor, stream):
        self._add("keep", tensor, stream)

    def record(self, stream=None):
        with self._lock:
            self._n += 1
            ev = FakeEvent(self._n, stream)
        self._add("record", ev)
        if stream is None and self.on_save_record is not None:
            self.on_save_record(ev)
        return ev

    def wait(self, device, ev):
        self._add("wait", ev, self.current())

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
        # This thread holds the client's copy lock: the close must not have started its hooks.
        _closer(conn, cuda, state)
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


# ----------------------------------------------------------------- review fixes


def _to_disk_only(daemon):
    """Every stored chunk durable on disk, then a restart: RAM empty, the disk tier kept."""
    with Client(daemon.socket_path) as c:
        assert c.flush(30_000).durable
    daemon.kill()
    daemon.start()


def test_fence_keeps_a_save_event_recorded_while_it_waits(cuda):
    """A fence clears only the save event it waited for: one recorded meanwhile (the forward
    pass's last layer, while a fence on another thread waits) is still the one the close
    hook and the next fence wait for."""
    cp = copier()
    arena = torch.zeros(1 << 16, dtype=torch.uint8)
    cp._pinned = (arena.data_ptr(), arena.data_ptr() + arena.numel())
    cp.to_host(arena[:16], torch.ones(16, dtype=torch.uint8))
    done = []

    def on_sync():
        if not done:
            done.append(1)
            t = threading.Thread(target=cp.to_host, args=(arena[16:32], torch.ones(16, dtype=torch.uint8)))
            t.start()
            t.join()
    cuda.on_synchronize = on_sync
    t = threading.Thread(target=cp.fence)
    t.start()
    t.join()
    cuda.on_synchronize = None
    first, second = [c[1] for c in cuda.calls if c[0] == "record"]
    assert cp._save_event is second, "the fence dropped the save event recorded while it waited"
    cuda.calls.clear()
    cp._unpin(cp._pinned[0])
    assert [(c[0], c[1]) for c in cuda.calls][:1] == [("synchronize", second)]


def test_layerwise_loader_thread_never_fences(own_daemon, cuda, monkeypatch):
    """The loader thread (layerwise, streamed from disk) waits for its loads alone: the save
    state belongs to the forward pass's thread, whose saves run meanwhile."""
    long = prompt(64, 140)
    e = engine(own_daemon.socket_path, "gpuclose-loader", layerwise=True, prefix_caching=False)
    e.worker_connector.copier = copier()
    e.prefill(long[:70])
    e.close()
    _to_disk_only(own_daemon)
    fenced = []
    real = vllm_kv.CudaCopier.fence
    monkeypatch.setattr(vllm_kv.CudaCopier, "fence",
                        lambda self: (fenced.append(threading.current_thread().name), real(self))[1])
    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), real_start(self))[1])
    e = engine(own_daemon.socket_path, "gpuclose-loader", layerwise=True, prefix_caching=False)
    e.worker_connector.copier = copier()
    assert_close(e.prefill(long), reference(long))
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert "kvtier-load" in started, "the prefix was not streamed by the loader thread"
    assert fenced and "kvtier-load" not in fenced, fenced
    loader = [c for c in cuda.calls if c[-1].name == "kvtier-load"]
    assert all(c[1] == cuda.load_stream for c in loader if c[0] == "synchronize"), loader
    assert not any(s.load_error_blocks for s in e.steps)
    assert _chunks_held(own_daemon.socket_path, e.worker_connector, long) == 8
    e.close()


@pytest.mark.parametrize("mode", ["plain", "cross_layer", "layerwise", "inline"])
def test_scatter_runs_whole_on_the_load_stream(own_daemon, cuda, monkeypatch, mode):
    """Every load's scatter — staging tensor, host copy, index write into the KV — runs on
    the load stream, which waits once per step for an event the forward pass's thread
    records on its compute stream (not a loader thread's default stream, not once per
    scatter); each scatter marks the index tensors it reads as used by the load stream. The
    loads are waited for before their leases are released (whole: sync_loads) and per layer
    (the compute stream waits on the layer's event)."""
    kw = {"plain": {}, "cross_layer": {"layout_kind": "BLHNC", "cross_layer": True},
          "layerwise": {"layerwise": True}, "inline": {"layerwise": True, "layer_inline": True}}[mode]
    name = f"gpuclose-scatter-{mode}"
    p = prompt(65, 70)
    e = engine(own_daemon.socket_path, name, prefix_caching=False, **kw)
    e.worker_connector.copier = copier()
    e.prefill(p)
    e.close()
    if mode in ("layerwise", "inline"):
        _to_disk_only(own_daemon)  # streamed layer by layer, not copied at once
    streams = []

    def on(fn, at):
        def wrapped(*a, **k):
            streams.append(cuda.current())
            index = a[at]
            cuda._add("scatter", index if isinstance(index, tuple) else (index,))
            fn(*a, **k)
            streams.append(cuda.current())
        return wrapped
    monkeypatch.setattr(vllm_kv, "scatter_layer", on(vllm_kv.scatter_layer, 5))
    monkeypatch.setattr(vllm_kv.CrossLayer, "scatter", on(vllm_kv.CrossLayer.scatter, 3))
    cuda.calls.clear()
    e = engine(own_daemon.socket_path, name, prefix_caching=False, **kw)
    conn = e.worker_connector
    conn.copier = copier()
    real_release = conn._release_quietly

    def release(link, lease):
        if lease:
            cuda._add("release", lease)
        return real_release(link, lease)
    conn._release_quietly = release
    assert_close(e.prefill(p), reference(p))
    assert any(s.external_tokens for s in e.steps) and not any(s.load_error_blocks for s in e.steps)
    assert streams and set(streams) == {cuda.load_stream}, streams
    calls = cuda.calls
    main = threading.main_thread()
    # The load stream's one wait: for an event of the compute stream, recorded on the forward
    # pass's thread, before the first scatter.
    waits = [i for i, c in enumerate(calls) if c[0] == "wait" and c[2] == cuda.load_stream]
    first_scatter = min(i for i, c in enumerate(calls) if c[0] == "scatter")
    assert len(waits) == 1 and waits[0] < first_scatter, [calls[i] for i in waits]
    ev = calls[waits[0]][1]
    assert ev.stream == cuda.compute_stream and calls[waits[0]][-1] is main
    assert [c[-1] for c in calls if c[0] == "record" and c[1] is ev] == [main]
    for t in {c[-1] for c in calls}:
        mine, open_ = [c for c in calls if c[-1] is t], []
        for i, c in enumerate(mine):
            if c[0] == "enter":
                open_.append(i)
            elif c[0] == "exit":
                open_.pop()
            elif c[0] == "scatter":
                first = open_[0] if open_ else None
                assert first is not None, "a scatter outside on_load_stream"
                assert mine[first][:2] == ("enter", cuda.load_stream), mine[first:i + 1]
                kept = [k[1] for k in mine[first:i] if k[0] == "keep" and k[2] == cuda.load_stream]
                assert all(any(x is y for y in kept) for x in c[1]), \
                    "an index tensor read on the load stream was not marked as used by it"
    # Each load lease is released only after the load stream has finished with its slots.
    last = max(i for i, c in enumerate(calls) if c[0] == "scatter")
    release_at = next(i for i, c in enumerate(calls) if c[0] == "release" and i > last)
    assert any(c[:2] == ("synchronize", cuda.load_stream) for c in calls[last:release_at]), \
        "a load's lease was released before the load stream finished reading its slots"
    if mode in ("layerwise", "inline"):
        layer_events = [c[1] for c in calls if c[0] == "record" and c[1].stream == cuda.load_stream]
        waited = [c[1] for c in calls if c[0] == "wait" and c[2] == cuda.compute_stream]
        assert layer_events and set(layer_events) <= set(waited), "a layer's load was not waited for"
    e.close()


def test_a_failed_scatter_waits_for_the_load_stream_before_releasing(own_daemon, cuda, monkeypatch):
    """A scatter that raises after others were issued (the plain path) fails the load, and
    the lease is released only after the load stream has finished the copies already issued
    out of its slots."""
    name = "gpuclose-scatter-fails"
    p = prompt(71, 70)
    e = engine(own_daemon.socket_path, name, prefix_caching=False)
    e.worker_connector.copier = copier()
    e.prefill(p)
    e.close()
    real, n = vllm_kv.scatter_layer, []

    def scatter(*a, **k):
        n.append(1)
        if len(n) == 3:
            raise RuntimeError("test: a scatter fails")
        cuda._add("scatter")
        return real(*a, **k)
    monkeypatch.setattr(vllm_kv, "scatter_layer", scatter)
    e = engine(own_daemon.socket_path, name, prefix_caching=False)
    conn = e.worker_connector
    conn.copier = copier()
    real_release = conn._release_quietly

    def release(link, lease):
        if lease:
            cuda._add("release", lease)
        return real_release(link, lease)
    conn._release_quietly = release
    cuda.calls.clear()
    assert_close(e.prefill(p), reference(p))
    assert any(s.load_error_blocks for s in e.steps)
    calls = cuda.calls
    last = max(i for i, c in enumerate(calls) if c[0] == "scatter")
    release_at = next(i for i, c in enumerate(calls) if c[0] == "release" and i > last)
    assert any(c[:2] == ("synchronize", cuda.load_stream) for c in calls[last:release_at]), calls[last:release_at]
    e.close()


def _closer(conn, cuda, state):
    """Closes the connector's main connection on another thread, as a failed call does, and
    notes whether it had to wait (this thread holding the copy lock)."""
    c = conn.link.client
    cuda.client = c
    state["client"], state["gate"] = c, len(cuda.calls)
    closer = threading.Thread(target=conn.link.fail, args=(ConnectionLost("test: another call broke"),))
    state["closer"] = closer
    closer.start()
    closer.join(timeout=0.5)
    state["closer_waited"] = closer.is_alive()


def test_close_on_another_thread_during_a_loads_scatter(own_daemon, cuda):
    """A close while a load is scattering out of the pinned arena waits until that scatter is
    issued, then waits for the load stream, unpins, remaps; the load becomes load errors and
    the blocks are recomputed."""
    p = prompt(66, 70)
    e = engine(own_daemon.socket_path, "gpuclose-load-race", prefix_caching=False)
    conn = e.worker_connector
    conn.copier = copier()
    e.prefill(p)
    state = {}

    def on_enter(stream):
        if stream != cuda.load_stream or "closer" in state:
            return
        state["enters"] = state.get("enters", 0) + 1
        if state["enters"] == 2:  # the first scatter's (the first is begin_loads's wait)
            state["scatter"] = len(cuda.calls) - 1  # the scatter's own enter
            _closer(conn, cuda, state)
    cuda.on_stream_enter = on_enter

    def on_synchronize():  # the loads' wait (sync_loads) lets the close finish first
        closer = state.get("closer")
        if closer is not None and threading.current_thread() is not closer:
            closer.join(timeout=30)
    cuda.on_synchronize = on_synchronize
    assert_close(e.prefill(p), reference(p))
    state["closer"].join(timeout=30)
    cuda.on_stream_enter = cuda.on_synchronize = None
    assert state["closer_waited"], "the close did not wait for the scatter being issued"
    calls = cuda.calls
    mine = [i for i, c in enumerate(calls) if c[-1] is state["closer"]]
    assert [calls[i][0] for i in mine][-3:] == ["synchronize", "unregister", "remap"], [calls[i] for i in mine]
    assert calls[mine[-3]][1] == cuda.load_stream
    exits = [i for i, c in enumerate(calls[:mine[0]]) if c[:2] == ("exit", cuda.load_stream)]
    assert exits and exits[-1] > state["scatter"], "the close began inside the scatter"
    assert any(s.load_error_blocks for s in e.steps), "a load from a closed connection was trusted"
    e.close()


def test_close_on_another_thread_during_a_cross_layer_gather(own_daemon, cuda):
    """Cross-layer saves gather whole blocks in wait_for_save: a close on another thread then
    waits for the gather being issued; the save is dropped, quietly."""
    p = prompt(67, 70)
    e = engine(own_daemon.socket_path, "gpuclose-cross-race", layout_kind="BLHNC", cross_layer=True,
               prefix_caching=False)
    conn = e.worker_connector
    conn.copier = copier()
    state = {}

    def on_save_record(ev):
        if "closer" not in state:
            state["ev"] = ev
            _closer(conn, cuda, state)
    cuda.on_save_record = on_save_record

    def on_synchronize():  # the forward pass's fence waits for the close: it finds the save event
        closer = state.get("closer")
        if closer is not None and threading.current_thread() is not closer:
            closer.join(timeout=30)
    cuda.on_synchronize = on_synchronize
    assert_close(e.prefill(p), reference(p))
    state["closer"].join(timeout=30)
    cuda.on_save_record = cuda.on_synchronize = None
    assert state["closer_waited"], "the close did not wait for the gather being issued"
    calls = cuda.calls[state["gate"]:]
    mine = [x for x in calls if x[-1] is state["closer"]]
    assert [x[0] for x in mine] == ["synchronize", "synchronize", "unregister", "remap"], mine
    sync = calls.index(mine[0])
    saves = [x for x in calls[:sync] if x[0] == "record" and x[1].stream is None]
    assert mine[0][1] is saves[-1][1], "close waited for an event older than the last save copy"
    assert not [x for x in calls[sync:] if x[0] == "record" and x[1].stream is None], \
        "a save copy was issued into the arena after the close began"
    assert _chunks_held(own_daemon.socket_path, conn, p) == 0
    e.close()


def test_cross_layer_gather_on_a_closed_connection_is_no_error(own_daemon, cuda, caplog):
    """A cross-layer save whose connection closed between lost() and its gather is dropped
    as save_kv_layer drops one: no error logged."""
    p = prompt(68, 70)
    e = engine(own_daemon.socket_path, "gpuclose-cross-lost", layout_kind="BLHNC", cross_layer=True,
               prefix_caching=False)
    conn = e.worker_connector
    conn.copier = copier()
    real = conn._finish_saves

    def finish(saves):
        for s in saves:
            s.lost = lambda: False  # checked before the close below
        conn.link.client.close()
        return real(saves)
    conn._finish_saves = finish
    with caplog.at_level(logging.ERROR, logger="kvtier"):
        e.prefill(p)
    assert "gathering cross-layer blocks" not in caplog.text, caplog.text
    conn._finish_saves = real
    e.close()


def test_close_while_pinning(daemon, cuda):
    """Registration runs outside the copy lock: a close meanwhile is not held up by it, and
    finds no hook; the range is then unregistered at once and nothing stays pinned."""
    c = Client(daemon.socket_path)
    cuda.client = c
    keep = c._arena_bytes[:16]
    base = keep.data_ptr()
    cp = copier()
    state = {}

    def on_register():
        t = threading.Thread(target=c.close)
        t.start()
        t.join(timeout=5)
        state["blocked"] = t.is_alive()
        state["t"] = t
    cuda.on_register = on_register
    cp.pin(c)
    state["t"].join(timeout=30)
    assert not state["blocked"], "the close waited for a registration"
    assert cuda.names() == ["register", "remap", "unregister"], cuda.names()
    assert cuda.calls[2][1] == base
    assert not cp.registered and c.closed


def test_failed_register_and_unregister_clear_the_cuda_error(monkeypatch):
    """A refused cudaHostRegister / cudaHostUnregister leaves its error pending on the thread:
    the runtime clears it (cudaGetLastError, through torch's bindings if they have it, else
    the loaded libcudart); registration asks for a portable pinning."""
    class Cudart:
        def __init__(self, rc, with_get=True):
            self.rc, self.calls = rc, []
            if with_get:
                self.cudaGetLastError = lambda: self.calls.append("cudaGetLastError")

        def cudaHostRegister(self, ptr, n, flags):
            self.calls.append(("cudaHostRegister", flags))
            return self.rc

        def cudaHostUnregister(self, ptr):
            self.calls.append("cudaHostUnregister")
            return self.rc

    monkeypatch.setattr(cuda_host, "_loaded_libraries", lambda stem: [])
    rt = cuda_host.Runtime()
    for rc, ok in ((0, True), (2, False)):
        fake = Cudart(rc)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
        assert rt.register(1 << 20, 4096) is ok
        if ok:
            rt.unregister(1 << 20)
            assert fake.calls == [("cudaHostRegister", 1), "cudaHostUnregister"]
        else:
            with pytest.raises(RuntimeError, match="cudaHostUnregister"):
                rt.unregister(1 << 20)
            assert fake.calls == [("cudaHostRegister", 1), "cudaGetLastError",
                                  "cudaHostUnregister", "cudaGetLastError"]

    fake = Cudart(2, with_get=False)  # torch's bindings (1.13 and later) lack cudaGetLastError
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    # Two CUDA runtimes mapped (torch's and, say, cupy's), in an order that says nothing of
    # which one torch uses, and HIP's: each one's pending error is cleared.
    maps = {"libcudart": ["/opt/cupy/libcudart.so.12", "/torch/lib/libcudart.so.12"],
            "libamdhip64": ["/opt/rocm/lib/libamdhip64.so.6"]}
    monkeypatch.setattr(cuda_host, "_loaded_libraries", lambda stem: maps.get(stem, []))
    monkeypatch.setattr(cuda_host, "_get_last_error", {})
    cleared = []

    class Lib:
        def __init__(self, path):
            self.path = path

        def __getattr__(self, name):
            return lambda: cleared.append((self.path.rsplit("/", 1)[-1], name)) or 0
    monkeypatch.setattr(cuda_host.ctypes, "CDLL", Lib)
    assert rt.register(1 << 20, 4096) is False
    assert sorted(cleared) == [("libamdhip64.so.6", "hipGetLastError"), ("libcudart.so.12", "cudaGetLastError"),
                               ("libcudart.so.12", "cudaGetLastError")], cleared
    assert {p for p in cuda_host._get_last_error} == {p for v in maps.values() for p in v}
    cleared.clear()
    maps["libcudart"].append("/later/libcudart.so.11")  # loaded after the first refusal
    assert rt.register(1 << 20, 4096) is False
    assert len(cleared) == 4, cleared
    monkeypatch.setattr(cuda_host, "_loaded_libraries", lambda stem: [])
    assert rt.register(1 << 20, 4096) is False  # nothing to clear it with: logged, no exception


def test_a_failed_fence_leaves_nothing_for_the_next(daemon, cuda):
    """A fence that raises (a device fault) resets the copier's save state: a later fence
    copies no stale bounce bytes into slots whose lease was given up."""
    cuda.register_ok = False  # the bounce buffer
    c = Client(daemon.socket_path)
    cp = copier()
    cp.pin(c)
    view = stored_slot(c, "gpuclose-fence-fault")
    before = view.clone()  # whatever the slot held (the arena is not cleared between tests)
    with c.copies:
        cp.to_host(view, pattern(view.numel(), seed=5), c)

    def fault():
        raise RuntimeError("cudaErrorLaunchFailure")
    cuda.on_synchronize = fault
    with pytest.raises(RuntimeError):
        cp.fence()
    cuda.on_synchronize = None
    assert cp._save_event is None and not cp._drain and cp._bounce_used == 0
    cp.fence()
    assert torch.equal(view, before), "a fence after a failed one copied stale bounce bytes"
    c.close()


def test_fence_drain_skips_a_closed_client(daemon, cuda):
    """A bounce-buffer copy drained by a fence after its client closed is skipped: nothing is
    written through the closed client's (detached) arena."""
    cuda.register_ok = False
    c = Client(daemon.socket_path)
    cp = copier()
    cp.pin(c)
    view = stored_slot(c, "gpuclose-drain-closed")
    with c.copies:
        cp.to_host(view, pattern(view.numel(), seed=6), c)
    c.close()
    cp.fence()
    assert not view.any(), "the fence wrote into a closed client's arena"
    assert not cp._drain and cp._bounce_used == 0


def test_connector_fence_fault_fails_the_link(own_daemon, cuda):
    """A fence error in wait_for_save drops the connection with the step's save leases:
    nothing is committed."""
    p = prompt(69, 70)
    e = engine(own_daemon.socket_path, "gpuclose-fence-link", prefix_caching=False)
    conn = e.worker_connector
    conn.copier = copier()
    state = {}

    def fault():
        if threading.current_thread() is threading.main_thread() and "c" not in state:
            state["c"] = conn.link.client
            raise RuntimeError("cudaErrorLaunchFailure")
    cuda.on_synchronize = fault
    e.prefill(p)
    cuda.on_synchronize = None
    assert state["c"].closed
    assert _chunks_held(own_daemon.socket_path, conn, p) == 0
    e.close()


def test_peer_push_reads_slots_under_the_copy_lock(daemon, monkeypatch):
    """PeerTransport reads the chunks it pushes out of its slots under the copy lock: a close
    on another thread meanwhile waits, and the peer gets the chunks' bytes, never the zeros of
    a detached arena."""
    import array
    from kvtier import vllm_pd as pd
    from kvtier.link import Link
    from kvtier.vllm_keys import TokenKeys

    link = Link(daemon.socket_path, ("gpuclose-push", "uint8/KV_2LTD", 1, 0), timeout=5.0)
    c = link.get()
    toks = list(range(300, 300 + 2 * CHUNK))
    s = c.scope("gpuclose-push", "uint8/KV_2LTD")
    chunks = [pattern(4096, seed=11), pattern(4096, seed=12)]
    c.store(c.tokens(s, toks), chunks)

    class Peer:
        closed = False

        def scope(self, *a):
            return 1

        def tokens(self, scope, tokens, skip=0):
            return c.tokens(scope, tokens, skip)

        def store(self, keys, data):
            self.got = [bytes(d) for d in data]
            state["closer"].join(timeout=30)  # the close finishes while the chunks are sent
            return len(data)
    peer = Peer()
    t = pd.PeerTransport(link)
    monkeypatch.setattr(t, "_peer", lambda addr: peer)
    state = {}
    real = kclient.Client.slot_tensor

    def slot_tensor(self, slot):
        if "closer" not in state:
            state["closer"] = threading.Thread(target=self.close)
            state["closer"].start()
            state["closer"].join(timeout=0.5)
            state["waited"] = state["closer"].is_alive()
        return real(self, slot)
    monkeypatch.setattr(kclient.Client, "slot_tensor", slot_tensor)
    job = pd.Job("t-lock", "", TokenKeys(array.array("I", toks)), 2 * CHUNK, "peer:1")
    assert t._push_one(job)  # no release on the closed connection: its lease ended with it
    state["closer"].join(timeout=30)
    assert state["waited"], "the close did not wait for the slots being read"
    assert peer.got == [bytes(x.numpy()) for x in chunks]
    link.close()


def _push_setup(daemon, name, toks):
    from kvtier import vllm_pd as pd
    from kvtier.link import Link
    link = Link(daemon.socket_path, (name, "uint8/KV_2LTD", 1, 0), timeout=5.0)
    c = link.get()
    s = c.scope(name, "uint8/KV_2LTD")
    chunks = [pattern(4096, seed=21 + i) for i in range(len(toks) // CHUNK)]
    c.store(c.tokens(s, toks), chunks)

    class Peer:
        closed = False

        def __init__(self):
            self.calls = []

        def scope(self, *a):
            return 1

        def tokens(self, scope, tokens, skip=0):
            return c.tokens(scope, tokens, skip)

        def store(self, keys, data):
            self.calls.append((keys.skip if hasattr(keys, "skip") else None, [bytes(d) for d in data]))
            return len(data)
    return pd, link, c, chunks, Peer()


def test_peer_push_copies_and_sends_a_batch_at_a_time(daemon, monkeypatch):
    """A push copies its chunks out of the arena and sends them a batch at a time (here one
    chunk each), so it never holds a second copy of the whole transfer; each batch is keyed
    from where the previous one ended."""
    import array
    from kvtier.vllm_keys import TokenKeys
    toks = list(range(500, 500 + 3 * CHUNK))
    pd, link, c, chunks, peer = _push_setup(daemon, "gpuclose-push-batches", toks)
    monkeypatch.setattr(pd, "PUSH_BATCH_BYTES", 4096)
    t = pd.PeerTransport(link)
    monkeypatch.setattr(t, "_peer", lambda addr: peer)
    built = []
    keys = TokenKeys(array.array("I", toks))
    real_build = TokenKeys.build
    monkeypatch.setattr(TokenKeys, "build", lambda self, cl, scope, end, skip: (
        built.append((cl is peer, end, skip)), real_build(self, cl, scope, end, skip))[1])
    assert t._push_one(pd.Job("t-batches", "", keys, 3 * CHUNK, "peer:1"))
    assert [d for _, d in peer.calls] == [[bytes(x.numpy())] for x in chunks]
    assert [b[1:] for b in built if b[0]] == [(CHUNK, 0), (2 * CHUNK, CHUNK), (3 * CHUNK, 2 * CHUNK)]
    link.close()


def test_peer_push_on_a_closed_local_connection_keeps_the_peer(daemon, monkeypatch):
    """The local connection closing before a push copies its slots fails that push alone: the
    peer's connection, healthy, is kept for the next push."""
    import array
    from kvtier.vllm_keys import TokenKeys
    toks = list(range(700, 700 + 2 * CHUNK))
    pd, link, c, chunks, peer = _push_setup(daemon, "gpuclose-push-local-closed", toks)
    t = pd.PeerTransport(link)
    t._peers["peer:1"] = peer
    real = kclient.Client.prepare_retrieve

    def prepare_then_close(self, *a, **k):
        got = real(self, *a, **k)
        self.close()
        return got
    monkeypatch.setattr(kclient.Client, "prepare_retrieve", prepare_then_close)
    t.push(pd.Job("t-local-closed", "", TokenKeys(array.array("I", toks)), 2 * CHUNK, "peer:1"))
    t._queue.put(None)
    t._thread.join(timeout=30)
    assert t.state("t-local-closed") == pd.FAILED
    assert t._peers.get("peer:1") is peer, "a healthy peer connection was dropped for a local close"
    assert not peer.calls
    link.close()
