"""vLLM's `/tokenize` and `/detokenize`, with which a client renders a chat prompt in the
served model's template; behind admission, like generation."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request  # at module level: FastAPI resolves the annotation

from workbench.errors import WorkbenchError
from workbench.serve.replies import ApiError
from workbench.serve.schemas import DetokenizeRequest, TokenizeRequest, conversation
from workbench.serve.state import ServerState
from workbench.serve.work import run_once


def add_tokenizer_routes(app, s: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest, request: Request):
        s.check_model(req.model)
        _need_tokenizer(s)
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "send exactly one of prompt and messages",
                           "prompt" if req.prompt is None else "messages")
        return await run_once(s, request, tokenized, s, req)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest, request: Request):
        s.check_model(req.model)
        _need_tokenizer(s)
        return await run_once(s, request, detokenized, s, req)


def _need_tokenizer(s: ServerState) -> None:
    if not s.caps.tokenize:
        raise ApiError(400, f"backend {s.model.backend_name!r} has no tokenizer to use")


def tokenized(s: ServerState, req: TokenizeRequest) -> dict[str, Any]:
    from jinja2 import TemplateError

    try:
        if req.prompt is not None:
            ids = s.model.tokenize(req.prompt, add_special_tokens=req.add_special_tokens)
        elif req.messages is None:
            raise ApiError(400, "send a prompt or messages to tokenize", "prompt")
        else:
            ids = s.model.tokenize(conversation(req.messages),
                                   add_special_tokens=req.add_special_tokens,
                                   add_generation_prompt=req.add_generation_prompt,
                                   tools=req.tools)
    except TemplateError as e:
        raise ApiError(400, f"the chat template refused the conversation: {e}",
                       "messages") from None
    except WorkbenchError as e:
        raise ApiError(400, str(e)) from None
    return {"count": len(ids), "max_model_len": s.model.max_positions, "tokens": ids}


def detokenized(s: ServerState, req: DetokenizeRequest) -> dict[str, Any]:
    try:
        return {"prompt": s.model.detokenize(req.tokens)}
    except WorkbenchError as e:
        raise ApiError(400, str(e), "tokens") from None
