"""What the server accepts and from whom: the limits (`ServerLimits`, the CLI's options),
the ASGI guard that enforces the API key and the body size, and the admission gate that
bounds how many generation requests run or wait at once."""

from __future__ import annotations

import hmac
import json
import threading

from pydantic import BaseModel, ConfigDict, Field


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


class Gate:
    """Admission: at most `1 + max_queue` generation requests at once, the rest get 429."""

    def __init__(self, capacity: int):
        self.capacity, self.active = capacity, 0
        self._lock = threading.Lock()

    def admit(self) -> Ticket | None:
        with self._lock:
            if self.active >= self.capacity:
                return None
            self.active += 1
            return Ticket(self)


class Ticket:
    def __init__(self, gate: Gate):
        self.gate, self.done = gate, False

    def release(self) -> None:
        with self.gate._lock:
            if not self.done:
                self.done = True
                self.gate.active -= 1


def _auth_ok(header: bytes | None, key: str) -> bool:
    scheme, _, token = (header or b"").decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              key.encode())


class Guard:
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
