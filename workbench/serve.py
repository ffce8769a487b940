"""An OpenAI-compatible HTTP server over any workbench model (FastAPI + uvicorn).

Routes: `/health`, `/v1/models`, `/v1/chat/completions` (plain and streaming SSE, with
`tools` / `tool_choice` and `tool` turns), `/v1/completions` (text generation, and prompt
scoring with `echo` + `logprobs` + `max_tokens: 0`, the request lm-evaluation-harness and our
`openai` backend send for log-likelihoods), and vLLM's `/tokenize` and `/detokenize`, with
which a client renders a chat prompt in the served model's template.

Every request field is one this server implements: any other is refused with HTTP 400 naming
it (a silently ignored `logprobs` or `response_format` would give wrong results that look
right). Errors come back in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`.
Tool calls are parsed from the generated text with the syntax of the model's chat template
(see `workbench.models.tools`); with `stream: true` and tools, the reply is generated whole
and then sent as chunks, since a half-written call cannot be parsed.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from workbench.errors import WorkbenchError
from workbench.models.base import ChatModel, Generation, GenerationParams
from workbench.models.messages import NamedToolChoice, ToolCall, ToolSpec, as_tool_choice


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessageIn(_Strict):
    # validated in this order: each check sees the fields above it
    role: Literal["system", "user", "assistant", "tool"]
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(None, validate_default=True)
    name: str | None = None
    content: str | list[TextPart] | None = Field(None, validate_default=True)

    @field_validator("tool_calls")
    @classmethod
    def _calls(cls, v, info: ValidationInfo):
        if v is not None and info.data.get("role") != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return v

    @field_validator("tool_call_id")
    @classmethod
    def _call_id(cls, v, info: ValidationInfo):
        role = info.data.get("role")
        if role == "tool" and not v:
            raise ValueError("a tool message needs the id of the call it answers")
        if v is not None and role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return v

    @field_validator("content")
    @classmethod
    def _content(cls, v, info: ValidationInfo):
        role = info.data.get("role")
        if v is None and role is not None and not (role == "assistant"
                                                   and info.data.get("tool_calls")):
            raise ValueError(f"a {role} message needs content" + (
                " or tool_calls" if role == "assistant" else ""))
        return v

    def plain(self) -> dict[str, Any]:
        text = self.content if not isinstance(self.content, list) else \
            "".join(p.text for p in self.content)
        out: dict[str, Any] = {"role": self.role, "content": text or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump(mode="json") for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class _Sampling(_Strict):
    """The sampling fields both generation routes accept."""

    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float | None = Field(None, gt=0.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1)


class ChatCompletionRequest(_Sampling):
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling):
    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _some_prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("an empty list of prompts")
        return v


class TokenizeRequest(_Strict):
    """vLLM's `/tokenize`: a `prompt` (text) or `messages` (rendered by the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    tools: list[ToolSpec] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def _params(req: ChatCompletionRequest | CompletionRequest, max_tokens: int) -> GenerationParams:
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    return GenerationParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                            top_k=req.top_k, stop=tuple(stop), seed=req.seed,
                            repetition_penalty=req.repetition_penalty)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _field_path(loc) -> list[str]:
    """A validation error's location as request fields: pydantic also names the branch of a
    union it tried (`str`, `list[TextPart]`, `NamedToolChoice`), which is no field."""
    out = []
    for x in loc:
        if isinstance(x, int) or (isinstance(x, str) and re.fullmatch(r"[a-z_][a-z0-9_]*", x)
                                  and x not in _TYPE_TAGS and x != "body"):
            out.append(str(x))
    return out


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"


