"""Prefill/decode disaggregation end to end, every piece a real process (docs/disaggregation.md "End to end").

Two ``kvtier serve`` daemons on loopback TCP; two harness engines behind
the OpenAI-shaped server (``kvtier.harness.openai_server``): the prefill
one a ``kv_producer`` on daemon A, the decode one a ``kv_consumer`` on
daemon B; and ``kvtier controller`` proxying to them. Completions go
through the proxy; the answer must be what one engine without a connector
answers, the decode engine must have loaded the prompt's KV (not computed
it), the chunks in both daemons must be the same bytes, and the producer
must free its blocks once the push is done.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from kvtier.client import Client
from kvtier.harness.engine import Engine
from kvtier.harness.openai_server import model_config
from kvtier.testing import Daemon

CHUNK = 16
BLOCK = 8
MODEL = "pd-e2e"
SEED = 7
PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
START_WAIT = 60.0  # torch's import alone takes seconds on a busy machine


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Proc:
    """A child process whose output goes to a file, from which its address is read."""

    def __init__(self, argv, log_path, pattern, env=None):
        self.log_path = log_path
        log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                                     cwd=PYTHON_DIR)
        log.close()
        self.addr = self._wait_for(re.compile(pattern))

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def _wait_for(self, pattern):
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            m = pattern.search(self.log())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args[:3]} exited with {self.proc.returncode}: {self.log()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.proc.args[:3]} did not start in {START_WAIT}s: {self.log()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def harness_server(workdir, role, daemon, peer, policy="recompute"):
    """peer: the other side's daemon, the one this instance may push to or ask (pd_peers)."""
    extra = {"socket_path": daemon.socket_path, "timeout": 2.0, "reconnect_interval": 0.0,
             "pd_peers": peer.tcp_addr}
    if role == "kv_producer":
        extra["tcp_addr"] = daemon.tcp_addr
    cfg = {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": role,
           "kv_connector_extra_config": extra, "kv_load_failure_policy": policy}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVTIER_", "LMCACHE_"))}
    env["PYTHONPATH"] = PYTHON_DIR
    argv = [sys.executable, "-m", "kvtier.harness.openai_server", "--port", "0", "--model", MODEL,
            "--seed", str(SEED), "--block-size", str(BLOCK), "--kv-transfer-config", json.dumps(cfg)]
    p = Proc(argv, os.path.join(workdir, f"{role}.log"), r"listening on (http://\S+)", env)
    p.url = p.addr
    return p


def tcp_daemon(kvtier_bin, workdir):
    addr = f"127.0.0.1:{free_port()}"
    d = Daemon(kvtier_bin, workdir, chunk_size=CHUNK, extra_env={"KVTIER_TCP_ADDR": addr}).start()
    d.tcp_addr = addr
    return d


class Stack:
    """Daemons A and B, the prefill and decode servers, and the controller's proxy."""

    def __init__(self, kvtier_bin, root, policy="recompute"):
        self.procs = []
        self.decode_policy = policy
        dirs = {n: os.path.join(root, n) for n in ("a", "b", "ctl")}
        for d in dirs.values():
            os.makedirs(d, exist_ok=True)
        self.daemon_a = tcp_daemon(kvtier_bin, dirs["a"])
        self.daemon_b = tcp_daemon(kvtier_bin, dirs["b"])
        try:
            self.prefill = harness_server(dirs["a"], "kv_producer", self.daemon_a, self.daemon_b)
            self.procs.append(self.prefill)
            self.decode = harness_server(dirs["b"], "kv_consumer", self.daemon_b, self.daemon_a, policy)
            self.procs.append(self.decode)
            argv = [kvtier_bin, "controller", "--listen", "127.0.0.1:0", "--hash-seed", "0",
                    "--proxy-listen", "127.0.0.1:0", "--prefill-timeout", "30s", "--decode-timeout", "60s",
                    "--prefill", f"pf={self.prefill.url}",
                    "--decode", f"dec={self.decode.url}={self.daemon_b.tcp_addr}"]
            self.controller = Proc(argv, os.path.join(dirs["ctl"], "controller.log"),
                                   r'msg="proxy listening" addr=(\S+)')
            self.procs.append(self.controller)
            self.proxy = f"http://{self.controller.addr}"
        except BaseException:
            self.close()
            raise

    def close(self):
        for p in reversed(self.procs):
            p.stop()
        self.daemon_a.kill()
        self.daemon_b.kill()


@pytest.fixture(scope="module")
def stack(kvtier_bin, tmp_path_factory):
    s = Stack(kvtier_bin, str(tmp_path_factory.mktemp("pd-e2e")))
    yield s
    s.close()


