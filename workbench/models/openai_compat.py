"""Backend for any OpenAI-compatible server: vLLM, llama.cpp server, Ollama, OpenAI itself,
or `workbench serve`.

Calls run concurrently (bounded), retry with exponential backoff on 429, 5xx and connection
errors (honouring Retry-After), and time out. The API key is read from an environment
variable, sent only in the Authorization header, and never logged or shown in repr.
Scoring uses `/v1/completions` with `echo` and `logprobs` (vLLM and `workbench serve` offer
it); a server without prompt logprobs gives a clear error.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workbench.errors import BackendError
from workbench.models.base import (
    ChatModel,
    ContinuationScore,
    Conversation,
    Generation,
    GenerationParams,
    ScoreRequest,
)
from workbench.models.registry import register_backend
from workbench.models.resolve import ModelSource

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_key_env: str = Field("OPENAI_API_KEY", description="Environment variable holding the "
                                                           "API key (may be unset for local "
                                                           "servers).")
    concurrency: int = Field(4, ge=1, le=256, description="Requests in flight at once.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(5, ge=0, description="Retries on 429/5xx/connection errors.")
    backoff_s: float = Field(0.5, ge=0, description="First backoff; doubles each retry.")
    max_backoff_s: float = Field(30.0, ge=0)
    batch_size: int = Field(32, ge=1, description="Conversations handed over per chunk (the "
                                                  "call cache stores after each chunk).")


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@register_backend("openai")
class OpenAIChatModel(ChatModel):
    def __init__(self, source: ModelSource, **options: Any):
        import httpx

        self.opts = OpenAIOptions(**options)
        self.base_url = source.url
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.opts.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(base_url=self.base_url, headers=headers,
                                    timeout=self.opts.timeout_s,
                                    limits=httpx.Limits(max_connections=self.opts.concurrency))
        self.sleeps: list[float] = []  # backoff delays taken (observable in tests)
        self.model_name = source.remote_model or self._first_model()

    @property
    def identity(self) -> str:
        return f"openai:{self.base_url}#{self.model_name}"

    def __repr__(self) -> str:  # never the key
        return f"<OpenAIChatModel {self.identity}>"

    # --- HTTP with retries -----------------------------------------------------------------

    def _request(self, method: str, path: str, json: dict | None = None) -> dict:
        import httpx

        delay = self.opts.backoff_s
        last = ""
        for attempt in range(self.opts.max_retries + 1):
            try:
                resp = self._client.request(method, path, json=json)
                if resp.status_code in RETRY_STATUS:
                    ra = resp.headers.get("retry-after")
                    raise _Retryable(f"HTTP {resp.status_code}",
                                     float(ra) if ra and ra.replace(".", "").isdigit() else None)
                if resp.status_code >= 400:
                    raise BackendError(f"{self.base_url}{path}: HTTP {resp.status_code}: "
                                       f"{_error_text(resp)}")
                return resp.json()
            except (_Retryable, httpx.TransportError) as e:
                last = str(e) or type(e).__name__
                if attempt == self.opts.max_retries:
                    break
                wait = e.retry_after if isinstance(e, _Retryable) and e.retry_after else delay
                wait = min(wait, self.opts.max_backoff_s) * (1 + 0.1 * random.random())
                self.sleeps.append(wait)
                time.sleep(wait)
                delay *= 2
        if "connect" in last.lower() or "refused" in last.lower():
            raise BackendError(f"cannot reach {self.base_url}: {last}; is the server running?")
        raise _GaveUp(f"{self.base_url}{path}: gave up after {self.opts.max_retries} retries "
                      f"({last})")

    def _first_model(self) -> str:
        data = self._request("GET", "/models").get("data") or []
        if not data:
            raise BackendError(f"{self.base_url}/models lists no model; pass URL#model")
        return data[0]["id"]

    # --- protocol --------------------------------------------------------------------------

    def _chat_one(self, conv: Conversation, params: GenerationParams) -> Generation:
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": [{"role": m["role"], "content": m["content"]} for m in conv],
            "max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.top_k is not None:
            body["top_k"] = params.top_k  # vLLM, llama.cpp and Ollama accept it
        try:
            data = self._request("POST", "/chat/completions", json=body)
        except _GaveUp as e:
            return Generation(text="", finish_reason="error", error=str(e))
        except BackendError as e:
            if "cannot reach" in str(e):
                raise
            return Generation(text="", finish_reason="error", error=str(e))
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return Generation(text=choice["message"].get("content") or "",
                          finish_reason=choice.get("finish_reason") or "stop",
                          prompt_tokens=usage.get("prompt_tokens", 0),
                          completion_tokens=usage.get("completion_tokens", 0))

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None) -> list[Generation]:
        params = params or GenerationParams()
        if len(conversations) == 1:
            return [self._chat_one(conversations[0], params)]
        with ThreadPoolExecutor(self.opts.concurrency) as pool:
            return list(pool.map(lambda c: self._chat_one(c, params), conversations))

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        import json

        params = params or GenerationParams()
        body = {"model": self.model_name, "messages": conversation, "stream": True,
                "max_tokens": params.max_tokens, "temperature": params.temperature}
        if params.stop:
            body["stop"] = list(params.stop)
        with self._client.stream("POST", "/chat/completions", json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise BackendError(f"HTTP {resp.status_code}: {_error_text(resp)}")
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                delta = json.loads(payload)["choices"][0].get("delta", {})
                if delta.get("content"):
                    yield delta["content"]

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        jobs = []
        for req in requests:
            if not isinstance(req.prompt, str):
                raise BackendError("scoring a chat conversation over HTTP needs the server's "
                                   "chat template; pass the rendered prompt string instead")
            jobs += [(req.prompt, c) for c in req.continuations]
        with ThreadPoolExecutor(self.opts.concurrency) as pool:
            flat = list(pool.map(lambda pc: self._score_one(*pc), jobs))
        out, k = [], 0
        for req in requests:
            out.append(flat[k:k + len(req.continuations)])
            k += len(req.continuations)
        return out

    def _score_one(self, prompt: str, continuation: str) -> ContinuationScore:
        body = {"model": self.model_name, "prompt": prompt + continuation, "max_tokens": 0,
                "echo": True, "logprobs": 1, "temperature": 0.0}
        try:
            data = self._request("POST", "/completions", json=body)
            lp = data["choices"][0]["logprobs"]
            offsets, values = lp["text_offset"], lp["token_logprobs"]
            top = lp.get("top_logprobs")
            tokens = lp.get("tokens")
        except (BackendError, _GaveUp, KeyError, TypeError, IndexError) as e:
            raise BackendError(f"{self.base_url} does not return prompt logprobs "
                               f"(/v1/completions with echo and logprobs): {e}; use a local "
                               "model or vLLM for log-likelihood scoring") from None
        start = len(prompt)
        idx = [i for i, off in enumerate(offsets) if off >= start]
        total = sum(values[i] for i in idx if values[i] is not None)
        greedy = bool(top) and all(
            top[i] and max(top[i], key=top[i].get) == tokens[i] for i in idx)
        return ContinuationScore(logprob=float(total), n_tokens=len(idx),
                                 n_chars=len(continuation), is_greedy=greedy)

    def close(self) -> None:
        self._client.close()


class _GaveUp(BackendError):
    pass


def _error_text(resp) -> str:
    try:
        data = resp.json()
        err = data.get("error", data)
        return (err.get("message") if isinstance(err, dict) else str(err))[:300]
    except Exception:
        return resp.text[:300]
