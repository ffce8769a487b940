"""`/v1/completions`: raw text continued, or (with `echo` + `logprobs` + `max_tokens: 0`, the
request lm-evaluation-harness and our `openai` backend send for log-likelihoods) the prompt
scored token by token."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request  # at module level: FastAPI resolves the annotation

from workbench.errors import WorkbenchError
from workbench.models.base import ChatModel, Generation
from workbench.serve.replies import ApiError, sse, usage
from workbench.serve.schemas import CompletionRequest, generation_params
from workbench.serve.state import ServerState
from workbench.serve.work import run_once


def add_completion_route(app, s: ServerState) -> None:
    from fastapi.responses import StreamingResponse

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        s.check_model(req.model)
        body = await run_once(s, request, completion_body, s, req)
        if not req.stream:
            return body
        return StreamingResponse(_events(body, body["model"]), media_type="text/event-stream")


def completion_body(s: ServerState, req: CompletionRequest) -> dict[str, Any]:
    model = s.model_for(req.model)  # the served model, or a runtime LoRA adapter on it
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    rid, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if req.max_tokens == 0:
        choices, n_prompt = _echoed(s, model, req, prompts)
        gens: list[Generation] = []
    else:
        gens = _continued(s, model, req, prompts)
        choices = [{"index": i, "text": (p if req.echo else "") + g.text,
                    "finish_reason": g.finish_reason, "logprobs": None}
                   for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]
        n_prompt = sum(g.prompt_tokens for g in gens)
    n_completion = sum(g.completion_tokens for g in gens)
    name = s.served_name if model is s.model else str(req.model)
    return {"id": rid, "object": "text_completion", "created": now, "model": name,
            "choices": choices, "usage": usage(n_prompt, n_completion)}


def _echoed(s: ServerState, model: ChatModel, req: CompletionRequest, prompts: list[str]
            ) -> tuple[list[dict[str, Any]], int]:
    """max_tokens 0: the prompts back, scored when `logprobs` asks; (choices, prompt tokens)."""
    if not req.echo:
        raise ApiError(400, "max_tokens: 0 generates nothing; send echo=true (with "
                            "logprobs to score the prompt) or max_tokens>=1", "max_tokens")
    if req.logprobs is None:
        return [{"index": i, "text": p, "finish_reason": "length", "logprobs": None}
                for i, p in enumerate(prompts)], 0
    if not s.caps.token_logprobs:
        raise ApiError(400, f"logprobs: backend {s.model.backend_name!r} returns no "
                            "token logprobs", "logprobs")
    choices = [_scored_choice(s, model, i, p, req.logprobs) for i, p in enumerate(prompts)]
    return choices, sum(len(c["logprobs"]["tokens"]) for c in choices)


def _continued(s: ServerState, model: ChatModel, req: CompletionRequest, prompts: list[str]
               ) -> list[Generation]:
    if req.logprobs is not None:
        raise ApiError(400, "logprobs: logprobs of generated tokens are not supported; "
                            "send max_tokens=0 with echo=true to score a prompt", "logprobs")
    if not s.caps.complete:
        raise ApiError(400, f"prompt: backend {s.model.backend_name!r} cannot continue "
                            "raw text; use /v1/chat/completions", "prompt")
    for i, p in enumerate(prompts):
        if (n := _text_tokens(s, i, p)) is not None:
            s.fit_length(n, req.max_tokens, True, "max_tokens")
    try:
        gens = model.complete(prompts, generation_params(req, req.max_tokens))
    except WorkbenchError as e:
        raise ApiError(400, str(e)) from None
    for g in gens:
        if g.error:
            raise ApiError(500, g.error, kind="server_error")
    return gens


def _text_tokens(s: ServerState, i: int, prompt: str) -> int | None:
    n = s.prompt_tokens(prompt)
    if n == 0:
        raise ApiError(400, f"prompt {i} is empty (0 tokens)", "prompt")
    return n


def _scored_choice(s: ServerState, model: ChatModel, i: int, prompt: str, top: int
                   ) -> dict[str, Any]:
    n = _text_tokens(s, i, prompt)
    if n is not None and s.model.max_positions is not None and n > s.model.max_positions:
        raise ApiError(400, f"prompt {i} has {n} tokens, over the model's "
                            f"{s.model.max_positions} positions", "prompt")
    lp = model.token_logprobs(prompt, top)
    return {"index": i, "text": prompt, "finish_reason": "length",
            "logprobs": {"tokens": lp.tokens, "text_offset": lp.offsets,
                         "token_logprobs": lp.logprobs, "top_logprobs": lp.top}}


def _events(body: dict[str, Any], served_name: str) -> Iterator[str]:
    for c in body["choices"]:
        yield sse({"id": body["id"], "object": "text_completion",
                   "created": body["created"], "model": served_name, "choices": [c]})
    yield "data: [DONE]\n\n"
