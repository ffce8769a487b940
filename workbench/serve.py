"""An OpenAI-compatible HTTP server over any workbench model (FastAPI + uvicorn).

Routes: `/health`, `/v1/models`, `/v1/chat/completions` (plain and streaming SSE) and
`/v1/completions` for prompt scoring (`echo` + `logprobs` with `max_tokens: 0`, the request
lm-evaluation-harness and our `openai` backend send for log-likelihoods).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workbench.errors import WorkbenchError
from workbench.models.base import ChatModel, GenerationParams


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use (user, ...)
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1)


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str
    max_tokens: int = 16
    echo: bool = False
    logprobs: int | None = None
    temperature: float = 0.0


def _params(req: ChatCompletionRequest) -> GenerationParams:
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    return GenerationParams(max_tokens=req.max_completion_tokens or req.max_tokens or 256,
                            temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                            stop=tuple(stop), seed=req.seed)


def create_app(model: ChatModel, served_name: str):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="workbench OpenAI-compatible server", version="1")
    created = int(time.time())

    def check_model(name: str | None) -> None:
        if name not in (None, "", served_name):
            raise HTTPException(404, detail=f"model {name!r} is not served here "
                                            f"(serving {served_name!r})")

    @app.exception_handler(HTTPException)
    async def _http_error(_, exc: HTTPException):  # OpenAI's error shape
        return JSONResponse({"error": {"message": exc.detail, "type": "invalid_request_error",
                                       "code": exc.status_code}}, status_code=exc.status_code)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": served_name}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served_name, "object": "model",
                                             "created": created, "owned_by": "workbench"}]}

    @app.post("/v1/chat/completions")
    def chat(req: ChatCompletionRequest):
        check_model(req.model)
        conv = [{"role": m.role, "content": m.content} for m in req.messages]
        params = _params(req)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if req.stream:
            def events():
                def chunk(delta: dict, finish: str | None = None) -> str:
                    body = {"id": rid, "object": "chat.completion.chunk",
                            "created": int(time.time()), "model": served_name,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    return f"data: {json.dumps(body)}\n\n"

                yield chunk({"role": "assistant", "content": ""})
                try:
                    for piece in model.stream(conv, params):
                        if piece:
                            yield chunk({"content": piece})
                    yield chunk({}, "stop")
                except WorkbenchError as e:
                    yield f"data: {json.dumps({'error': {'message': str(e)}})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        gen = model.generate([conv], params)[0]
        if gen.error:
            raise HTTPException(500, detail=gen.error)
        return {
            "id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": served_name,
            "choices": [{"index": 0, "finish_reason": gen.finish_reason,
                         "message": {"role": "assistant", "content": gen.text}}],
            "usage": {"prompt_tokens": gen.prompt_tokens,
                      "completion_tokens": gen.completion_tokens,
                      "total_tokens": gen.prompt_tokens + gen.completion_tokens},
        }

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        check_model(req.model)
        if not (req.echo and req.max_tokens == 0 and req.logprobs is not None):
            raise HTTPException(400, detail="only prompt scoring is served here: send echo=true,"
                                            " logprobs>=0 and max_tokens=0")
        fn = getattr(model, "token_logprobs", None)
        if fn is None:
            raise HTTPException(400, detail=f"backend {model.backend_name} has no logprobs")
        tokens, offsets, values = fn(req.prompt)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
            "created": int(time.time()), "model": served_name,
            "choices": [{"index": 0, "text": req.prompt, "finish_reason": "length",
                         "logprobs": {"tokens": tokens, "text_offset": offsets,
                                      "token_logprobs": values, "top_logprobs": None}}],
            "usage": {"prompt_tokens": len(tokens), "completion_tokens": 0,
                      "total_tokens": len(tokens)},
        }

    return app


def serve(model: ChatModel, served_name: str, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "warning") -> None:
    import uvicorn

    uvicorn.run(create_app(model, served_name), host=host, port=port, log_level=log_level)