@pytest.fixture(params=["recompute"])
def own_stack(kvtier_bin, tmp_path, request):
    """A stack a test may break; the consumer's kv_load_failure_policy as the test's parameter."""
    s = Stack(kvtier_bin, str(tmp_path), request.param)
    yield s
    s.close()


# ------------------------------------------------------------------ HTTP


def post(url, body, request_id=None, timeout=60):
    """(status, headers, body bytes) of a POST; errors are answers too."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if request_id:
        req.add_header("X-Request-Id", request_id)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def sse_events(raw):
    """The data of each server-sent event; the last must be [DONE]."""
    out = [line[len("data: "):] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert out and out[-1] == "[DONE]", f"the stream did not end with [DONE]: {raw[-200:]!r}"
    return [json.loads(e) for e in out[:-1]]


def answer_tokens(status, raw, stream):
    assert status == 200, raw
    if not stream:
        body = json.loads(raw)
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["text"] == bytes(choice["token_ids"]).decode("latin-1")
        return choice["token_ids"], body
    events = sse_events(raw)
    for e in events:
        assert "error" not in e, e
    tokens = [t for e in events for c in e["choices"] for t in c["token_ids"]]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    return tokens, events


def reference_tokens(prompt, max_tokens):
    """What one engine with the same weights and no connector answers."""
    e = Engine(model_config(SEED), model_name=MODEL, num_blocks=64, block_size=BLOCK, prefix_caching=False)
    r = e.add_request(prompt, max_tokens=max_tokens)
    e.run()
    return [int(l.argmax()) for l in r.logits]


def request_stats(server, rid, until=None, timeout=20.0):
    """The server's record of request ``cmpl-<rid>-0`` (and the whole stats), once ``until`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        stats = get_json(server.url + "/harness/stats")
        rec = stats["requests"].get(f"cmpl-{rid}-0")
        if rec is not None and (until is None or until(rec, stats)):
            return rec, stats
        if time.monotonic() > deadline:
            raise AssertionError(f"request {rid}: {rec}, stats {stats}")
        time.sleep(0.05)


def chunk_bytes(daemon, params, tokens):
    """The bytes of the prompt's chunks in a daemon, keyed as the producer's params say."""
    with Client(daemon.socket_path) as c:
        s = c.scope(params["kvtier_model"], params["kvtier_format"], world_size=params["kvtier_world_size"],
                    rank=params["kvtier_rank"], namespace=params["kvtier_namespace"])
        slots = c.prepare_retrieve(c.tokens(s, tokens), lease_ms=10_000)
        try:
            return [bytes(c.slot_tensor(sl).numpy()) for sl in slots.slots]
        finally:
            if slots.lease:
                c.release(slots.lease)


# ------------------------------------------------------------------ tests


def prompt_of(kind, seed, n):
    import random
    rng = random.Random(seed)
    if kind == "ids":
        return [rng.randrange(256) for _ in range(n)], None
    text = "".join(chr(rng.randrange(0x20, 0x7f)) for _ in range(n))
    return text, list(text.encode())


@pytest.mark.parametrize("kind,stream", [("ids", False), ("ids", True), ("text", True), ("text", False)])
def test_proxy_completion_is_one_engines_answer_from_pushed_kv(stack, kind, stream):
    prompt, ids = prompt_of(kind, 1000 + 2 * stream + (kind == "text"), 5 * CHUNK + 7)
    ids = ids or prompt
    max_tokens = 6
    rid = f"e2e-{kind}-{int(stream)}"
    status, headers, raw = post(stack.proxy + "/v1/completions",
                                {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
                                 "return_token_ids": True}, request_id=rid)
    tokens, _ = answer_tokens(status, raw, stream)
    assert headers["X-Kvtier-Prefill"] == "pf" and headers["X-Kvtier-Decode"] == "dec"
    assert tokens == reference_tokens(ids, max_tokens)

    # The prefill: one token, the prompt's 5 whole chunks pushed to daemon B, blocks freed after.
    pre, pstats = request_stats(stack.prefill, rid, until=lambda r, s: r["freed_by"] is not None)
    sent = pre["kv_transfer_params_in"]
    assert sent["do_remote_decode"] and sent["kvtier_push_to"] == stack.daemon_b.tcp_addr
    assert re.fullmatch(r"[0-9a-f]{32}", sent["kvtier_transfer_id"])
    out = pre["kv_transfer_params_out"]
    assert out["kvtier_pushed"] and out["kvtier_tokens"] == 5 * CHUNK and out["do_remote_prefill"]
    assert out["kvtier_source"] == stack.daemon_a.tcp_addr
    assert pre["output_tokens"] == 1 and pre["send_outcome"] == "pushed"
    assert pre["freed_by"] == "finished_sending"

    # The decode: the params as the prefill answered, 80 tokens loaded, not computed.
    dec, dstats = request_stats(stack.decode, rid, until=lambda r, s: r["status"] == "finished")
    assert dec["kv_transfer_params_in"] == out
    assert dec["async_loaded"] == 5 * CHUNK
    assert dec["first_step"]["computed_before"] == 5 * CHUNK, "the decode engine computed tokens it received"
    assert dec["output_tokens"] == max_tokens and dec["freed_by"] == "finished"
    assert dstats["connector"]["load_errors"] == 0

    # The chunks in both daemons are the same bytes; the consumer loaded that many.
    a = chunk_bytes(stack.daemon_a, out, ids[:5 * CHUNK])
    b = chunk_bytes(stack.daemon_b, out, ids[:5 * CHUNK])
    assert len(a) == len(b) == 5 and all(len(x) > 0 for x in a)
    assert a == b, "the decode daemon's chunks differ from the prefill daemon's"
    assert dstats["connector"]["load_bytes"] >= sum(len(x) for x in b)

    # Nothing is left held on either engine once the last request is done.
    _, pstats = request_stats(stack.prefill, rid, until=lambda r, s: not s["delayed"])
    assert pstats["blocks_free"] == pstats["blocks_total"] and not pstats["pending_push_work"]
    _, dstats = request_stats(stack.decode, rid, until=lambda r, s: s["blocks_free"] == s["blocks_total"])