def create_app(model: ChatModel, served_name: str):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    app = FastAPI(title="workbench OpenAI-compatible server", version="1")
    created = int(time.time())
    caps = model.capabilities

    class ApiError(Exception):
        def __init__(self, status: int, message: str, param: str | None = None,
                     kind: str = "invalid_request_error"):
            super().__init__(message)
            self.status, self.message, self.param, self.kind = status, message, param, kind

    def error_body(message: str, kind: str, param: str | None, code: Any) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return JSONResponse(error_body(exc.message, exc.kind, exc.param, exc.status),
                            status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):  # unknown route, method
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error", None,
                                       exc.status_code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        problems, params = [], []
        for err in exc.errors():
            field = ".".join(_field_path(err.get("loc", ())))
            if err.get("type") == "extra_forbidden":
                problems.append(f"{field}: unsupported field (this server does not implement "
                                "it; leave it out)")
            elif err.get("type") == "json_invalid":
                problems.append(f"the body is not valid JSON ({err.get('msg')})")
                field = ""
            else:
                msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
                problems.append(f"{field}: {msg}" if field else msg)
            params.append(field or None)
        unique = list(dict.fromkeys(problems))
        return JSONResponse(error_body("; ".join(unique), "invalid_request_error",
                                       params[0] if params else None, "invalid_request"),
                            status_code=400)

    def check_model(name: str | None) -> None:
        if name not in (None, "", served_name):
            raise ApiError(404, f"model {name!r} is not served here (serving {served_name!r})",
                           "model", kind="not_found_error")

    def generate(convs, params, **tools) -> list[Generation]:
        from jinja2 import TemplateError

        try:
            gens = model.generate(convs, params, **tools) if tools else \
                model.generate(convs, params)
        except TemplateError as e:
            raise ApiError(400, f"the chat template refused the conversation: {e}",
                           "messages") from None
        except WorkbenchError as e:
            raise ApiError(400, str(e)) from None
        for g in gens:
            if g.error:
                raise ApiError(500, g.error, kind="server_error")
        return gens

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": served_name}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served_name, "object": "model",
                                             "created": created, "owned_by": "workbench"}]}

    # --- chat ----------------------------------------------------------------------------

    def conversation(messages: list[ChatMessageIn]) -> list[dict[str, Any]]:
        return [m.plain() for m in messages]

    def tool_args(req: ChatCompletionRequest) -> dict[str, Any]:
        if req.tool_choice is not None and not req.tools and req.tool_choice != "none":
            raise ApiError(400, "tool_choice: needs `tools`", "tool_choice")
        if not req.tools:
            return {}
        if not caps.tool_calls:
            raise ApiError(400, f"tools: backend {model.backend_name!r} cannot call tools",
                           "tools")
        try:
            choice = as_tool_choice(req.tool_choice, req.tools)
        except WorkbenchError as e:
            raise ApiError(400, str(e), "tool_choice") from None
        return {"tools": req.tools, "tool_choice": choice}

    def assistant_message(gen: Generation, parallel: bool | None) -> dict[str, Any]:
        calls = gen.tool_calls if parallel is not False else gen.tool_calls[:1]
        msg: dict[str, Any] = {"role": "assistant",
                               "content": gen.text if gen.text or not calls else None}
        if calls:
            msg["tool_calls"] = [tc.model_dump(mode="json") for tc in calls]
        return msg

    @app.post("/v1/chat/completions")
    def chat(req: ChatCompletionRequest):
        check_model(req.model)
        conv = conversation(req.messages)
        params = _params(req, req.max_completion_tokens or req.max_tokens or 256)
        tools = tool_args(req)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"

        def chunk(delta: dict, finish: str | None = None) -> str:
            return _sse({"id": rid, "object": "chat.completion.chunk",
                         "created": int(time.time()), "model": served_name,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        if req.stream and not tools:
            def events():
                yield chunk({"role": "assistant", "content": ""})
                try:
                    for piece in model.stream(conv, params):
                        if piece:
                            yield chunk({"content": piece})
                    yield chunk({}, "stop")
                except WorkbenchError as e:
                    yield _sse(error_body(str(e), "server_error", None, 500))
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        gen = generate([conv], params, **tools)[0]
        message = assistant_message(gen, req.parallel_tool_calls)
        if req.stream:
            def whole():
                yield chunk({"role": "assistant", "content": ""})
                if message["content"]:
                    yield chunk({"content": message["content"]})
                if message.get("tool_calls"):
                    yield chunk({"tool_calls": [{"index": i, **tc} for i, tc in
                                                enumerate(message["tool_calls"])]})
                yield chunk({}, gen.finish_reason)
                yield "data: [DONE]\n\n"

            return StreamingResponse(whole(), media_type="text/event-stream")
        return {
            "id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": served_name,
            "choices": [{"index": 0, "finish_reason": gen.finish_reason, "message": message,
                         "logprobs": None}],
            "usage": _usage(gen.prompt_tokens, gen.completion_tokens),
        }

    # --- completions ---------------------------------------------------------------------

    def scored_choice(i: int, prompt: str, top: int) -> dict[str, Any]:
        lp = model.token_logprobs(prompt, top)
        return {"index": i, "text": prompt, "finish_reason": "length",
                "logprobs": {"tokens": lp.tokens, "text_offset": lp.offsets,
                             "token_logprobs": lp.logprobs, "top_logprobs": lp.top}}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        check_model(req.model)
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        rid, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if req.max_tokens == 0:
            if not req.echo:
                raise ApiError(400, "max_tokens: 0 generates nothing; send echo=true (with "
                                    "logprobs to score the prompt) or max_tokens>=1",
                               "max_tokens")
            if req.logprobs is None:
                choices = [{"index": i, "text": p, "finish_reason": "length", "logprobs": None}
                           for i, p in enumerate(prompts)]
                n_prompt = 0
            else:
                if not caps.token_logprobs:
                    raise ApiError(400, f"logprobs: backend {model.backend_name!r} returns no "
                                        "token logprobs", "logprobs")
                choices = [scored_choice(i, p, req.logprobs) for i, p in enumerate(prompts)]
                n_prompt = sum(len(c["logprobs"]["tokens"]) for c in choices)
            gens: list[Generation] = []
        else:
            if req.logprobs is not None:
                raise ApiError(400, "logprobs: logprobs of generated tokens are not supported; "
                                    "send max_tokens=0 with echo=true to score a prompt",
                               "logprobs")
            if not caps.complete:
                raise ApiError(400, f"prompt: backend {model.backend_name!r} cannot continue "
                                    "raw text; use /v1/chat/completions", "prompt")
            try:
                gens = model.complete(prompts, _params(req, req.max_tokens))
            except WorkbenchError as e:
                raise ApiError(400, str(e)) from None
            for g in gens:
                if g.error:
                    raise ApiError(500, g.error, kind="server_error")
            choices = [{"index": i, "text": (p if req.echo else "") + g.text,
                        "finish_reason": g.finish_reason, "logprobs": None}
                       for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]
            n_prompt = sum(g.prompt_tokens for g in gens)
        n_completion = sum(g.completion_tokens for g in gens)
        if req.stream:
            def events():
                for c in choices:
                    yield _sse({"id": rid, "object": "text_completion", "created": now,
                                "model": served_name, "choices": [c]})
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return {"id": rid, "object": "text_completion", "created": now, "model": served_name,
                "choices": choices, "usage": _usage(n_prompt, n_completion)}

    # --- tokenizer -----------------------------------------------------------------------

    def need_tokenizer() -> None:
        if not caps.tokenize:
            raise ApiError(400, f"backend {model.backend_name!r} has no tokenizer to use")

    @app.post("/tokenize")
    def tokenize(req: TokenizeRequest):
        check_model(req.model)
        need_tokenizer()
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "send exactly one of prompt and messages",
                           "prompt" if req.prompt is None else "messages")
        try:
            if req.prompt is not None:
                ids = model.tokenize(req.prompt, add_special_tokens=req.add_special_tokens)
            else:
                ids = model.tokenize(conversation(req.messages),
                                     add_special_tokens=req.add_special_tokens,
                                     add_generation_prompt=req.add_generation_prompt,
                                     tools=req.tools)
        except WorkbenchError as e:
            raise ApiError(400, str(e)) from None
        return {"count": len(ids), "max_model_len": model.max_positions, "tokens": ids}

    @app.post("/detokenize")
    def detokenize(req: DetokenizeRequest):
        check_model(req.model)
        need_tokenizer()
        return {"prompt": model.detokenize(req.tokens)}

    return app


def serve(model: ChatModel, served_name: str, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "warning") -> None:
    import uvicorn

    uvicorn.run(create_app(model, served_name), host=host, port=port, log_level=log_level)
