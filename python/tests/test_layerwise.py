"""Layerwise loads from the disk tier (docs/layerwise.md): the connector streams a prefix
that is only on disk layer by layer, and a damaged layer becomes a recompute, never wrong KV."""

import glob
import os
import struct
import threading

import pytest

from kvtier import protocol as p
from kvtier.client import Client
from harness_util import assert_close, engine, prompt, reference


def _to_disk_only(daemon):
    """Waits until every stored chunk is durable on disk, then restarts the daemon: its RAM
    starts empty, its disk tier keeps the chunks."""
    with Client(daemon.socket_path) as c:
        assert c.flush(30_000).durable
    daemon.kill()
    daemon.start()


def _record_waits(monkeypatch):
    """Counts LAYER_WAIT answers that said a layer was still loading in the background."""
    streamed = []
    real = Client.layer_wait

    def layer_wait(self, lease, layer, timeout=None):
        r = real(self, lease, layer, timeout)
        streamed.append(r.ready != p.ALL_LAYERS)
        return r

    monkeypatch.setattr(Client, "layer_wait", layer_wait)
    return streamed


def test_layerwise_streams_a_prefix_from_disk(own_daemon, monkeypatch):
    """Four chunks on disk only load in the request's first step, layer by layer, and give the
    logits of a full prefill."""
    p_ = prompt(31, 70)
    engine(own_daemon.socket_path, "lw-disk", layerwise=True).prefill(p_)
    _to_disk_only(own_daemon)
    streamed = _record_waits(monkeypatch)
    e = engine(own_daemon.socket_path, "lw-disk", layerwise=True)
    assert_close(e.prefill(p_), reference(p_))
    assert [(s.external_tokens, s.num_scheduled) for s in e.steps] == [(64, 6)]
    assert not e.steps[0].load_error_blocks
    assert any(streamed), "every LAYER_WAIT answered at once: nothing was streamed from disk"


def test_layerwise_ram_hit_is_copied_before_the_pass(own_daemon, monkeypatch):
    """A prefix all in RAM: the first LAYER_WAIT says every layer is in, so the connector copies
    it in start_load_kv, as without layerwise, and starts no per-layer copier; the logits are
    those of a full prefill."""
    p_ = prompt(34, 70)
    engine(own_daemon.socket_path, "lw-ram", layerwise=True).prefill(p_)
    streamed = _record_waits(monkeypatch)
    e = engine(own_daemon.socket_path, "lw-ram", layerwise=True)
    assert_close(e.prefill(p_), reference(p_))
    assert [(s.external_tokens, s.num_scheduled) for s in e.steps] == [(64, 6)]
    assert streamed and not any(streamed), "the prefix was not all in RAM"
    assert not e.worker_connector._layer_ready, "a RAM hit started the per-layer copier"
    assert e.worker_connector._stream is None, "a RAM hit was left to wait_for_layer_load"


def test_layer_inline_streams_the_same_bytes(own_daemon, monkeypatch):
    """With layer_inline the streamed layers are copied in wait_for_layer_load rather than by a
    copier thread: the same logits, no copier thread started; without it, the copier thread."""
    p_ = prompt(35, 70)
    engine(own_daemon.socket_path, "lw-thread", layerwise=True).prefill(p_)
    for thread in (True, False):
        _to_disk_only(own_daemon)
        streamed = _record_waits(monkeypatch)
        started = []
        real = threading.Thread.start
        monkeypatch.setattr(threading.Thread, "start",
                            lambda self: (started.append(self.name), real(self))[1])
        e = engine(own_daemon.socket_path, "lw-thread", layerwise=True, layer_inline=not thread)
        assert_close(e.prefill(p_), reference(p_))
        monkeypatch.undo()
        assert [(s.external_tokens, s.num_scheduled) for s in e.steps] == [(64, 6)]
        assert not e.steps[0].load_error_blocks and any(streamed)
        assert ("kvtier-load" in started) == thread, started
        assert e.worker_connector._stream is None, "the step's stream was not finished"


@pytest.mark.parametrize("inline", [False, True])
def test_daemon_killed_mid_stream_is_recomputed(own_daemon, monkeypatch, inline):
    """The daemon dies before layer 1 of a prefix streaming from disk is in: the load becomes
    load errors, the request is recomputed, and its logits are those of a full prefill (layer 0,
    already copied, is overwritten by the recompute)."""
    from kvtier.vllm import KVTierConnector

    p_ = prompt(36, 70)
    engine(own_daemon.socket_path, "lw-kill", layerwise=True).prefill(p_)
    _to_disk_only(own_daemon)
    real = KVTierConnector._await_layer
    killed = []

    def await_layer(self, link, load, layer):
        if layer == 1 and load.layered and not killed:
            own_daemon.kill()
            killed.append(layer)
            load.ready = min(load.ready, layer)  # as if layer 1 were still being read
        return real(self, link, load, layer)

    monkeypatch.setattr(KVTierConnector, "_await_layer", await_layer)
    e = engine(own_daemon.socket_path, "lw-kill", layerwise=True, layer_inline=inline, prefix_caching=False)
    assert_close(e.prefill(p_), reference(p_))
    first, retry = e.steps
    assert first.external_tokens == 64 and first.load_error_blocks
    assert retry.num_computed_before == 0 and retry.num_scheduled == 70
    assert killed and e.worker_connector._stream is None