def test_load_bytes_count_each_request(stack):
    """The consumer's load counter grows by exactly the chunks' bytes for one more request."""
    prompt, _ = prompt_of("ids", 2000, 3 * CHUNK + 1)
    before = get_json(stack.decode.url + "/harness/stats")["connector"].get("load_bytes", 0)
    status, _, raw = post(stack.proxy + "/v1/completions",
                          {"model": MODEL, "prompt": prompt, "max_tokens": 2, "return_token_ids": True},
                          request_id="e2e-bytes")
    tokens, body = answer_tokens(status, raw, False)
    assert tokens == reference_tokens(prompt, 2)
    pre, _ = request_stats(stack.prefill, "e2e-bytes", until=lambda r, s: r["freed_by"] is not None)
    out = pre["kv_transfer_params_out"]
    b = chunk_bytes(stack.daemon_b, out, prompt[:3 * CHUNK])
    _, dstats = request_stats(stack.decode, "e2e-bytes", until=lambda r, s: r["status"] == "finished")
    assert dstats["connector"]["load_bytes"] - before == sum(len(x) for x in b)
    assert b == chunk_bytes(stack.daemon_a, out, prompt[:3 * CHUNK])


def test_models_and_health_through_the_proxy(stack):
    models = get_json(stack.proxy + "/v1/models")
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert get_json(stack.proxy + "/healthz")["status"] == "ok"
    with urllib.request.urlopen(stack.decode.url + "/health", timeout=10) as r:
        assert r.status == 200


@pytest.mark.parametrize("own_stack", ["recompute", "fail"], indirect=True)
def test_decode_daemon_killed(own_stack):
    """Daemon B is gone: the push fails at once (the producer frees its blocks), and the consumer,
    whose connector cannot reach its own daemon, matches nothing and computes the prompt — under
    either kv_load_failure_policy, since no load was started to fail: the answer is still right."""
    s = own_stack
    s.daemon_b.kill()
    prompt, _ = prompt_of("ids", 3000, 4 * CHUNK + 3)
    status, _, raw = post(s.proxy + "/v1/completions",
                          {"model": MODEL, "prompt": prompt, "max_tokens": 3, "return_token_ids": True},
                          request_id="e2e-dead-b")
    tokens, _ = answer_tokens(status, raw, False)
    assert tokens == reference_tokens(prompt, 3)
    pre, pstats = request_stats(s.prefill, "e2e-dead-b", until=lambda r, s: r["freed_by"] is not None)
    assert pre["send_outcome"] == "failed" and pre["freed_by"] == "finished_sending"
    dec, _ = request_stats(s.decode, "e2e-dead-b", until=lambda r, s: r["status"] == "finished")
    assert dec["async_loaded"] == 0 and dec["first_step"]["computed_before"] == 0


