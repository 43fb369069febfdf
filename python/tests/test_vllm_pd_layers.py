"""The decode side of per-layer prefill/decode pushes (``pd_layerwise``, docs/disaggregation.md).

A producer and a consumer harness engine, each beside its own real ``kvtier
serve`` on loopback TCP. The test plays a proxy that knows the decode's
``kv_transfer_params`` before the prefill ends (it chose the transfer id), so
it can send the decode while the producer is still saving: the producer's
save is held after layer 0 until the test has seen what the consumer did.
Every load is checked by its KV bytes against the producer's and by logits
against one engine doing everything.
"""

import threading
import time

import pytest

from kvtier import vllm_pd as pd
from kvtier import protocol
from kvtier.client import BadRequest, Client, ConnectionLost
from harness_util import assert_close, prompt
from test_vllm_pd import (CHUNK, all_blocks_free, consumer, daemons, kv_equal, prefill_params,  # noqa: F401
                          producer, single_instance)

TOKENS = 5 * CHUNK  # the prompt's whole chunks
WAIT_S = 30.0  # safety bound on the test's own waits; never a pass/fail timing


def decode_params_for(prod, pdaemon, tid="t1"):
    """What the producer will answer, known to the proxy beforehand (it chose the transfer id)."""
    c = prod.scheduler_connector
    push = pd.PushRequest(tid, "")
    return pd.decode_params(push, c.link.scope_args, "", CHUNK, TOKENS, pdaemon.tcp_addr, True)


