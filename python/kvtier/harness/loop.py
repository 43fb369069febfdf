"""One thread that owns a harness Engine and steps it, like vLLM's engine core.

The engine is not thread-safe, so HTTP handlers never touch it: they hand
the loop requests and calls, and read each request's tokens from a queue
the loop fills after every step. The loop keeps stepping while the engine
has requests (including finished ones whose blocks wait for a transfer,
as vLLM's ``has_requests`` does), and sleeps on its inbox otherwise.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from .engine import Engine, Status

log = logging.getLogger(__name__)

_REASONS = {Status.FINISHED: "length", Status.FINISHED_ERROR: "error", Status.FINISHED_ABORTED: "abort"}


@dataclass
class Finished:
    """The last event of a request: vLLM's finish reason and the connector's params."""

    reason: str
    kv_transfer_params: Optional[Dict[str, Any]] = None
    message: str = ""


class Pending:
    """A submitted request as its handler sees it: token ids, then one Finished."""

    def __init__(self, loop: "EngineLoop", req_id: str):
        self.loop, self.req_id = loop, req_id
        self.q: "queue.Queue[Union[int, Finished]]" = queue.Queue()
        self.sent = 0

    def events(self, timeout: float) -> Iterator[Union[int, Finished]]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                item = self.q.get(timeout=max(left, 0.001))
            except queue.Empty:
                self.loop.abort(self.req_id)
                yield Finished("error", message=f"request {self.req_id} did not finish in {timeout:g}s")
                return
            yield item
            if isinstance(item, Finished):
                return


class EngineLoop(threading.Thread):
    """Steps ``engine`` on its own thread; keeps records of the last ``keep`` requests."""

    def __init__(self, engine: Engine, keep: int = 256):
        super().__init__(name="harness-engine", daemon=True)
        self.engine, self.keep = engine, keep
        self._inbox: "queue.Queue[Callable[[], None]]" = queue.Queue()
        self._halt = threading.Event()
        self._watch: Dict[str, Pending] = {}
        self._done: "OrderedDict[str, None]" = OrderedDict()
        self._first: Dict[str, Dict[str, int]] = {}  # req id -> its first scheduled step
        self._params_in: Dict[str, Optional[Dict[str, Any]]] = {}
        self.counters: Dict[str, float] = {}
        self.error = ""  # set when a step raised: the engine is dead, as vLLM's EngineDeadError

    # -- called from other threads

    def alive(self) -> bool:
        return self.is_alive() and not self.error

    def stop(self) -> None:
        self._halt.set()
        self._inbox.put(lambda: None)
        self.join(timeout=10)

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Runs fn on the loop's thread and returns its result (or raises its exception)."""
        box: List[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append((True, fn()))
            except Exception as e:  # noqa: BLE001 - handed back to the caller
                box.append((False, e))
            done.set()

        self._inbox.put(run)
        if not done.wait(timeout):
            raise RuntimeError("the engine loop did not answer")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def submit(self, req_id: str, prompt: List[int], max_tokens: int,
               kv_transfer_params: Optional[Dict[str, Any]]) -> Pending:
        if self.error:
            raise ValueError(f"the engine is dead: {self.error}")
        return self.call(lambda: self._add(req_id, prompt, max_tokens, kv_transfer_params))

    def abort(self, req_id: str) -> None:
        def run() -> None:
            if req_id in self._watch:
                self.engine.abort(req_id)
                self._publish()
        self._inbox.put(run)

    def stats(self) -> Dict[str, Any]:
        return self.call(self._stats)

    # -- the loop's thread

    def run(self) -> None:
        while not self._halt.is_set():
            busy = not self.error and self.engine.has_requests()
            self._drain(block=not busy)
            if self.error or not self.engine.has_requests():
                continue
            try:
                stepped = self.engine.step()
            except Exception as e:  # noqa: BLE001 - every waiting client must hear of it
                log.exception("harness engine step failed")
                self.error = f"{type(e).__name__}: {e}"
                self._fail_all()
                continue
            self._after_step()
            if not stepped:
                time.sleep(0.001)  # requests wait for their KV or their transfers
        self._fail_all()

    def _drain(self, block: bool) -> None:
        try:
            fn = self._inbox.get(timeout=0.1) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            fn()
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, req_id: str, prompt: List[int], max_tokens: int,
             params: Optional[Dict[str, Any]]) -> Pending:
        e = self.engine
        old = e.requests.get(req_id)
        if old is not None:
            if req_id in self._watch or req_id in e.delayed or old.status not in _REASONS:
                raise ValueError(f"request id {req_id} is already in flight")
            self._forget(req_id)
        e.add_request(prompt, req_id, max_tokens=max_tokens, kv_transfer_params=params)
        self._params_in[req_id] = dict(params) if params is not None else None
        p = Pending(self, req_id)
        self._watch[req_id] = p
        return p

    def _after_step(self) -> None:
        e = self.engine
        for s in e.steps:
            self._first.setdefault(s.req_id, {"computed_before": s.num_computed_before,
                                              "external_tokens": s.external_tokens})
        e.steps.clear()
        for c in (e.scheduler_connector, e.worker_connector):
            got = c.get_kv_connector_stats() if c is not None else None
            for k, v in (getattr(got, "data", None) or {}).items():
                self.counters[k] = self.counters.get(k, 0) + v
        self._publish()
        self._prune()

    def _publish(self) -> None:
        """Hands each watched request its new tokens (greedy, from its logits) and its end."""
        for rid, p in list(self._watch.items()):
            r = self.engine.requests[rid]
            while p.sent < len(r.logits):
                p.q.put(int(r.logits[p.sent].argmax()))
                p.sent += 1
            if r.status in _REASONS and rid in self.engine.output_params:
                msg = "failed to load the prompt's KV (kv_load_failure_policy: fail)" \
                    if r.status == Status.FINISHED_ERROR else ""
                p.q.put(Finished(_REASONS[r.status], self.engine.output_params[rid], msg))
                del self._watch[rid]
                self._done[rid] = None

    def _fail_all(self) -> None:
        for p in self._watch.values():
            p.q.put(Finished("error", message=f"the engine is dead: {self.error or 'stopped'}"))
        self._watch.clear()

    def _prune(self) -> None:
        while len(self._done) > self.keep:
            rid = next(iter(self._done))
            if rid in self.engine.delayed:
                return  # its blocks still wait for a transfer; the oldest goes first
            self._forget(rid)

    def _forget(self, rid: str) -> None:
        e = self.engine
        self._done.pop(rid, None)
        for d in (e.requests, e.kv_snapshots, e.async_loaded, e.output_params, e.freed_by, self._first,
                  self._params_in):
            d.pop(rid, None)

    def _stats(self) -> Dict[str, Any]:
        e = self.engine
        wc = e.worker_connector
        outcomes = getattr(wc, "send_outcomes", {}) if wc is not None else {}
        reqs = {}
        for rid, r in e.requests.items():
            reqs[rid] = {
                "status": r.status.value,
                "prompt_tokens": r.num_prompt_tokens,
                "output_tokens": len(r.logits),
                "first_step": self._first.get(rid),
                "async_loaded": e.async_loaded.get(rid, 0),
                "kv_transfer_params_in": self._params_in.get(rid),
                "kv_transfer_params_out": e.output_params.get(rid),
                "freed_by": e.freed_by.get(rid),
                "send_outcome": outcomes.get(rid),
            }
        sc = e.scheduler_connector
        return {
            "connector": dict(self.counters),
            "blocks_total": len(e.pool.refs),
            "blocks_free": e.pool.num_free,
            "delayed": sorted(e.delayed),
            "pending_push_work": bool(sc is not None and getattr(sc, "has_pending_push_work", lambda: False)()),
            "error": self.error,
            "requests": reqs,
        }
