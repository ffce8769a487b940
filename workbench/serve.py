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

import asyncio
import functools
import hmac
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from starlette.requests import Request  # at module level: FastAPI resolves the annotation

from workbench.errors import WorkbenchError
from workbench.models.base import (
    Cancelled,
    ChatModel,
    Generation,
    GenerationParams,
    cancel_context,
)
from workbench.models.constrain import Constraint
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


MAX_STOPS, MAX_STOP_CHARS = 4, 256


class ResponseFormat(_Strict):
    """OpenAI's `response_format`: "text", "json_object" (any JSON object) or "json_schema"
    (`{"name", "schema", "strict"?, "description"?}`); the reply is generated under it."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @field_validator("json_schema")
    @classmethod
    def _named_schema(cls, v, info: ValidationInfo):
        if v is None:
            return v
        if extra := set(v) - {"name", "schema", "strict", "description"}:
            raise ValueError(f"json_schema: unsupported field {sorted(extra)[0]!r}")
        if not isinstance(v.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}",
                                                                   v["name"]):
            raise ValueError("json_schema.name: 1 to 64 letters, digits, _ or -")
        if not isinstance(v.get("schema", {}), dict):
            raise ValueError("json_schema.schema: a JSON schema object")
        return v

    def constraint(self) -> Constraint | None:
        if self.type == "json_object":
            return Constraint.json_object()
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("response_format: type json_schema needs `json_schema`")
            return Constraint.json_schema(self.json_schema.get("schema") or {"type": "object"})
        return None


class _Sampling(_Strict):
    """The sampling fields both generation routes accept."""

    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float | None = Field(None, gt=0.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # int64, as OpenAI

    @field_validator("stop")
    @classmethod
    def _few_short_stops(cls, v):
        """At most MAX_STOPS strings (OpenAI's 4) of 1 to MAX_STOP_CHARS characters: each
        costs a pass over the vocabulary, and 10,000 of them wedged the server."""
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not 1 <= len(x) <= MAX_STOP_CHARS for x in stops):
            raise ValueError(f"each stop string has 1 to {MAX_STOP_CHARS} characters")
        return v
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
    response_format: ResponseFormat | None = None
    # vLLM's guided decoding fields (what `models.openai_compat` sends for non-JSON shapes)
    guided_regex: str | None = Field(None, max_length=10_000)
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=1_000)
    guided_grammar: str | None = Field(None, max_length=100_000, description="Lark")

    def constraint(self) -> tuple[Constraint | None, str]:
        """The output constraint asked for, and the field that asked (at most one)."""
        asked = [(f, v) for f, v in (("guided_regex", self.guided_regex),
                                     ("guided_choice", self.guided_choice),
                                     ("guided_grammar", self.guided_grammar)) if v is not None]
        if self.response_format is not None and self.response_format.type != "text":
            asked.append(("response_format", self.response_format))
        if len(asked) > 1:
            raise ValueError(f"{asked[1][0]}: send one of response_format, guided_regex, "
                             "guided_choice and guided_grammar")
        if not asked:
            return None, ""
        field, v = asked[0]
        if field == "response_format":
            return v.constraint(), field
        if field == "guided_regex":
            return Constraint.regex(v), field
        if field == "guided_choice":
            return Constraint.choice(v), field
        return Constraint.lark(v), field




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
    messages: list[ChatMessageIn] | None = Field(None, min_length=1)
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


class ServerLimits(BaseModel):
    """What `workbench serve` accepts and from whom (the CLI's options)."""

    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(None, description="Required as `Authorization: Bearer <key>` "
                                                   "on every route when set.")
    docs: bool = Field(False, description="Serve /docs and /openapi.json.")
    max_body_bytes: int = Field(1_000_000, ge=1, description="Larger request bodies get 413.")
    max_queue: int = Field(16, ge=0, description="Requests that may wait while one generates; "
                                                 "more get 429.")
    disconnect_poll_s: float = Field(0.1, gt=0, description="How often a running request "
                                                           "checks that its client is there.")
    batch_window_ms: float = Field(10.0, ge=0, description="How long a greedy chat request "
                                   "waits for others to share its batch; 0 turns batching "
                                   "off.")


class _Gate:
    """Admission: at most `1 + max_queue` generation requests at once, the rest get 429."""

    def __init__(self, capacity: int):
        self.capacity, self.active = capacity, 0
        self._lock = threading.Lock()

    def admit(self) -> _Ticket | None:
        with self._lock:
            if self.active >= self.capacity:
                return None
            self.active += 1
            return _Ticket(self)


class _Ticket:
    def __init__(self, gate: _Gate):
        self.gate, self.done = gate, False

    def release(self) -> None:
        with self.gate._lock:
            if not self.done:
                self.done = True
                self.gate.active -= 1


class _AllSet:
    """Set once every one of `events` is: a shared batch stops only when all its clients
    have left."""

    def __init__(self, events: list[threading.Event]):
        self.events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self.events)


class _Batcher:
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

    def generate(self, conv, params: GenerationParams, tools: dict[str, Any]) -> Generation:
        """Blocks until this conversation's reply is ready; call it in a worker thread."""
        from concurrent.futures import Future

        from workbench.models.base import cancel_event

        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="serve-batcher",
                                                daemon=True)
                self._thread.start()
        done: Future = Future()
        key = (params, json.dumps(_plain_tools(tools), sort_keys=True))
        self.requests.put((key, conv, params, tools, cancel_event() or threading.Event(), done))
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
        _, _, params, tools, _, _ = batch[0]
        live = [b for b in batch if not b[4].is_set()]
        for b in batch:
            if b[4].is_set():
                b[5].set_exception(ApiGone())
        if not live:
            return
        self.batches.append(len(live))
        context = cancel_context(_AllSet([b[4] for b in live]))  # type: ignore[arg-type]
        try:
            gens = context.run(self.model.generate, [b[1] for b in live], params, **tools)
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
    choice = tools.get("tool_choice")
    return {"tools": [t.model_dump(mode="json") if hasattr(t, "model_dump") else t
                      for t in tools["tools"]],
            "tool_choice": choice.model_dump(mode="json") if hasattr(choice, "model_dump")
            else choice}


