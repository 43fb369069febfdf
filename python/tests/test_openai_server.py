"""The harness's OpenAI-shaped server on its own: requests, answers, streams and errors.

One server with a harness engine and no connector, in this process, on a
loopback port; the prefill/decode path through it is test_pd_e2e.py.
"""

import http.client
import json
import random
import socket
import threading
import time

import pytest

from kvtier.harness.engine import Engine
from kvtier.harness.loop import EngineLoop
from kvtier.harness.openai_server import BadRequest, CompletionRequest, Server, model_config

MODEL = "srv-test"


@pytest.fixture(scope="module")
def server():
    engine = Engine(model_config(3), model_name=MODEL, num_blocks=256, block_size=8, prefix_caching=False)
    loop = EngineLoop(engine)
    loop.start()
    srv = Server(("127.0.0.1", 0), loop, MODEL, 256 * 8, 60.0, False)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    loop.stop()
    t.join(timeout=10)


def call(srv, method, path, body=None, raw=None, headers=None):
    c = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        c.close()


def reference(prompt, max_tokens):
    e = Engine(model_config(3), model_name=MODEL, num_blocks=64, block_size=8, prefix_caching=False)
    r = e.add_request(prompt, max_tokens=max_tokens)
    e.run()
    return [int(l.argmax()) for l in r.logits]


def test_whole_answer(server):
    status, ctype, raw = call(server, "POST", "/v1/completions",
                              {"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 4, "return_token_ids": True})
    assert status == 200 and ctype == "application/json"
    body = json.loads(raw)
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion" and body["model"] == MODEL
    ch = body["choices"][0]
    assert ch["token_ids"] == reference([5, 6, 7, 8, 9], 4) and ch["finish_reason"] == "length"
    assert ch["text"] == bytes(ch["token_ids"]).decode("latin-1")
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert body["kv_transfer_params"] is None  # no connector: nothing kept for another instance


def test_string_prompt_is_its_bytes_and_a_batch_of_one_is_accepted(server):
    answers = []
    for prompt in ("héllo", ["héllo"], [list("héllo".encode())]):
        status, _, raw = call(server, "POST", "/v1/completions",
                              {"prompt": prompt, "max_tokens": 3, "return_token_ids": True})
        assert status == 200, raw
        answers.append(json.loads(raw)["choices"][0]["token_ids"])
    assert answers[0] == answers[1] == answers[2] == reference(list("héllo".encode()), 3)


def test_stream_is_the_same_tokens_one_event_each(server):
    status, ctype, raw = call(server, "POST", "/v1/completions",
                              {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 5, "stream": True,
                               "return_token_ids": True, "stream_options": {"include_usage": True}})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [e[len("data: "):] for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert [c["choices"][0]["token_ids"] for c in chunks] == [[t] for t in reference([1, 2, 3], 5)]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert "kv_transfer_params" not in chunks[-1]


def test_models_and_health(server):
    status, _, raw = call(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == [MODEL]
    assert call(server, "GET", "/health")[:1] == (200,)


@pytest.mark.parametrize("body,status,words", [
    ({"model": "other", "prompt": [1]}, 404, "does not exist"),
    ({"prompt": []}, 400, "empty"),
    ({}, 400, "prompt"),
    ({"prompt": [1, 256]}, 400, "token ids"),
    ({"prompt": [1, True]}, 400, "list of token ids"),
    ({"prompt": [[1], [2]]}, 400, "one prompt"),
    ({"prompt": 7}, 400, "prompt"),
    ({"prompt": [1], "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": [1], "max_tokens": "3"}, 400, "max_tokens"),
    ({"prompt": [1], "max_tokens": 4096}, 400, "context"),
    ({"prompt": [1], "stream": "yes"}, 400, "stream"),
    ({"prompt": [1], "kv_transfer_params": [1]}, 400, "kv_transfer_params"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_requests_are_clear_errors(server, body, status, words):
    got, _, raw = call(server, "POST", "/v1/completions", body)
    err = json.loads(raw)["error"]
    assert got == status and err["code"] == status and words in err["message"], err


def test_bad_bodies_and_routes(server):
    got, _, raw = call(server, "POST", "/v1/completions", raw=b"{not json")
    assert got == 400 and "not JSON" in json.loads(raw)["error"]["message"]
    assert call(server, "POST", "/v1/chat/completions", {"prompt": [1]})[0] == 404
    assert call(server, "GET", "/nope")[0] == 404


def test_random_bodies_never_break_the_parser():
    """Every JSON value in every field is either accepted or a BadRequest, never another exception."""
    rng = random.Random(11)
    values = [None, True, False, 0, -1, 1, 255, 256, 3.5, "", "x", "é" * 3, [], [1], [[1]], ["a"], [1, "a"],
              {}, {"a": 1}, [[1], [2]], 10 ** 30]
    for _ in range(3000):
        body = {k: rng.choice(values) for k in ("model", "prompt", "max_tokens", "stream", "stream_options",
                                                "return_token_ids", "kv_transfer_params") if rng.random() < 0.7}
        try:
            CompletionRequest(body if rng.random() < 0.95 else rng.choice(values), "m", 2048)
        except BadRequest:
            pass


def test_a_client_gone_mid_stream_aborts_the_request(server):
    """vLLM aborts a request whose client hung up; so does the harness, instead of decoding on."""
    s = socket.create_connection(server.server_address[:2], timeout=30)
    body = json.dumps({"prompt": [9, 8, 7], "max_tokens": 2000, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: gone\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while b"data: " not in got:
        got += s.recv(4096)
    s.close()
    deadline = time.monotonic() + 60
    while True:
        rec = server.loop.stats()["requests"]["cmpl-gone-0"]
        if rec["status"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rec["status"] == "finished_aborted" and rec["output_tokens"] < 2000


def test_the_loop_keeps_records_of_the_last_requests_only():
    engine = Engine(model_config(3), model_name=MODEL, num_blocks=64, block_size=8, prefix_caching=False)
    loop = EngineLoop(engine, keep=2)
    loop.start()
    try:
        for i in range(5):
            events = list(loop.submit(f"r{i}", [1, 2, 3, i], 2, None).events(60))
            assert len(events) == 3 and events[-1].reason == "length"
        assert sorted(loop.stats()["requests"]) == ["r3", "r4"]
        assert sorted(engine.requests) == ["r3", "r4"] and sorted(engine.kv_snapshots) == ["r3", "r4"]
        again = list(loop.submit("r4", [1, 2, 3, 4], 2, None).events(60))  # a finished id may come again
        assert again[:2] == events[:2]
    finally:
        loop.stop()