def test_prefill_engine_down_is_a_502(own_stack):
    s = own_stack
    s.prefill.kill()
    status, _, raw = post(s.proxy + "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2})
    assert status == 502, raw
    err = json.loads(raw)["error"]
    assert err["type"] == "upstream_error" and err["stage"] == "prefill" and err["instance"] == "pf"
    assert "pf" in err["message"]


def test_decode_engine_down_is_a_502(own_stack):
    s = own_stack
    s.decode.kill()
    status, _, raw = post(s.proxy + "/v1/completions", {"model": MODEL, "prompt": [4, 5, 6], "max_tokens": 2})
    assert status == 502, raw
    err = json.loads(raw)["error"]
    assert err["type"] == "upstream_error" and err["stage"] == "decode" and err["instance"] == "dec"


@pytest.mark.parametrize("own_stack", ["recompute", "fail"], indirect=True)
def test_prefill_daemon_killed_after_start(own_stack):
    """Daemon A dies while its engine runs. The producer's scheduler announces the chunks it asked
    its worker to save (it cannot see the worker's failed saves), its push fails at once; the
    consumer's WAIT finds nothing, it asks daemon A about the push, cannot reach it, and the
    missing blocks become load errors: ``recompute`` computes the prompt and answers right,
    ``fail`` ends the request, which the proxy answers as the decode instance's 500."""
    s = own_stack
    warm, _ = prompt_of("ids", 4000, 2 * CHUNK + 3)
    assert post(s.proxy + "/v1/completions", {"model": MODEL, "prompt": warm, "max_tokens": 1})[0] == 200
    s.daemon_a.kill()
    prompt, _ = prompt_of("ids", 4001, 5 * CHUNK + 7)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "return_token_ids": True}
    status, _, raw = post(s.proxy + "/v1/completions", body, request_id="e2e-dead-a")
    pre, _ = request_stats(s.prefill, "e2e-dead-a", until=lambda r, x: r["freed_by"] is not None)
    assert pre["kv_transfer_params_out"]["kvtier_tokens"] == 5 * CHUNK
    assert pre["send_outcome"] == "failed" and pre["freed_by"] == "finished_sending"
    dec, dstats = request_stats(s.decode, "e2e-dead-a", until=lambda r, x: r["status"] != "running")
    assert dstats["connector"]["load_errors"] == 5 * CHUNK // BLOCK
    if s.decode_policy == "recompute":
        tokens, _ = answer_tokens(status, raw, False)
        assert tokens == reference_tokens(prompt, 3)
        assert dec["status"] == "finished" and dec["first_step"]["computed_before"] == 0
        return
    assert status == 500, raw
    err = json.loads(raw)["error"]
    assert err["stage"] == "decode" and "kv_load_failure_policy: fail" in err["message"]
    assert dec["status"] == "finished_error"
    # The same in a stream: the decode's answer has started, so the error is an event.
    status, _, raw = post(s.proxy + "/v1/completions", dict(body, stream=True), request_id="e2e-dead-a2")
    assert status == 200
    events = sse_events(raw)
    assert len(events) == 1 and "kv_load_failure_policy: fail" in events[0]["error"]["message"]


def test_concurrent_completions(stack):
    """Six at once, half streamed: each answer is its own prompt's, each loaded from its push."""
    results = {}

    def one(i):
        p, _ = prompt_of("ids", 5000 + i, 3 * CHUNK + i)
        status, _, raw = post(stack.proxy + "/v1/completions",
                              {"model": MODEL, "prompt": p, "max_tokens": 4, "stream": i % 2 == 1,
                               "return_token_ids": True}, request_id=f"e2e-many-{i}")
        results[i] = (p, status, raw)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == list(range(6))
    for i, (p, status, raw) in results.items():
        tokens, _ = answer_tokens(status, raw, i % 2 == 1)
        assert tokens == reference_tokens(p, 4), f"request {i}"
        dec, _ = request_stats(stack.decode, f"e2e-many-{i}", until=lambda r, x: r["status"] == "finished")
        want = 3 * CHUNK if i else 2 * CHUNK  # whole chunks, never the prompt's last token
        assert dec["async_loaded"] == want and dec["first_step"]["computed_before"] == want


def test_prompt_under_one_chunk_is_computed_by_the_decode(stack):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    status, _, raw = post(stack.proxy + "/v1/completions",
                          {"model": MODEL, "prompt": prompt, "max_tokens": 3, "return_token_ids": True},
                          request_id="e2e-short")
    tokens, _ = answer_tokens(status, raw, False)
    assert tokens == reference_tokens(prompt, 3)
    pre, _ = request_stats(stack.prefill, "e2e-short", until=lambda r, x: r["freed_by"] is not None)
    out = pre["kv_transfer_params_out"]
    assert out["kvtier_tokens"] == 0 and not out["kvtier_pushed"] and pre["freed_by"] == "finished"
    dec, _ = request_stats(stack.decode, "e2e-short", until=lambda r, x: r["status"] == "finished")
    assert dec["async_loaded"] == 0 and dec["first_step"]["computed_before"] == 0