def _auth_ok(header: bytes | None, key: str) -> bool:
    scheme, _, token = (header or b"").decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              key.encode())


class _Guard:
    """ASGI middleware: the API key on every route (401), and the body limit (413) enforced
    while the body streams in, so an oversized body is never held whole."""

    def __init__(self, app, limits: ServerLimits):
        self.app, self.limits = app, limits

    @staticmethod
    async def _reply(send, status: int, message: str, code: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                     "param": None, "code": code}}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limits = self.limits
        headers = dict(scope.get("headers") or [])
        if limits.api_key and not _auth_ok(headers.get(b"authorization"), limits.api_key):
            return await self._reply(send, 401, "missing or incorrect API key: send "
                                                "`Authorization: Bearer <key>`",
                                     "invalid_api_key")
        too_big = (f"the request body is over the server's limit of {limits.max_body_bytes} "
                   "bytes")
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > limits.max_body_bytes:
            return await self._reply(send, 413, too_big, "request_too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limits.max_body_bytes:
                return await self._reply(send, 413, too_big, "request_too_large")
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # from here on only http.disconnect comes

        return await self.app(scope, replay, send)


def create_app(model: ChatModel, served_name: str, limits: ServerLimits | None = None):
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException as StarletteHTTPException

    limits = limits or ServerLimits()
    app = FastAPI(title="workbench OpenAI-compatible server", version="1",
                  docs_url="/docs" if limits.docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if limits.docs else None)
    app.add_middleware(_Guard, limits=limits)
    created = int(time.time())
    caps = model.capabilities
    gate = _Gate(1 + limits.max_queue)
    batcher = _Batcher(model, limits.batch_window_ms / 1000) if limits.batch_window_ms else None
    app.state.batcher = batcher
    app.state.stopping = stopping = threading.Event()  # set by `serve` on SIGTERM / SIGINT

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

    @app.exception_handler(Cancelled)
    async def _cancelled(_: Request, exc: Cancelled):  # the client has gone: nobody reads it
        return JSONResponse(error_body(str(exc), "client_closed_request", None, 499),
                            status_code=499)

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

    # --- running work off the event loop, stopped when the client leaves ----------------

    def admit() -> _Ticket:
        ticket = gate.admit()
        if ticket is None:
            raise ApiError(429, f"the server is busy ({gate.active} requests running or "
                                "queued); retry later", kind="rate_limit_error")
        return ticket

    class Work:
        """One request's work, run in worker threads inside a context whose cancel event
        is set when the client disconnects (or the request is cancelled)."""

        def __init__(self, request: Request):
            self.request, self.cancel = request, threading.Event()
            self.context = cancel_context(self.cancel)

        async def run(self, fn, *args, **kwargs):
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(None, functools.partial(self.context.run, fn, *args,
                                                               **kwargs))
            try:
                while True:
                    done, _ = await asyncio.wait({fut}, timeout=limits.disconnect_poll_s)
                    if done:
                        break
                    if stopping.is_set() or (not self.cancel.is_set()
                                             and await self.request.is_disconnected()):
                        self.cancel.set()
            except BaseException:
                self.cancel.set()
                raise
            if stopping.is_set():  # a reply cut short by the shutdown is not a reply
                fut.exception()  # retrieved, so asyncio does not log it
                raise ApiError(503, "the server is shutting down; retry later",
                               kind="server_error")
            return fut.result()

    async def run_once(request: Request, fn, *args, **kwargs):
        ticket = admit()
        try:
            return await Work(request).run(fn, *args, **kwargs)
        finally:
            ticket.release()

    def streamed(request: Request, ticket: _Ticket, pieces: Iterator[str]):
        """SSE from a sync iterator of events, each `next` in a worker thread; generation
        stops when the client leaves (seen between events, or by polling while one is being
        made), and the ticket is released then."""
        work, end = Work(request), object()

        async def events():
            try:
                while True:
                    piece = await work.run(next, pieces, end)
                    if piece is end:
                        break
                    yield piece
                    if await request.is_disconnected():
                        break
            finally:
                work.cancel.set()
                ticket.release()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(ticket.release))

    def fit_length(n_prompt: int, max_tokens: int, explicit: bool, param: str) -> int:
        """`max_tokens` that fits the model's positions after a prompt of `n_prompt` tokens:
        an explicit one that does not fit is refused, the default is cut to what fits."""
        limit = model.max_positions
        if limit is None:
            return max_tokens
        if n_prompt >= limit or (explicit and n_prompt + max_tokens > limit):
            raise ApiError(400, f"the prompt has {n_prompt} tokens and max_tokens is "
                                f"{max_tokens}: together {n_prompt + max_tokens} exceed the "
                                f"model's {limit} positions; shorten the prompt or lower "
                                "max_tokens", param)
        return min(max_tokens, limit - n_prompt)

    def prompt_tokens(prompt, **kw) -> int | None:
        """Tokens of a prompt (text or conversation), when the backend can count them."""
        if not caps.tokenize or model.max_positions is None:
            return None
        from jinja2 import TemplateError

        try:
            return len(model.tokenize(prompt, **kw))
        except TemplateError as e:
            raise ApiError(400, f"the chat template refused the conversation: {e}",
                           "messages") from None
        except WorkbenchError as e:
            raise ApiError(400, str(e)) from None

    def check_model(name: str | None) -> None:
        if name not in (None, "", served_name):
            raise ApiError(404, f"model {name!r} is not served here (serving {served_name!r})",
                           "model", kind="not_found_error")

    def generate(convs, params, **tools) -> list[Generation]:
        from jinja2 import TemplateError

        try:
            if batcher is not None and len(convs) == 1 and batcher.batchable(params):
                try:
                    gens = [batcher.generate(convs[0], params, tools)]
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
            if g.error:
                raise ApiError(500, g.error, kind="server_error")
        return gens

    @app.get("/health")  # async: answered on the event loop, never queued behind work
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": served_name, "active": gate.active,
                "capacity": gate.capacity,
                "batches": len(batcher.batches) if batcher else None,
                "batched_requests": sum(batcher.batches) if batcher else None}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
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

    def chat_params(req: ChatCompletionRequest, conv, tools: dict[str, Any]
                    ) -> GenerationParams:
        asked = req.max_completion_tokens or req.max_tokens
        max_tokens = asked or 256
        n = prompt_tokens(conv, tools=tools.get("tools"))
        if n is not None:
            max_tokens = fit_length(n, max_tokens, asked is not None,
                                    "max_completion_tokens" if req.max_completion_tokens
                                    else "max_tokens" if asked else "messages")
        params = _params(req, max_tokens)
        forced = tools and tools.get("tool_choice") not in ("auto", "none")
        try:
            constraint, field = req.constraint()
        except ValueError as e:
            raise ApiError(400, str(e), str(e).split(":")[0]) from None
        if constraint is not None and not forced:  # a forced call has its own grammar
            if not caps.constrained:
                raise ApiError(400, f"{field}: backend {model.backend_name!r} cannot "
                                    "constrain its output", field)
            try:
                model.check_constraint(constraint)
            except WorkbenchError as e:
                raise ApiError(400, f"{field}: {e}", field) from None
            params = params.model_copy(update={"constraint": constraint})
        return params

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        check_model(req.model)
        conv = conversation(req.messages)
        tools = tool_args(req)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"

        def chunk(delta: dict, finish: str | None = None) -> str:
            return _sse({"id": rid, "object": "chat.completion.chunk",
                         "created": int(time.time()), "model": served_name,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        ticket = admit()
        try:
            params = await Work(request).run(chat_params, req, conv, tools)
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

                response, ticket = streamed(request, ticket, events()), None
                return response
            if req.stream and tools.get("tool_choice") not in (None, "auto", "none"):
                def call_events():  # a forced call: its arguments stream as they are made
                    from workbench.models.messages import new_call_id

                    yield chunk({"role": "assistant", "content": None})
                    cid, finish = new_call_id(), "tool_calls"
                    try:
                        for kind, value in model.stream_tool_call(conv, params, **tools):
                            if kind == "name":
                                yield chunk({"tool_calls": [{
                                    "index": 0, "id": cid, "type": "function",
                                    "function": {"name": value, "arguments": ""}}]})
                            elif kind == "arguments":
                                yield chunk({"tool_calls": [{
                                    "index": 0, "function": {"arguments": value}}]})
                            else:
                                finish = value
                        yield chunk({}, finish)
                    except WorkbenchError as e:
                        yield _sse(error_body(str(e), "server_error", None, 500))
                    yield "data: [DONE]\n\n"

                response, ticket = streamed(request, ticket, call_events()), None
                return response
            gen = (await Work(request).run(generate, [conv], params, **tools))[0]
        finally:
            if ticket is not None:
                ticket.release()
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

    def text_tokens(i: int, prompt: str) -> int | None:
        n = prompt_tokens(prompt)
        if n == 0:
            raise ApiError(400, f"prompt {i} is empty (0 tokens)", "prompt")
        return n

    def scored_choice(i: int, prompt: str, top: int) -> dict[str, Any]:
        n = text_tokens(i, prompt)
        if n is not None and n > model.max_positions:
            raise ApiError(400, f"prompt {i} has {n} tokens, over the model's "
                                f"{model.max_positions} positions", "prompt")
        lp = model.token_logprobs(prompt, top)
        return {"index": i, "text": prompt, "finish_reason": "length",
                "logprobs": {"tokens": lp.tokens, "text_offset": lp.offsets,
                             "token_logprobs": lp.logprobs, "top_logprobs": lp.top}}

    def completion_body(req: CompletionRequest) -> dict[str, Any]:
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
            for i, p in enumerate(prompts):
                if (n := text_tokens(i, p)) is not None:
                    fit_length(n, req.max_tokens, True, "max_tokens")
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
        return {"id": rid, "object": "text_completion", "created": now, "model": served_name,
                "choices": choices, "usage": _usage(n_prompt, n_completion)}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(req.model)
        body = await run_once(request, completion_body, req)
        if not req.stream:
            return body

        def events():
            for c in body["choices"]:
                yield _sse({"id": body["id"], "object": "text_completion",
                            "created": body["created"], "model": served_name, "choices": [c]})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- tokenizer -----------------------------------------------------------------------

    def need_tokenizer() -> None:
        if not caps.tokenize:
            raise ApiError(400, f"backend {model.backend_name!r} has no tokenizer to use")

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest, request: Request):
        check_model(req.model)
        need_tokenizer()
        if (req.prompt is None) == (req.messages is None):
            raise ApiError(400, "send exactly one of prompt and messages",
                           "prompt" if req.prompt is None else "messages")
        return await run_once(request, tokenized, req)  # behind admission, like generation

    def tokenized(req: TokenizeRequest) -> dict[str, Any]:
        from jinja2 import TemplateError

        try:
            if req.prompt is not None:
                ids = model.tokenize(req.prompt, add_special_tokens=req.add_special_tokens)
            else:
                ids = model.tokenize(conversation(req.messages),
                                     add_special_tokens=req.add_special_tokens,
                                     add_generation_prompt=req.add_generation_prompt,
                                     tools=req.tools)
        except TemplateError as e:
            raise ApiError(400, f"the chat template refused the conversation: {e}",
                           "messages") from None
        except WorkbenchError as e:
            raise ApiError(400, str(e)) from None
        return {"count": len(ids), "max_model_len": model.max_positions, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest, request: Request):
        check_model(req.model)
        need_tokenizer()
        return await run_once(request, detokenized, req)

    def detokenized(req: DetokenizeRequest) -> dict[str, Any]:
        try:
            return {"prompt": model.detokenize(req.tokens)}
        except WorkbenchError as e:
            raise ApiError(400, str(e), "tokens") from None

    return app


def make_server(app, *, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "warning"):
    """The uvicorn server of `app` (from `create_app`). On SIGTERM / SIGINT running work stops
    at once (within a forward pass) and answers 503, so the graceful shutdown ends well
    inside its 5 s instead of cancelling requests mid-flight (one traceback each)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.stopping.set()
            super().handle_exit(sig, frame)

    return Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                 timeout_graceful_shutdown=5))


def serve(model: ChatModel, served_name: str, *, host: str = "127.0.0.1", port: int = 8000,
          limits: ServerLimits | None = None, log_level: str = "warning") -> None:
    """Run the server until SIGTERM/SIGINT; running requests stop and get 503."""
    make_server(create_app(model, served_name, limits), host=host, port=port,
                log_level=log_level).run()
