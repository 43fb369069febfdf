"""The harness engine behind an HTTP server shaped like vLLM's OpenAI server.

Just enough of ``vllm serve`` for a prefill/decode proxy to drive two
harness engines (docs/disaggregation.md "End to end"): ``POST /v1/completions``,
``GET /v1/models`` and ``GET /health``, with vLLM's ``kv_transfer_params``
in and out. Run it as::

    python3 -m kvtier.harness.openai_server --port 8100 --model pd-demo \\
        --kv-transfer-config '{"kv_connector": "KVTierConnector",
          "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"socket_path": "/tmp/a.sock", "tcp_addr": "127.0.0.1:7070"}}'

What follows vLLM (``vllm/entrypoints/openai/completion/protocol.py`` and
``serving.py``): the request's ``kv_transfer_params`` reach the engine's
request (vLLM carries them in ``sampling_params.extra_args``); a whole
answer carries what the connector's ``request_finished`` returned in its
top-level ``kv_transfer_params``, a stream does not; a stream is ``data:``
events, one per token, the last with ``finish_reason``, then an optional
usage event and ``data: [DONE]``; a request that finished with an error
answers 500, or in a stream an ``error`` event; ``return_token_ids`` adds
``token_ids``; the engine's request id is ``cmpl-<X-Request-Id>-0``.

What is the harness's own: the model is the harness Llama with seeded
random weights; a prompt string is tokenized as its UTF-8 bytes (the
vocabulary is 256) and each answer token is shown as one Latin-1
character; sampling is greedy; one prompt per request; and
``GET /harness/stats`` reports the connector's counters and what happened
to each recent request, which the end-to-end tests read.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from .engine import Engine, KVTransferConfig
from .loop import EngineLoop, Finished
from .model import LlamaConfig

VOCAB = 256  # the prompt string's bytes are its tokens


def model_config(seed: int = 0) -> LlamaConfig:
    """The served model: the connector tests' small Llama, weights from ``seed``."""
    return LlamaConfig(vocab_size=VOCAB, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, intermediate=128,
                       seed=seed)


def build_engine(args: argparse.Namespace) -> Engine:
    kv = None
    if args.kv_transfer_config:
        raw = json.loads(args.kv_transfer_config)
        if not isinstance(raw, dict):
            raise ValueError("--kv-transfer-config: want a JSON object")
        kv = KVTransferConfig(kv_connector=raw.get("kv_connector", "KVTierConnector"),
                              kv_connector_module_path=raw.get("kv_connector_module_path", "kvtier.vllm"),
                              kv_role=raw.get("kv_role", "kv_both"),
                              kv_connector_extra_config=dict(raw.get("kv_connector_extra_config") or {}),
                              kv_load_failure_policy=raw.get("kv_load_failure_policy", "recompute"))
    return Engine(model_config(args.seed), model_name=args.model, num_blocks=args.num_blocks,
                  block_size=args.block_size, kv_transfer=kv, prefix_caching=args.prefix_caching)


