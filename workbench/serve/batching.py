"""Micro-batching of concurrent chat requests: those that share their generation settings
run as one `generate` call (of the same model: the served one, or one runtime LoRA adapter),
and a shared batch stops only when all its clients have left."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from workbench.models.base import (
    ChatModel,
    Generation,
    GenerationParams,
    cancel_context,
    cancel_event,
)


class _AllSet:
    """Set once every one of `events` is: a shared batch stops only when all its clients
    have left."""

    def __init__(self, events: list[threading.Event]):
        self.events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self.events)


class Batcher:
    """Micro-batching: chat requests that arrive within `window_s` of each other and share
    their generation settings (greedy decoding, same tools) run as one `generate` call of up
    to the backend's batch size, so concurrent clients (say, distillation workers) share
    batches. Seeded sampling is left alone: a shared batch would change its samples."""

    def __init__(self, model: ChatModel, window_s: float):
        import queue

        self.model, self.window_s = model, window_s
        self.max_batch = max(1, model.batch_size)
        self.requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self.batches: list[int] = []  # sizes of the batches run, for /health and tests

    @staticmethod
    def batchable(params: GenerationParams) -> bool:
        return params.greedy

    def generate(self, conv, params: GenerationParams, tools: dict[str, Any],
                 model: ChatModel | None = None) -> Generation:
        """Blocks until this conversation's reply is ready; call it in a worker thread."""
        from concurrent.futures import Future

        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="serve-batcher",
                                                daemon=True)
                self._thread.start()
        done: Future = Future()
        model = model or self.model  # a runtime LoRA adapter's requests batch together
        key = (id(model), params, json.dumps(_plain_tools(tools), sort_keys=True))
        self.requests.put((key, conv, params, tools, cancel_event() or threading.Event(), done,
                           model))
        return done.result()

    def _loop(self) -> None:
        import queue

        waiting: list = []
        while True:
            first = waiting.pop(0) if waiting else self.requests.get()
            batch, deadline = [first], time.monotonic() + self.window_s
            while len(batch) < self.max_batch:
                timeout = deadline - time.monotonic()
                try:
                    item = self.requests.get(timeout=max(timeout, 0)) if timeout > 0 else \
                        self.requests.get_nowait()
                except queue.Empty:
                    break
                (batch if item[0] == first[0] else waiting).append(item)
            self._run(batch)

    def _run(self, batch: list) -> None:
        _, _, params, tools, _, _, model = batch[0]
        live = [b for b in batch if not b[4].is_set()]
        for b in batch:
            if b[4].is_set():
                b[5].set_exception(ApiGone())
        if not live:
            return
        self.batches.append(len(live))
        context = cancel_context(_AllSet([b[4] for b in live]))  # type: ignore[arg-type]
        try:
            gens = context.run(model.generate, [b[1] for b in live], params, **tools)
        except Exception as e:  # noqa: BLE001 - handed to the request(s) it belongs to
            if len(live) == 1:
                live[0][5].set_exception(e)
            else:  # one bad conversation must not fail the others: run each alone
                for b in live:
                    self._run([b])
            return
        for b, g in zip(live, gens, strict=True):
            b[5].set_result(g)


class ApiGone(Exception):
    """The client left before its turn in a batch came."""


def _plain_tools(tools: dict[str, Any]) -> Any:
    if not tools:
        return None
    choice: Any = tools.get("tool_choice")  # a pydantic model or its JSON
    return {"tools": [t.model_dump(mode="json") if hasattr(t, "model_dump") else t
                      for t in tools["tools"]],
            "tool_choice": choice.model_dump(mode="json") if hasattr(choice, "model_dump")
            else choice}
