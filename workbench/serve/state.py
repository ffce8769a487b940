"""One server's shared state (the model and its name, the limits, the admission gate, the
batcher, the stop flag) and what every route asks of the model through it: the model named,
a prompt's tokens, a length that fits, and generation (batched when it can be)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.models.base import Capabilities, ChatModel, Generation
from workbench.models.constrain import CONSTRAINT_ERROR
from workbench.serve.batching import ApiGone, Batcher
from workbench.serve.limits import Gate, ServerLimits
from workbench.serve.loras import LoraSet, unsupported
from workbench.serve.replies import CONSTRAINT_NOT_KEPT, ApiError


@dataclass
class ServerState:
    model: ChatModel
    served_name: str
    limits: ServerLimits
    caps: Capabilities
    gate: Gate
    batcher: Batcher | None
    stopping: threading.Event  # set by `serve` on SIGTERM / SIGINT
    created: int
    # the threads requests' work runs in: one per request the gate admits. asyncio's default
    # pool has min(32, cores + 4) threads, 6 on 2 cores: the 7th and 8th of 8 concurrent
    # requests waited for a thread, so they never reached the batcher or llama.cpp's slots
    # beside the others (8 concurrent: 96-98 tok/s, against 149-173 from llama-server)
    workers: ThreadPoolExecutor
    loras: LoraSet | None = None  # runtime LoRA adapters (`limits.lora_dir`)
    no_loras: str = "this server was started without --lora-dir: runtime LoRA adapters are off"

    @classmethod
    def start(cls, model: ChatModel, served_name: str, limits: ServerLimits) -> ServerState:
        # an engine that batches concurrent calls itself (llama.cpp's slots) takes each
        # request as it comes: gathering them would make later ones wait for a whole batch
        batcher = Batcher(model, limits.batch_window_ms / 1000) \
            if limits.batch_window_ms and not model.capabilities.concurrent else None
        gate = Gate(1 + limits.max_queue)
        s = cls(model=model, served_name=served_name, limits=limits,
                caps=model.capabilities, gate=gate, batcher=batcher,
                stopping=threading.Event(), created=int(time.time()),
                workers=ThreadPoolExecutor(gate.capacity, thread_name_prefix="serve-work"))
        if limits.lora_dir is not None:
            from pathlib import Path

            root = Path(limits.lora_dir)
            if not root.is_dir():
                raise WorkbenchError(f"--lora-dir {root}: no such folder")
            why = unsupported(model)
            if why is None:
                s.loras = LoraSet(model, root, limits.max_loras, served_name)
            else:
                s.no_loras = why
        return s

    def model_for(self, name: str | None) -> ChatModel:
        """The model a request names: the served one, or a runtime LoRA adapter on it."""
        if name in (None, "", self.served_name):
            return self.model
        view = self.loras.views.get(name) if self.loras is not None and name else None
        if view is None:
            loaded = f" or a loaded LoRA adapter ({', '.join(map(repr, self.loras.views))})" \
                if self.loras is not None and self.loras.views else ""
            raise ApiError(404, f"model {name!r} is not served here (serving "
                                f"{self.served_name!r}{loaded})", "model",
                           kind="not_found_error")
        return view

    def check_model(self, name: str | None) -> None:
        self.model_for(name)

    def lora_set(self) -> LoraSet:
        """The runtime adapters, or ApiError 400 saying why this server has none."""
        if self.loras is None:
            raise ApiError(400, self.no_loras, kind="invalid_request_error")
        return self.loras

    def fit_length(self, n_prompt: int, max_tokens: int, explicit: bool, param: str) -> int:
        """`max_tokens` that fits the model's positions after a prompt of `n_prompt` tokens:
        an explicit one that does not fit is refused, the default is cut to what fits."""
        limit = self.model.max_positions
        if limit is None:
            return max_tokens
        if n_prompt >= limit or (explicit and n_prompt + max_tokens > limit):
            raise ApiError(400, f"the prompt has {n_prompt} tokens and max_tokens is "
                                f"{max_tokens}: together {n_prompt + max_tokens} exceed the "
                                f"model's {limit} positions; shorten the prompt or lower "
                                "max_tokens", param)
        return min(max_tokens, limit - n_prompt)

    def prompt_tokens(self, prompt, **kw) -> int | None:
        """Tokens of a prompt (text or conversation), when the backend can count them."""
        if not self.caps.tokenize or self.model.max_positions is None:
            return None
        from jinja2 import TemplateError

        try:
            return len(self.model.tokenize(prompt, **kw))
        except TemplateError as e:
            raise ApiError(400, f"the chat template refused the conversation: {e}",
                           "messages") from None
        except WorkbenchError as e:
            raise ApiError(400, str(e)) from None

    def generate(self, convs, params, model: ChatModel | None = None, *, field: str = "",
                 **tools: Any) -> list[Generation]:
        """Generations of `convs`; a failed one is an ApiError: 400 naming `field` (the
        request field that asked for the constraint) when its constraint could not be kept
        (`replies.CONSTRAINT_NOT_KEPT`), else 500."""
        from jinja2 import TemplateError

        batcher, model = self.batcher, model or self.model
        try:
            if batcher is not None and len(convs) == 1 and batcher.batchable(params):
                try:
                    gens = [batcher.generate(convs[0], params, tools, model)]
                except ApiGone:
                    raise ApiError(499, "the client closed the request",
                                   kind="client_closed") from None
            else:
                gens = model.generate(convs, params, **tools) if tools else \
                    model.generate(convs, params)
        except TemplateError as e:
            raise ApiError(400, f"the chat template refused the conversation: {e}",
                           "messages") from None
        except WorkbenchError as e:
            raise ApiError(400, str(e)) from None
        for g in gens:
            if g.error and g.error_type == CONSTRAINT_ERROR:
                raise ApiError(400, f"{field}: {g.error}" if field else g.error,
                               field or None, code=CONSTRAINT_NOT_KEPT)
            if g.error:
                raise ApiError(500, g.error, kind="server_error")
        return gens