class BadRequest(Exception):
    def __init__(self, status: int, message: str, typ: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.typ = status, typ


def parse_prompt(raw: Any) -> List[int]:
    """A string (its UTF-8 bytes), token ids, or a batch of one of either."""
    if isinstance(raw, list) and raw and all(isinstance(x, (str, list)) for x in raw):
        if len(raw) != 1:
            raise BadRequest(400, "prompt: the harness serves one prompt per request")
        raw = raw[0]
    if isinstance(raw, str):
        tokens = list(raw.encode("utf-8"))
    elif isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        tokens = raw
        if any(t < 0 or t >= VOCAB for t in tokens):
            raise BadRequest(400, f"prompt: token ids must be in [0, {VOCAB})")
    else:
        raise BadRequest(400, "prompt: want a string or a list of token ids")
    if not tokens:
        raise BadRequest(400, "prompt: empty")
    return tokens


class CompletionRequest:
    """The fields of a completion request the harness reads."""

    def __init__(self, body: Any, served: str, context: int):
        if not isinstance(body, dict):
            raise BadRequest(400, "the body must be a JSON object")
        model = body.get("model", served)
        if model != served:
            raise BadRequest(404, f"The model `{model}` does not exist.", "NotFoundError")
        self.model = served
        self.prompt = parse_prompt(body.get("prompt"))
        self.max_tokens = body.get("max_tokens")
        if self.max_tokens is None:
            self.max_tokens = 16  # vLLM's default for completions
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise BadRequest(400, "max_tokens: want an integer of at least 1")
        if len(self.prompt) + self.max_tokens > context:
            raise BadRequest(400, f"the prompt ({len(self.prompt)} tokens) plus max_tokens ({self.max_tokens}) "
                                  f"exceed the harness context of {context} tokens")
        self.stream = body.get("stream", False) or False
        if not isinstance(self.stream, bool):
            raise BadRequest(400, "stream: want a boolean")
        opts = body.get("stream_options") or {}
        self.include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        self.return_token_ids = bool(body.get("return_token_ids"))
        params = body.get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(400, "kv_transfer_params: want a JSON object")
        self.kv_transfer_params: Optional[Dict[str, Any]] = params


def text_of(tokens: List[int]) -> str:
    return bytes(tokens).decode("latin-1")


def error_body(status: int, message: str, typ: str) -> Dict[str, Any]:
    """vLLM's ErrorResponse."""
    return {"error": {"message": message, "type": typ, "param": None, "code": status}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "Server"

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    # -- plumbing

    def _send_json(self, status: int, obj: Any, headers: Optional[Dict[str, str]] = None) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, typ: str = "BadRequestError") -> None:
        self._send_json(status, error_body(status, message, typ))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj: Any) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode("utf-8")) + b"\n\n")

    def _body(self) -> Any:
        n = self.headers.get("Content-Length")
        if n is None or not n.isdigit():
            raise BadRequest(411, "a Content-Length is required")
        if int(n) > self.server.max_body:
            raise BadRequest(413, f"request body over {self.server.max_body} bytes")
        raw = self.rfile.read(int(n))
        try:
            return json.loads(raw)
        except ValueError as e:
            raise BadRequest(400, f"the body is not JSON: {e}") from None

    # -- routes

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path == "/health":
            if not self.server.loop.alive():
                self._error(503, "the engine loop has stopped", "ServiceUnavailableError")
                return
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            s = self.server
            self._send_json(200, {"object": "list", "data": [{
                "id": s.model, "object": "model", "created": s.started, "owned_by": "vllm", "root": s.model,
                "parent": None, "max_model_len": s.context}]})
        elif self.path == "/harness/stats":
            self._send_json(200, self.server.loop.stats())
        else:
            self._error(404, f"no route {self.path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/completions":
            self._error(404, f"no route {self.path}", "NotFoundError")
            return
        try:
            req = CompletionRequest(self._body(), self.server.model, self.server.context)
        except BadRequest as e:
            self._error(e.status, str(e), e.typ)
            return
        base = self.headers.get("X-Request-Id") or uuid.uuid4().hex
        rid = f"cmpl-{base}"
        try:
            pending = self.server.loop.submit(f"{rid}-0", req.prompt, req.max_tokens, req.kv_transfer_params)
        except ValueError as e:
            self._error(400, str(e))
            return
        if req.stream:
            self._stream(req, rid, pending)
        else:
            self._whole(req, rid, pending)

    def _whole(self, req: CompletionRequest, rid: str, pending: Any) -> None:
        tokens: List[int] = []
        for item in pending.events(self.server.request_timeout):
            if isinstance(item, Finished):
                if item.reason == "error":
                    self._error(500, item.message or "Internal server error", "InternalServerError")
                    return
                choice = {"index": 0, "text": text_of(tokens), "logprobs": None, "finish_reason": item.reason,
                          "stop_reason": None}
                if req.return_token_ids:
                    choice["token_ids"] = tokens
                    choice["prompt_token_ids"] = req.prompt
                self._send_json(200, {
                    "id": rid, "object": "text_completion", "created": int(time.time()), "model": req.model,
                    "choices": [choice], "usage": self._usage(req, tokens),
                    "kv_transfer_params": item.kv_transfer_params})
                return
            tokens.append(item)

    def _stream(self, req: CompletionRequest, rid: str, pending: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())
        tokens: List[int] = []
        held: Optional[int] = None  # the last token goes out with the finish reason, as in vLLM
        try:
            for item in pending.events(self.server.request_timeout):
                if isinstance(item, Finished):
                    if item.reason == "error":
                        self._event(error_body(500, item.message or "Internal server error", "InternalServerError"))
                    else:
                        self._event(self._stream_chunk(req, rid, created, held, item.reason))
                        if req.include_usage:
                            self._event({"id": rid, "object": "text_completion", "created": created,
                                         "model": req.model, "choices": [], "usage": self._usage(req, tokens)})
                    break
                if held is not None:
                    self._event(self._stream_chunk(req, rid, created, held, None))
                held = item
                tokens.append(item)
            self._event(b"[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.server.loop.abort(f"{rid}-0")  # the client went away: vLLM aborts the request
            self.close_connection = True

    @staticmethod
    def _stream_chunk(req: CompletionRequest, rid: str, created: int, token: Optional[int],
                      reason: Optional[str]) -> Dict[str, Any]:
        toks = [] if token is None else [token]
        choice: Dict[str, Any] = {"index": 0, "text": text_of(toks), "logprobs": None, "finish_reason": reason,
                                  "stop_reason": None}
        if req.return_token_ids:
            choice["token_ids"] = toks
        return {"id": rid, "object": "text_completion", "created": created, "model": req.model,
                "choices": [choice]}

    @staticmethod
    def _usage(req: CompletionRequest, tokens: List[int]) -> Dict[str, int]:
        return {"prompt_tokens": len(req.prompt), "completion_tokens": len(tokens),
                "total_tokens": len(req.prompt) + len(tokens)}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    max_body = 8 << 20

    def __init__(self, addr: Tuple[str, int], loop: EngineLoop, model: str, context: int,
                 request_timeout: float, verbose: bool):
        super().__init__(addr, Handler)
        self.loop, self.model, self.context = loop, model, context
        self.request_timeout, self.verbose = request_timeout, verbose
        self.started = int(time.time())


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m kvtier.harness.openai_server", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stdout)")
    ap.add_argument("--model", default="kvtier-harness", help="the served model name, also the connector's")
    ap.add_argument("--seed", type=int, default=0, help="the weights' seed; engines with one seed answer alike")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--num-blocks", type=int, default=256)
    ap.add_argument("--prefix-caching", action="store_true", help="the engine's own prefix cache (off by default)")
    ap.add_argument("--kv-transfer-config", default="", help="vLLM's flag: a JSON KVTransferConfig")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--verbose", action="store_true", help="log every HTTP request on stderr")
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    engine = build_engine(args)
    loop = EngineLoop(engine)
    loop.start()
    srv = Server((args.host, args.port), loop, args.model, args.num_blocks * args.block_size,
                 args.request_timeout, args.verbose)
    host, port = srv.server_address[:2]
    print(f"harness OpenAI server listening on http://{host}:{port}", flush=True)

    def stop(*_: Any) -> None:
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
        loop.stop()
        engine.close()


if __name__ == "__main__":
    main()
