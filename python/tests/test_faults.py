"""Daemon failures while the engine runs: misses and load errors, never exceptions or hangs."""

import os
import signal
import time

import pytest

from kvtier.client import Client
from harness_util import assert_close, engine, prompt, reference


def _wait_until(cond, what, limit=30.0):
    """Polls a condition the daemon reaches asynchronously; a generous limit, not a timing assertion."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


def _stopped(pid):
    """Whether every thread of pid is stopped: kill(SIGSTOP) returns before a thread busy on
    another CPU has taken the signal, and a busy machine can widen that gap."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue  # the thread exited
    return bool(states) and all(s in ("T", "t") for s in states)


def _tier_objects(client, name):
    return next(t["objects"] for t in client.stats()["tiers"] if t["name"] == name)


def _cached_chunks(socket_path, model, tokens):
    """How many leading chunks of tokens the daemon holds for the harness's scope (model name, fp32, KV_2LTD)."""
    with Client(socket_path) as c:
        return c.lookup(c.tokens(c.scope(model, "float32/KV_2LTD"), tokens)).chunks


def test_daemon_killed_before_the_lookup_is_a_miss(own_daemon):
    p = prompt(20, 70)
    engine(own_daemon.socket_path, "kill-lookup").prefill(p)
    assert _cached_chunks(own_daemon.socket_path, "kill-lookup", p) == 4  # stored: the miss below is the kill's doing
    own_daemon.kill()
    e = engine(own_daemon.socket_path, "kill-lookup")
    assert_close(e.prefill(p), reference(p))
    assert [s.external_tokens for s in e.steps] == [0]


@pytest.mark.parametrize("layerwise", [False, True])
def test_daemon_killed_between_lookup_and_load_recomputes(own_daemon, layerwise):
    """The scheduler saw a hit, the worker cannot load it: load errors, rewind, same logits."""
    p = prompt(21, 70)
    engine(own_daemon.socket_path, "kill-load", layerwise=layerwise).prefill(p)
    e = engine(own_daemon.socket_path, "kill-load", layerwise=layerwise, prefix_caching=False)
    sched = e.scheduler_connector
    lookup = sched.get_num_new_matched_tokens

    def lookup_then_die(request, num_computed):
        result = lookup(request, num_computed)
        own_daemon.kill()
        return result

    sched.get_num_new_matched_tokens = lookup_then_die
    assert_close(e.prefill(p), reference(p))
    first, retry = e.steps
    assert first.external_tokens == 64 and first.load_error_blocks
    assert retry.num_computed_before == 0 and retry.num_scheduled == 70

    # The daemon comes back: both connector instances reconnect on their own.
    own_daemon.start()
    sched.get_num_new_matched_tokens = lookup
    q = prompt(22, 50)
    assert_close(e.prefill(q), reference(q))
    assert_close(e.prefill(q), reference(q))
    assert e.steps[-1].external_tokens == 48


def test_frozen_daemon_times_out_instead_of_hanging(own_daemon):
    p = prompt(23, 40)
    engine(own_daemon.socket_path, "frozen").prefill(p)
    assert _cached_chunks(own_daemon.socket_path, "frozen", p) == 2  # the daemon holds the prompt ...
    e = engine(own_daemon.socket_path, "frozen", timeout=0.3)
    os.kill(own_daemon.proc.pid, signal.SIGSTOP)
    try:
        _wait_until(lambda: _stopped(own_daemon.proc.pid), "the daemon stopped", limit=10.0)
        assert_close(e.prefill(p), reference(p))
        assert e.steps[0].external_tokens == 0  # ... but cannot answer in time: a miss, not a hang
    finally:
        os.kill(own_daemon.proc.pid, signal.SIGCONT)
    assert _cached_chunks(own_daemon.socket_path, "frozen", p) == 2  # and serves again once thawed


def test_chunks_come_back_from_the_disk_tier(own_daemon):
    """After a restart RAM is empty; the disk tier still has the chunks and serves the load.

    (CLEAR would not do here: it empties the disk tier too.)
    """
    p = prompt(24, 100)
    engine(own_daemon.socket_path, "disk").prefill(p)
    with Client(own_daemon.socket_path) as c:
        _wait_until(lambda: _tier_objects(c, "disk") == 6, "six chunks on the disk tier")
    own_daemon.stop()
    own_daemon.start()
    with Client(own_daemon.socket_path) as c:
        s = c.scope("disk", "float32/KV_2LTD")  # the harness's scope: model name, fp32, KV_2LTD
        assert c.lookup(c.tokens(s, p)).by_tier == [0, 6]  # the hit lives on disk only
    e = engine(own_daemon.socket_path, "disk")
    assert_close(e.prefill(p), reference(p))
    # A hit that is not in RAM is loaded asynchronously (done_recving), then scheduled with it computed.
    assert e.async_loaded == {"req-1": 96} and e.steps[0].num_computed_before == 96
