"""What the server accepts and from whom: the limits (`ServerLimits`, the CLI's options, and
the bounds on caller-supplied schemas, regexes and grammars), the ASGI guard that enforces
the API key, the body size and text that can become UTF-8, and the admission gate that
bounds how many generation requests run or wait at once."""

from __future__ import annotations

import hmac
import json
import re
import threading
from typing import Any

from pydantic import Field

# the bounds on caller-supplied schemas, regexes and grammars live with constrained decoding,
# which holds every caller to them (the server, an agent's forced tool call)
from workbench.models.bounds import (  # noqa: F401
    MAX_SCHEMA_ALTERNATIVES,
    MAX_SCHEMA_CHARS,
    MAX_SCHEMA_DEPTH,
)
from workbench.records import StrictModel


class ServerLimits(StrictModel):
    """What `workbench serve` accepts and from whom (the CLI's options)."""

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
                                   "off. An engine that batches concurrent requests itself "
                                   "(llama.cpp's slots) takes each as it comes.")
    lora_dir: str | None = Field(None, description="Folder runtime LoRA adapters may be "
                                 "loaded from (/v1/load_lora_adapter, vLLM's API); None: "
                                 "runtime adapters are off.")
    max_loras: int = Field(8, ge=1, le=64, description="Runtime LoRA adapters loaded at "
                                                       "once; more are refused.")


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
    """ASGI middleware: the API key on every route (401), the body limit (413) enforced
    while the body streams in, so an oversized body is never held whole, and text that
    cannot become UTF-8 (400 naming the field: `unencodable_text`)."""

    def __init__(self, app, limits: ServerLimits):
        self.app, self.limits = app, limits

    @staticmethod
    async def _reply(send, status: int, message: str, code: str,
                     param: str | None = None) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                     "param": param, "code": code}}).encode()
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
        if (bad := unencodable_text(b"".join(chunks))) is not None:
            where, problem = bad
            return await self._reply(send, 400, f"{where or 'the body'}: {problem}",
                                     "invalid_request", where or None)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # from here on only http.disconnect comes

        return await self.app(scope, replay, send)


# In a UTF-8 body a surrogate can only come from a `\uD800`-`\uDFFF` escape or from the bytes
# ED A0-BF (which `json.loads` decodes with "surrogatepass"): a body without either is parsed
# once, by the route, not twice.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def unencodable_text(body: bytes) -> tuple[str, str] | None:
    """(the field's path, the problem) when a string of the JSON body, a key included, at any
    depth, holds a lone UTF-16 surrogate: legal JSON (`"\\ud800"`), but no character, and
    nothing can encode it as UTF-8, so it raised wherever the text went (a tokenizer, a reply
    echoing it: a 500 on every route). The Guard refuses such a body with a 400 naming the
    field, before any route (or stream) starts. What OpenAI's API does with one is not
    documented; clients report its 400 "could not parse the JSON body" for bodies it cannot
    read, and Anthropic's answers 400 "no low surrogate in string". A body that is not JSON
    is left to the route, which refuses it."""
    try:
        if json.detect_encoding(body).startswith("utf-8") and not _MAYBE_SURROGATE.search(body):
            return None
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode()  # in C: raises when there is one
        return None
    except (UnicodeEncodeError, RecursionError):
        pass  # there is one (or the body is too deep to tell): find it
    # iteratively, as the body may nest deeply; a trail (the parent's trail, key or index)
    # is made into a path only for the string refused
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        v, trail = stack.pop()
        if isinstance(v, str):
            if m := _SURROGATE.search(v):
                return _path(trail), _lone_surrogate(v, m.start(), "the text")
            continue
        inner = []
        for k, x in v.items() if isinstance(v, dict) else enumerate(v):
            if isinstance(k, str) and not k.isascii() and (m := _SURROGATE.search(k)):
                return _path((trail, k)), _lone_surrogate(k, m.start(), "the key")
            if isinstance(x, list | dict) or (isinstance(x, str) and not x.isascii()):
                inner.append((x, (trail, k)))
        stack.extend(reversed(inner))
    return None


def _path(trail) -> str:
    """`messages[0].content`; a key that is no name as `["a key"]`, in ASCII."""
    keys = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    out = ""
    for key in reversed(keys):
        if isinstance(key, int):
            out += f"[{key}]"
        elif _NAME.fullmatch(key):
            out += f".{key}" if out else key
        else:
            out += f"[{json.dumps(key)}]"
    return out


def _lone_surrogate(text: str, at: int, what: str) -> str:
    return (f"{what} holds a lone UTF-16 surrogate (U+{ord(text[at]):04X} at character "
            f"{at}): not a character, it cannot be encoded as UTF-8; send valid Unicode (a "
            "character beyond U+FFFF as a pair of \\u escapes)")
