"""`/v1/chat/completions`: a reply whole, or streamed as SSE chunks: text as it is generated,
a forced tool call's arguments as they are made, and otherwise (tools offered) the whole reply
sent as chunks, since a half-written call cannot be parsed."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from starlette.requests import Request  # at module level: FastAPI resolves the annotation

from workbench.errors import WorkbenchError
from workbench.models.base import ChatModel, Generation, GenerationParams
from workbench.models.constrain import ConstraintNotKept
from workbench.models.messages import as_tool_choice, new_call_id
from workbench.serve.limits import Ticket
from workbench.serve.replies import ApiError, constraint_error, error_body, sse, usage
from workbench.serve.schemas import ChatCompletionRequest, conversation, generation_params
from workbench.serve.state import ServerState
from workbench.serve.work import Work, admit, streamed

Chunk = Callable[..., str]  # (delta, finish_reason=None) -> one SSE chunk of this reply


def add_chat_route(app, s: ServerState) -> None:
    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request):
        return await chat_completion(s, req, request)


async def chat_completion(s: ServerState, req: ChatCompletionRequest, request: Request):
    from fastapi.responses import StreamingResponse

    model = s.model_for(req.model)  # the served model, or a runtime LoRA adapter on it
    conv = conversation(req.messages)
    tools = tool_args(s, req)
    rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    name = s.served_name if model is s.model else str(req.model)
    chunk = functools.partial(_chunk, rid, name)
    admitted = admit(s)
    ticket: Ticket | None = admitted  # None once a stream holds it (the stream releases it)
    try:
        params = await Work(s, request).run(chat_params, s, req, conv, tools)
        field = constraint_field(req, tools)
        if req.stream and not tools:
            response, ticket = streamed(s, request, admitted,
                                        _text_events(model, chunk, conv, params, field)), None
            return response
        if req.stream and field == "tools":
            response, ticket = streamed(s, request, admitted,
                                        _call_events(model, chunk, conv, params, tools)), None
            return response
        gen = (await Work(s, request).run(s.generate, [conv], params, model, field=field,
                                          **tools))[0]
    finally:
        if ticket is not None:
            ticket.release()
    message = assistant_message(gen, req.parallel_tool_calls)
    if req.stream:
        return StreamingResponse(_whole_events(chunk, message, gen.finish_reason),
                                 media_type="text/event-stream")
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "finish_reason": gen.finish_reason, "message": message,
                     "logprobs": None}],
        "usage": usage(gen.prompt_tokens, gen.completion_tokens),
    }


def tool_args(s: ServerState, req: ChatCompletionRequest) -> dict[str, Any]:
    if req.tool_choice is not None and not req.tools and req.tool_choice != "none":
        raise ApiError(400, "tool_choice: needs `tools`", "tool_choice")
    if not req.tools:
        return {}
    if not s.caps.tool_calls:
        raise ApiError(400, f"tools: backend {s.model.backend_name!r} cannot call tools",
                       "tools")
    try:
        choice = as_tool_choice(req.tool_choice, req.tools)
    except WorkbenchError as e:
        raise ApiError(400, str(e), "tool_choice") from None
    return {"tools": req.tools, "tool_choice": choice}


def chat_params(s: ServerState, req: ChatCompletionRequest, conv, tools: dict[str, Any]
                ) -> GenerationParams:
    asked = req.max_completion_tokens or req.max_tokens
    max_tokens = asked or 256
    n = s.prompt_tokens(conv, tools=tools.get("tools"))
    if n is not None:
        max_tokens = s.fit_length(n, max_tokens, asked is not None,
                                  "max_completion_tokens" if req.max_completion_tokens
                                  else "max_tokens" if asked else "messages")
    params = generation_params(req, max_tokens)
    forced = tools and tools.get("tool_choice") not in ("auto", "none")
    try:
        constraint, field = req.constraint()
    except ValueError as e:
        raise ApiError(400, str(e), str(e).split(":")[0]) from None
    if constraint is not None and not forced:  # a forced call has its own grammar
        if not s.caps.constrained:
            raise ApiError(400, f"{field}: backend {s.model.backend_name!r} cannot "
                                "constrain its output", field)
        try:
            s.model.check_constraint(constraint)
        except WorkbenchError as e:
            raise ApiError(400, f"{field}: {e}", field) from None
        params = params.model_copy(update={"constraint": constraint})
    return params


def constraint_field(req: ChatCompletionRequest, tools: dict[str, Any]) -> str:
    """The request field whose constraint the reply is made under ("" when none): a forced
    tool call's grammar is its tools' schemas, else the one field `req.constraint` names."""
    if tools.get("tool_choice") not in (None, "auto", "none"):
        return "tools"
    for field in ("guided_regex", "guided_choice", "guided_grammar"):  # as `req.constraint`
        if getattr(req, field) is not None:
            return field
    rf = req.response_format
    return "response_format" if rf is not None and rf.type != "text" else ""


def assistant_message(gen: Generation, parallel: bool | None) -> dict[str, Any]:
    calls = gen.tool_calls if parallel is not False else gen.tool_calls[:1]
    msg: dict[str, Any] = {"role": "assistant",
                           "content": gen.text if gen.text or not calls else None}
    if calls:
        msg["tool_calls"] = [tc.model_dump(mode="json") for tc in calls]
    return msg


def _chunk(rid: str, served_name: str, delta: dict, finish: str | None = None) -> str:
    return sse({"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": served_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _text_events(model: ChatModel, chunk: Chunk, conv, params: GenerationParams,
                 field: str) -> Iterator[str]:
    yield chunk({"role": "assistant", "content": ""})
    try:
        for piece in model.stream(conv, params):
            if piece:
                yield chunk({"content": piece})
        yield chunk({}, "stop")
    except ConstraintNotKept as e:  # the 400 of a reply whole, as the stream's error event
        yield sse(constraint_error(field, str(e)))
    except WorkbenchError as e:
        yield sse(error_body(str(e), "server_error", None, 500))
    yield "data: [DONE]\n\n"


def _call_events(model: ChatModel, chunk: Chunk, conv, params: GenerationParams,
                 tools: dict[str, Any]) -> Iterator[str]:
    """A forced call: its arguments stream as they are made."""
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
    except ConstraintNotKept as e:
        yield sse(constraint_error("tools", str(e)))
    except WorkbenchError as e:
        yield sse(error_body(str(e), "server_error", None, 500))
    yield "data: [DONE]\n\n"


def _whole_events(chunk: Chunk, message: dict[str, Any], finish: str) -> Iterator[str]:
    yield chunk({"role": "assistant", "content": ""})
    if message["content"]:
        yield chunk({"content": message["content"]})
    if message.get("tool_calls"):
        yield chunk({"tool_calls": [{"index": i, **tc} for i, tc in
                                    enumerate(message["tool_calls"])]})
    yield chunk({}, finish)
    yield "data: [DONE]\n\n"