def run_in_thread(eng, errors):
    def target():
        try:
            eng.run(timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


class HeldProducer:
    """Holds the producer's save after layer ``hold_after`` (its STORE_LAYER sent) until released."""

    def __init__(self, prod, hold_after=0):
        self.held = threading.Event()
        self.release = threading.Event()
        self.layers_saved = 0
        conn = prod.worker_connector
        real = conn.save_kv_layer

        def save_kv_layer(name, kv_layer, attn_metadata, **kw):
            real(name, kv_layer, attn_metadata, **kw)
            layer = conn._layer_of(name)
            self.layers_saved = layer + 1
            if layer == hold_after and conn._saves:
                self.held.set()
                self.release.wait(WAIT_S)

        conn.save_kv_layer = save_kv_layer


class LayerWaits:
    """Records the consumer's LAYER_WAIT answers: (layer asked, layers ready, usable chunks)."""

    def __init__(self, cons):
        self.seen = []
        self.first = threading.Event()
        conn = cons.worker_connector
        real = conn._await_layer

        def await_layer(link, load, layer):
            asked = load.layered and load.ready <= layer
            real(link, load, layer)
            if asked:
                self.seen.append((layer, load.ready, len(load.parts)))
                self.first.set()

        conn._await_layer = await_layer


def test_decode_reads_each_layer_while_the_prefill_is_between_layers(daemons):
    """The decode is sent with the prefill. Its step waits only until the chunks' pushes have
    started, then reads layer 0 of every chunk while the producer is held after saving layer 0
    (layers 1 and 2 do not exist anywhere yet); once the producer goes on, it reads the rest as
    it comes. Its KV equals the prefill's, byte for byte, and its logits one engine's."""
    pdaemon, ddaemon = daemons
    p = prompt(340, TOKENS + 7)
    prod = producer(pdaemon, "pd-live", layerwise=True)
    cons = consumer(ddaemon, "pd-live", layerwise=True, pd_layerwise=True)
    hold, waits = HeldProducer(prod), LayerWaits(cons)
    params = decode_params_for(prod, pdaemon)
    errors = []
    d = cons.add_request(p, "D", max_tokens=3, kv_transfer_params=params)
    tc = run_in_thread(cons, errors)
    r = prod.add_request(p, "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
    tp = run_in_thread(prod, errors)
    try:
        assert hold.held.wait(WAIT_S), "the producer never saved layer 0"
        assert waits.first.wait(WAIT_S), "the consumer did not read layer 0 while the producer was held"
        layer, ready, usable = waits.seen[0]
        assert (layer, usable) == (0, 5) and 1 <= ready < cons.worker_connector._layers, waits.seen
        assert hold.layers_saved == 1  # the producer is still between layer 0 and layer 1
    finally:
        hold.release.set()
        tp.join(WAIT_S)
        tc.join(WAIT_S)
    assert not errors, errors
    assert r.status.name == "FINISHED" and d.status.name == "FINISHED"
    assert prod.worker_connector.send_outcomes["P"] == "pushed"
    assert prod.output_params["P"] == params
    # A load in the step, not an asynchronous one: the first step had the 80 tokens and computed the rest.
    assert "D" not in cons.async_loaded
    first = [s for s in cons.steps if s.req_id == "D"][0]
    assert first.external_tokens == TOKENS and first.num_computed_before == TOKENS and not first.load_error_blocks
    assert all(usable == 5 for _, _, usable in waits.seen), waits.seen
    kv_equal(cons, "D", prod, "P", TOKENS)
    for got, ref in zip(d.logits, single_instance(p, 3)):
        assert_close(got, ref)
    assert all_blocks_free(cons) and not cons.delayed


def test_producer_killed_mid_save_turns_the_decode_into_a_recompute(daemons):
    """The producer's daemon is killed while its save is held after layer 0 and the consumer has
    read layer 0 of the chunks in progress. The consumer's next LAYER_WAIT reports the chunks
    unusable, they become load errors, vLLM's recompute path computes the prompt again: the
    decode's logits equal a full prefill's, and no layer of the dead push survives in its KV."""
    pdaemon, ddaemon = daemons
    p = prompt(341, TOKENS + 7)
    prod = producer(pdaemon, "pd-kill", layerwise=True, pd_timeout=2.0)
    cons = consumer(ddaemon, "pd-kill", layerwise=True, pd_layerwise=True)
    hold, waits = HeldProducer(prod), LayerWaits(cons)
    params = decode_params_for(prod, pdaemon)
    errors = []
    d = cons.add_request(p, "D", max_tokens=2, kv_transfer_params=params)
    tc = run_in_thread(cons, errors)
    prod.add_request(p, "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
    tp = run_in_thread(prod, errors)
    try:
        assert hold.held.wait(WAIT_S), "the producer never saved layer 0"
        assert waits.first.wait(WAIT_S), "the consumer did not read layer 0 while the producer was held"
        assert waits.seen[0][0] == 0 and waits.seen[0][2] == 5, waits.seen
        pdaemon.kill()
    finally:
        hold.release.set()
        tc.join(WAIT_S)
        tp.join(WAIT_S)
    assert not errors, errors
    assert d.status.name == "FINISHED"
    assert any(usable == 0 for _, _, usable in waits.seen), waits.seen
    steps = [s for s in cons.steps if s.req_id == "D"]
    assert steps[0].external_tokens == TOKENS and steps[0].load_error_blocks, steps
    assert steps[1].num_computed_before == 0, "the decode kept KV of a push that failed"
    ref = single_instance(p, 2)
    for got, want in zip(d.logits, ref):
        assert_close(got, want)
    assert all_blocks_free(cons)


@pytest.mark.parametrize("when", ["with-the-prefill", "after-the-prefill"])
def test_an_old_producer_without_the_early_push_still_works(daemons, when):
    """A producer whose daemon cannot push a save in progress (an older daemon: chunks go whole
    after the commit), and the usual proxy order (the decode sent once the prefill answered):
    the consumer's WAIT counts the whole chunks once they land and the decode's KV equals the
    prefill's."""
    pdaemon, ddaemon = daemons
    p = prompt(342, TOKENS + 7)
    prod = producer(pdaemon, "pd-old", layerwise=True)
    cons = consumer(ddaemon, "pd-old", layerwise=True, pd_layerwise=True)
    prod.worker_connector._pd()._no_store_push = True  # as after an old daemon's BAD_REQUEST
    params = decode_params_for(prod, pdaemon)
    errors = []
    if when == "after-the-prefill":
        r = prod.add_request(p, "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
        prod.run()
        d = cons.add_request(p, "D", max_tokens=2, kv_transfer_params=prod.output_params["P"])
        cons.run()
    else:
        d = cons.add_request(p, "D", max_tokens=2, kv_transfer_params=params)
        tc = run_in_thread(cons, errors)
        r = prod.add_request(p, "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
        prod.run()
        tc.join(WAIT_S)
    assert not errors, errors
    assert r.status.name == "FINISHED" and d.status.name == "FINISHED"
    assert prod.worker_connector._pd().connector_pushes == 0
    first = [s for s in cons.steps if s.req_id == "D"][0]
    assert "D" not in cons.async_loaded and first.external_tokens == TOKENS and not first.load_error_blocks
    kv_equal(cons, "D", prod, "P", TOKENS)
    for got, ref in zip(d.logits, single_instance(p, 2)):
        assert_close(got, ref)


def test_pd_layerwise_off_or_without_layerwise_keeps_the_asynchronous_load(daemons, caplog):
    """The default, and pd_layerwise without layerwise mode: the pushed prompt is loaded
    asynchronously (WAITING_FOR_REMOTE_KVS) as before, and the setting without effect is
    named in a warning, once."""
    from kvtier import vllm as kv_vllm
    kv_vllm._warned.clear()
    caplog.set_level("WARNING", logger="kvtier")
    pdaemon, ddaemon = daemons
    p = prompt(343, TOKENS + 7)
    prod = producer(pdaemon, "pd-async", layerwise=True)
    prod.add_request(p, "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
    prod.run()
    for i, kw in enumerate([dict(layerwise=True), dict(layerwise=False, pd_layerwise=True)]):
        cons = consumer(ddaemon, "pd-async", **kw)
        rid = f"D{i}"
        params = dict(prod.output_params["P"])
        d = cons.add_request(p, rid, max_tokens=1, kv_transfer_params=params)
        cons.run()
        assert d.status.name == "FINISHED" and cons.async_loaded[rid] == TOKENS
        kv_equal(cons, rid, prod, "P", TOKENS)
    said = [r.getMessage() for r in caplog.records if "pd_layerwise has no effect" in r.getMessage()]
    assert said == ["kvtier: pd_layerwise has no effect without layerwise: pushed prompts load asynchronously"]


def test_a_push_that_never_starts_leaves_the_step_alone_then_loads_asynchronously(daemons):
    """No producer ever pushes: the scheduler side answers None (ask again) while the pushes have
    not started, so no step waits on them; after pd_timeout the request takes the asynchronous
    path, which finds nothing and recomputes. Its logits equal one engine's."""
    pdaemon, ddaemon = daemons
    p = prompt(345, TOKENS + 7)
    prod = producer(pdaemon, "pd-never", layerwise=True)
    cons = consumer(ddaemon, "pd-never", layerwise=True, pd_layerwise=True, pd_timeout=0.5)
    asked = []
    real = cons.scheduler_connector.get_num_new_matched_tokens

    def get_num_new_matched_tokens(request, num_computed_tokens):
        got = real(request, num_computed_tokens)
        asked.append(got)
        return got

    cons.scheduler_connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    d = cons.add_request(p, "D", max_tokens=2, kv_transfer_params=decode_params_for(prod, pdaemon))
    cons.run()
    assert d.status.name == "FINISHED"
    assert asked[0] == (None, False) and (TOKENS, True) in asked, asked
    assert cons.async_loaded["D"] == TOKENS
    steps = [s for s in cons.steps if s.req_id == "D"]
    assert steps[0].num_computed_before == 0, "the decode used KV that never came"
    for got, ref in zip(d.logits, single_instance(p, 2)):
        assert_close(got, ref)


def test_a_daemon_without_in_progress_gets_whole_chunks(daemons, monkeypatch):
    """A consumer daemon older than WAIT's IN_PROGRESS flag refuses the header and closes the
    connection: the scheduler side then loads pushed prompts asynchronously (whole chunks), and
    the worker's transport, asked directly, waits for whole chunks — each remembers it."""
    pdaemon, ddaemon = daemons
    p = prompt(344, TOKENS + 7)
    prod = producer(pdaemon, "pd-noflag", layerwise=True)
    prod.add_request(p, "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
    prod.run()
    cons = consumer(ddaemon, "pd-noflag", layerwise=True, pd_layerwise=True)
    real_wait, flagged = Client.wait, []

    def wait(self, keys, timeout_ms, least=0, in_progress=False):
        if in_progress:  # what a daemon older than the flag answers (then it closes the connection)
            flagged.append(1)
            self._break()
            raise BadRequest(protocol.OP_WAIT, 1, "wire: malformed frame: unknown flags 0x8")
        return real_wait(self, keys, timeout_ms, least)

    monkeypatch.setattr(Client, "wait", wait)
    d = cons.add_request(p, "D", max_tokens=1, kv_transfer_params=prod.output_params["P"])
    cons.run()
    assert d.status.name == "FINISHED" and flagged == [1] and cons.async_loaded["D"] == TOKENS
    assert cons.scheduler_connector._no_in_progress
    kv_equal(cons, "D", prod, "P", TOKENS)

    import array
    from kvtier.vllm_keys import TokenKeys
    w = cons.worker_connector
    job = pd.Job("t1", "", TokenKeys(array.array("I", p)), TOKENS, pdaemon.tcp_addr)
    assert w._pd().started(job, w._layered_link(), time.monotonic() + 5) == TOKENS
    assert flagged == [1, 1] and w._pd()._no_in_progress


def test_a_lost_connection_fails_one_check_not_pd_layerwise(daemons, monkeypatch):
    """A WAIT that fails for any other reason than the daemon refusing IN_PROGRESS (here the
    connection breaks, as on a timeout or a daemon restart) fails that request's check alone:
    it is loaded asynchronously, and the next decode request is checked with the flag again."""
    pdaemon, ddaemon = daemons
    prod = producer(pdaemon, "pd-lost", layerwise=True)
    cons = consumer(ddaemon, "pd-lost", layerwise=True, pd_layerwise=True, pd_timeout=0.5)
    sc = cons.scheduler_connector
    real_wait, flagged = Client.wait, []

    def wait(self, keys, timeout_ms, least=0, in_progress=False):
        if in_progress:
            flagged.append(1)
            if len(flagged) == 1:
                self._break()
                raise ConnectionLost("kvtier: op 20: timed out")
        return real_wait(self, keys, timeout_ms, least, in_progress)

    monkeypatch.setattr(Client, "wait", wait)
    asked = {}
    real = sc.get_num_new_matched_tokens

    def get_num_new_matched_tokens(request, num_computed_tokens):
        got = real(request, num_computed_tokens)
        asked.setdefault(request.request_id, []).append(got)
        return got

    sc.get_num_new_matched_tokens = get_num_new_matched_tokens
    for rid, tid, seed in (("D", "t1", 346), ("E", "t2", 347)):
        pr = prompt(seed, TOKENS + 7)
        d = cons.add_request(pr, rid, max_tokens=1, kv_transfer_params=decode_params_for(prod, pdaemon, tid))
        cons.run()
        assert d.status.name == "FINISHED"
        assert_close(d.logits[0], single_instance(pr, 1)[0])
    assert asked["D"][0] == (TOKENS, True), asked  # its check failed: the asynchronous load
    assert asked["E"][0] == (None, False), asked  # checked again with the flag: not started yet
    assert not sc._no_in_progress and len(flagged) > 2


def test_a_deferred_request_is_not_asked_about_on_every_scheduler_pass(daemons, monkeypatch):
    """vLLM asks for every waiting request at each scheduler pass: a deferred decode sends one
    WAIT per recheck interval, not one per pass, and "ask again later" is not a query."""
    pdaemon, ddaemon = daemons
    prod = producer(pdaemon, "pd-spin", layerwise=True)
    cons = consumer(ddaemon, "pd-spin", layerwise=True, pd_layerwise=True)
    sc = cons.scheduler_connector
    real_wait, waits = Client.wait, []

    def wait(self, keys, timeout_ms, least=0, in_progress=False):
        waits.append(in_progress)
        return real_wait(self, keys, timeout_ms, least, in_progress)

    monkeypatch.setattr(Client, "wait", wait)
    d = cons.add_request(prompt(348, TOKENS + 7), "D", max_tokens=1,
                         kv_transfer_params=decode_params_for(prod, pdaemon))
    sc._recheck_s = 3600.0  # every pass below falls within one interval
    assert [sc.get_num_new_matched_tokens(d, 0) for _ in range(20)] == [(None, False)] * 20
    assert waits == [True] and sc.stats.queries == 0
    sc._recheck_s = 0.0  # the interval has passed: the next pass asks the daemon again
    assert sc.get_num_new_matched_tokens(d, 0) == (None, False)
    assert waits == [True, True] and sc.stats.queries == 0
    sc.request_finished(d, [])


def test_only_some_chunks_started_keeps_the_prefix_and_fails_the_tail(daemons):
    """The scheduler saw every push started, but at start_load_kv only the first three of the
    five chunks are in the consumer's daemon (the producer pushed a shorter prompt under the
    transfer): the step loads those three, byte for byte, and reports the tail's blocks as
    load errors; vLLM recomputes from the end of the prefix, and the logits are one engine's."""
    pdaemon, ddaemon = daemons
    p = prompt(349, TOKENS + 7)
    head = 3 * CHUNK
    prod = producer(pdaemon, "pd-part", layerwise=True)
    prod.add_request(p[:head + 1], "P", max_tokens=1, kv_transfer_params=prefill_params(ddaemon.tcp_addr))
    prod.run()
    cons = consumer(ddaemon, "pd-part", layerwise=True, pd_layerwise=True)
    sc = cons.scheduler_connector
    sc._push_started = lambda request, computed, usable: True  # as if they had all started
    d = cons.add_request(p, "D", max_tokens=1, kv_transfer_params=decode_params_for(prod, pdaemon))
    cons.run()
    assert d.status.name == "FINISHED" and "D" not in cons.async_loaded
    steps = [s for s in cons.steps if s.req_id == "D"]
    assert steps[0].external_tokens == TOKENS
    failed = steps[0].load_error_blocks
    assert len(failed) == (TOKENS - head) // 8, failed  # the tail's blocks, and only them
    assert steps[1].num_computed_before == head  # the prefix kept: recomputed from its end
    kv_equal(cons, "D", prod, "P", head)
    assert_close(d.logits[0], single_instance(p, 1)[0])
