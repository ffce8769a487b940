"""The app factory: one `ServerState`, the guard middleware, the error handlers and the route
groups; and the uvicorn server that runs it, stopping running work on SIGTERM / SIGINT."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request  # at module level: FastAPI resolves the annotation

from workbench.models.base import ChatModel
from workbench.serve.chat import add_chat_route
from workbench.serve.completions import add_completion_route
from workbench.serve.limits import Guard, ServerLimits
from workbench.serve.loras import LoadLoraRequest, UnloadLoraRequest
from workbench.serve.replies import add_error_handlers
from workbench.serve.state import ServerState
from workbench.serve.tokenizer import add_tokenizer_routes
from workbench.serve.work import run_once


def create_app(model: ChatModel, served_name: str, limits: ServerLimits | None = None):
    from fastapi import FastAPI

    limits = limits or ServerLimits()
    app = FastAPI(title="workbench OpenAI-compatible server", version="1",
                  docs_url="/docs" if limits.docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if limits.docs else None)
    app.add_middleware(Guard, limits=limits)
    s = ServerState.start(model, served_name, limits)
    app.state.batcher = s.batcher
    app.state.stopping = s.stopping  # set by `make_server` on SIGTERM / SIGINT
    add_error_handlers(app)
    _add_info_routes(app, s)
    add_chat_route(app, s)
    add_completion_route(app, s)
    add_tokenizer_routes(app, s)
    _add_lora_routes(app, s)
    return app


def _add_info_routes(app, s: ServerState) -> None:
    @app.get("/health")  # async: answered on the event loop, never queued behind work
    async def health() -> dict[str, Any]:
        gate, batcher = s.gate, s.batcher
        return {"status": "ok", "model": s.served_name, "active": gate.active,
                "capacity": gate.capacity,
                "batches": len(batcher.batches) if batcher else None,
                "batched_requests": sum(batcher.batches) if batcher else None}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        loras = s.loras.listed(s.served_name, s.created) if s.loras is not None else []
        return {"object": "list", "data": [{"id": s.served_name, "object": "model",
                                             "created": s.created, "owned_by": "workbench"},
                                            *loras]}


def _add_lora_routes(app, s: ServerState) -> None:
    """vLLM's runtime LoRA API (`serve.loras`): load and unload by name, off the event
    loop and behind admission (loading reads and checks the adapter's file)."""
    @app.post("/v1/load_lora_adapter")
    async def load_lora(req: LoadLoraRequest, request: Request) -> dict[str, Any]:
        loras = s.lora_set()
        return await run_once(s, request, loras.load, req.lora_name, req.lora_path)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(req: UnloadLoraRequest, request: Request) -> dict[str, Any]:
        loras = s.lora_set()
        return await run_once(s, request, loras.unload, req.lora_name)


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