def test_use_layerwise_is_the_layerwise_setting(own_daemon, monkeypatch):
    """LMCache's use_layerwise turns on the same streaming."""
    p_ = prompt(32, 40)
    engine(own_daemon.socket_path, "lw-lmcache").prefill(p_)
    _to_disk_only(own_daemon)
    streamed = _record_waits(monkeypatch)
    e = engine(own_daemon.socket_path, "lw-lmcache", layerwise=None, use_layerwise="true")
    assert_close(e.prefill(p_), reference(p_))
    assert e.steps[0].external_tokens == 32 and any(streamed)


def _damage_one_record(disk_dir):
    """Flips a byte in the middle of the payload of the second record of the first segment
    (record format version 2: 4096-byte header block, then the payload)."""
    path = sorted(glob.glob(os.path.join(disk_dir, "*.seg")))[0]
    with open(path, "r+b") as f:
        data = f.read()
        off, seen = 0, 0
        while off + 4096 <= len(data):
            if data[off:off + 4] == b"KVTD":
                (n,) = struct.unpack_from("<Q", data, off + 48)
                if seen == 1:
                    at = off + 4096 + n // 2 + 123
                    f.seek(at)
                    f.write(bytes([data[at] ^ 0xFF]))
                    return
                seen += 1
                off += 4096 + (n + 4095) // 4096 * 4096
            else:
                off += 4096
    raise AssertionError("no second record found")


def test_damaged_layer_on_disk_is_recomputed(own_daemon, monkeypatch):
    """A byte flipped in one chunk on disk: that chunk and those after it are load errors,
    recomputed, and the logits are still those of a full prefill."""
    p_ = prompt(33, 70)
    engine(own_daemon.socket_path, "lw-damage", layerwise=True).prefill(p_)
    with Client(own_daemon.socket_path) as c:
        assert c.flush(30_000).durable
    own_daemon.kill()
    _damage_one_record(os.path.join(own_daemon.workdir, "disk"))
    own_daemon.start()
    e = engine(own_daemon.socket_path, "lw-damage", layerwise=True)
    assert_close(e.prefill(p_), reference(p_))
    first = e.steps[0]
    assert first.external_tokens == 64 and first.load_error_blocks, "the damage went unnoticed"


def test_ttft_bench_runs_and_checks_logits(kvtier_bin, tmp_path, capsys):
    """The TTFT benchmark (python -m kvtier.harness.bench_layerwise) at a small size: every
    measured request, from disk after its RAM tier is cleared and from RAM, loads the whole prefix without
    load errors and gives the logits of the model computing the prefix itself (the benchmark
    raises otherwise). No timing is checked."""
    from kvtier.harness import bench_layerwise

    assert bench_layerwise.main(["--bin", kvtier_bin, "--workdir", str(tmp_path), "--layers", "4",
                                 "--hidden", "256", "--prefix", "512", "--rounds", "1", "--ram-pairs", "2",
                                 "--max-new", "64", "--cases", "1,eq"]) == 0
    out = capsys.readouterr().out
    assert out.count("x (") == 10 and "RAM hit" in out and "RAM tier cleared" in out
    assert "CPU time per request" in out


def test_ttft_bench_with_restarts(kvtier_bin, tmp_path, capsys):
    """The benchmark's other way to empty RAM, a daemon restart before every disk hit."""
    from kvtier.harness import bench_layerwise

    assert bench_layerwise.main(["--bin", kvtier_bin, "--workdir", str(tmp_path), "--layers", "4",
                                 "--hidden", "256", "--prefix", "512", "--rounds", "1", "--ram-pairs", "0",
                                 "--max-new", "64", "--cases", "1", "--evict", "restart"]) == 0
    out = capsys.readouterr().out
    assert out.count("x (") == 5 and "daemon restarted" in out


def test_layer_not_loaded_in_time_fails_the_steps_layered_loads(own_daemon):
    """The copier thread is held inside a LAYER_WAIT past wait_for_layer_load's bound: the pass
    must not run on KV that never arrived — the step's layered loads become load errors and
    are recomputed (same logits as without kvtier)."""
    p = prompt(43, 70)
    engine(own_daemon.socket_path, "late-layer").prefill(p)
    e = engine(own_daemon.socket_path, "late-layer", layerwise=True, prefix_caching=False)
    conn = e.worker_connector
    real = conn._await_layer
    held, release = threading.Event(), threading.Event()

    def await_layer(link, load, layer):
        if threading.current_thread().name != "kvtier-load":
            return  # start_load_kv's first wait: leave the load to the copier thread
        if layer == 1:
            held.set()
            release.wait(30)  # a layer that does not come (released once the pass gave up on it)
        real(link, load, layer)
    conn._await_layer = await_layer
    conn._layer_wait_limit = lambda: 0.0 if held.is_set() else 30.0  # the bound, reached once held
    real_save = conn.wait_for_save

    def wait_for_save():
        release.set()
        real_save()
    conn.wait_for_save = wait_for_save
    assert_close(e.prefill(p), reference(p))
    assert held.is_set()
    assert any(s.load_error_blocks for s in e.steps), "the late layer's loads were not failed"


def test_layer_wait_limit_covers_a_layer_wait():
    from kvtier.vllm import KVTierConnector, Settings

    class _C:
        settings = Settings(lease_ms=300_000, timeout=5.0)
    assert KVTierConnector._layer_wait_limit(_C()) >= 305.0
