"""Backend for any OpenAI-compatible server: vLLM, llama.cpp server, Ollama, OpenAI itself,
or `workbench serve`.

Calls run concurrently (bounded), retry with exponential backoff on 429, 5xx and connection
errors (honouring Retry-After), and time out. The API key is read from an environment
variable, sent only in the Authorization header, and never logged or shown in repr.
Tools go out as OpenAI `tools` and calls come back from `message.tool_calls`. A seeded
batch sends the i-th conversation seed + i (equal prompts get different samples, as in one
local batch). `load_lora` / `unload_lora` use vLLM's runtime LoRA API (GRPO's rollout server
loads each published adapter with them).

Scoring uses `/v1/completions` with `echo` and `logprobs` (vLLM and `workbench serve` offer
it); a server without prompt logprobs gives a clear error. A chat prompt is first rendered to
text with the served model's chat template: locally from its tokenizer (the `tokenizer`
option, or the served model name when it resolves to a model on this machine), otherwise by
the server's `/tokenize` + `/detokenize` (vLLM, `workbench serve`). Special tokens the
template writes and the server adds again when it tokenises the completion prompt (a second
BOS) are taken out of the text, so the scored tokens are the ones the template makes.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field

from workbench.errors import BackendError, ModelNotFoundError, WorkbenchError
from workbench.models.backends import register_backend
from workbench.models.base import (
    Capabilities,
    ChatModel,
    ContinuationScore,
    Conversation,
    Generation,
    GenerationParams,
    ScoreRequest,
    TokenLogprobs,
    Tools,
)
from workbench.models.constrain import Constraint, ConstraintNotKept, check_text, wire_fields
from workbench.models.local import model_folder
from workbench.models.messages import (
    ToolCall,
    ToolChoice,
    ToolSpec,
    plain_conversation,
)
from workbench.models.resolve import ModelSource, resolve_chat_model
from workbench.models.tools import TemplateTools, template_messages
from workbench.records import StrictModel

log = logging.getLogger(__name__)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIOptions(StrictModel):
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
    tokenizer: str | None = Field(None, description="Model spec or folder whose chat template "
                                                    "renders conversations for scoring; "
                                                    "'server' asks the server's /tokenize; "
                                                    "default: the served model name if it "
                                                    "resolves here, else the server.")


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@register_backend("openai")
class OpenAIChatModel(ChatModel):
    # constrained: passes constraints on (response_format; vLLM's guided_* fields) and forced
    # tool choices; a server that cannot honour them answers 400, an error generation
    capabilities = Capabilities(score=True, tool_calls=True, token_logprobs=True, stream=True,
                                constrained=True)

    def __init__(self, source: ModelSource, **options: Any):
        import httpx

        self.opts = OpenAIOptions(**options)
        self._template_source: ModelSource | None = None
        if self.opts.tokenizer not in (None, "server"):
            self._template_source = resolve_chat_model(self.opts.tokenizer)
            if self._template_source.kind == "openai":
                raise WorkbenchError(f"tokenizer option {self.opts.tokenizer!r}: pass a local "
                                     "model spec or folder (or 'server'), not a URL")
        self._renderer: _Renderer | None = None
        self._rendered: dict[str, str] = {}
        if source.url is None:  # resolve gives every openai source its URL
            raise WorkbenchError(f"{source.name}: no server URL to send requests to")
        self.base_url: str = source.url
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
    def batch_size(self) -> int:
        return self.opts.batch_size

    @property
    def identity(self) -> str:
        return f"openai:{self.base_url}#{self.model_name}"

    def __repr__(self) -> str:  # never the key
        return f"<OpenAIChatModel {self.identity}>"

    # --- HTTP with retries -----------------------------------------------------------------

    def _request(self, method: str, path: str, json: dict | None = None, *,
                 text_reply: bool = False) -> dict:
        """The reply's JSON (with `text_reply`, {} for a reply that is not JSON: vLLM answers
        its LoRA routes with a line of text)."""
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
                    kind = _error_kind(_error_code(resp))  # serve's 400 for a constraint
                    raise kind(f"{resp.request.url}: HTTP {resp.status_code}: "
                               f"{_error_text(resp)}")
                if text_reply:
                    try:
                        data = resp.json()
                    except ValueError:
                        return {}
                    return data if isinstance(data, dict) else {}
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
        where = path if "://" in path else f"{self.base_url}{path}"
        raise _GaveUp(f"{where}: gave up after {self.opts.max_retries} retries "
                      f"({last})")

    def _first_model(self) -> str:
        data = self._request("GET", "/models").get("data") or []
        if not data:
            raise BackendError(f"{self.base_url}/models lists no model; pass URL#model")
        return data[0]["id"]

    # --- runtime LoRA adapters (vLLM's API; `workbench serve --lora-dir` offers it too) ----

    def served_models(self) -> list[str]:
        """The names `/v1/models` lists: the base model and any loaded LoRA adapters."""
        return [str(m.get("id")) for m in self._request("GET", "/models").get("data") or ()
                if isinstance(m, dict)]

    def load_lora(self, name: str, path: str) -> None:
        """Load the PEFT adapter folder `path` (a path the server can read) under `name`
        (`POST /v1/load_lora_adapter`); a request with `model=name` then uses it. vLLM needs
        `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`."""
        try:
            self._request("POST", "/load_lora_adapter",
                          json={"lora_name": name, "lora_path": path}, text_reply=True)
        except BackendError as e:
            if name in self._listed():  # a retried request that had got through
                return
            raise BackendError(f"the server did not load LoRA adapter {name!r} from {path}: "
                               f"{e}") from None

    def unload_lora(self, name: str) -> None:
        """Unload the LoRA adapter `name` (`POST /v1/unload_lora_adapter`)."""
        try:
            self._request("POST", "/unload_lora_adapter", json={"lora_name": name},
                          text_reply=True)
        except BackendError as e:
            if name not in self._listed():
                return
            raise BackendError(f"the server did not unload LoRA adapter {name!r}: {e}") \
                from None

    def server_tokens(self, conversation: Conversation) -> list[int]:
        """The token ids the server's chat template makes of `conversation` with the
        assistant header (vLLM's `/tokenize`, at the server root; `workbench serve` too)."""
        root = _ServerRenderer(self).root
        data = self._request("POST", f"{root}/tokenize", json={
            "model": self.model_name, "messages": _wire_messages(conversation),
            "add_generation_prompt": True})
        if not isinstance(data.get("tokens"), list):
            raise BackendError(f"{root}/tokenize: no token ids in the reply")
        return [int(t) for t in data["tokens"]]

    def _listed(self) -> list[str]:
        try:
            return self.served_models()
        except BackendError:
            return []

    # --- protocol --------------------------------------------------------------------------

    def _chat_one(self, conv: Conversation, params: GenerationParams,
                  tools: list[ToolSpec] | None, tool_choice: ToolChoice) -> Generation:
        body: dict[str, Any] = {
            "model": self.model_name, "messages": _wire_messages(conv),
            "max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.top_k is not None:
            body["top_k"] = params.top_k  # vLLM, llama.cpp and Ollama accept it
        if params.repetition_penalty is not None:
            body["repetition_penalty"] = params.repetition_penalty  # vLLM, workbench serve
        if tools:
            body["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in tools]
            body["tool_choice"] = tool_choice if isinstance(tool_choice, str) else \
                tool_choice.model_dump(mode="json")
        body.update(wire_fields(params.constraint))
        try:
            data = self._request("POST", "/chat/completions", json=body)
        except _GaveUp as e:
            return Generation(text="", finish_reason="error", error=str(e))
        except ConstraintNotKept as e:
            return Generation(text="").not_kept(str(e))
        except BackendError as e:
            if "cannot reach" in str(e):
                raise
            return Generation(text="", finish_reason="error", error=str(e))
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        message = choice.get("message") or {}
        try:
            calls = [ToolCall.model_validate(tc) for tc in message.get("tool_calls") or ()]
        except ValueError as e:
            return Generation(text=message.get("content") or "", finish_reason="error",
                              error=f"{self.base_url}: malformed tool_calls in the reply: {e}")
        gen = Generation(text=message.get("content") or "",
                         finish_reason=choice.get("finish_reason") or "stop",
                         prompt_tokens=usage.get("prompt_tokens", 0),
                         completion_tokens=usage.get("completion_tokens", 0),
                         tool_calls=calls)
        # the server's reply checked against the constraint it was asked to keep (its
        # engine may have given up on it and answered anyway)
        whole = _whole(params, gen.finish_reason)
        problem = check_text(whole, gen.text) if whole is not None else None
        return gen if problem is None else gen.not_kept(f"{self.base_url}: {problem}")

    def check_constraint(self, constraint) -> None:
        """The server checks it (and answers 400 when it cannot honour it)."""

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        params = params or GenerationParams()
        specs, choice = self._tool_request(tools, tool_choice)

        def one(i: int) -> Generation:
            return self._chat_one(conversations[i], per[i], specs, choice)

        # a seeded batch: the i-th conversation is sampled with seed + i, as the samples of
        # one batch on a local engine differ (equal prompts, a GRPO group, would otherwise
        # get equal replies: each is a request of its own with the same seed)
        per = [params if params.seed is None or i == 0 else
               params.model_copy(update={"seed": params.seed + i})
               for i in range(len(conversations))]
        if len(conversations) == 1:
            return [one(0)]
        with ThreadPoolExecutor(self.opts.concurrency) as pool:
            return list(pool.map(one, range(len(conversations))))

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        import json

        params = params or GenerationParams()
        body = {"model": self.model_name, "messages": _wire_messages(conversation),
                "stream": True, "max_tokens": params.max_tokens,
                "temperature": params.temperature}
        if params.stop:
            body["stop"] = list(params.stop)
        body.update(wire_fields(params.constraint))
        text, finish = "", None
        with self._client.stream("POST", "/chat/completions", json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                kind = _error_kind(_error_code(resp))
                raise kind(f"HTTP {resp.status_code}: {_error_text(resp)}")
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                event = json.loads(payload)
                if isinstance(err := event.get("error"), dict):  # an error event mid-stream
                    kind = _error_kind(err.get("code"))
                    raise kind(f"{self.base_url}: {err.get('message')}")
                choice = (event.get("choices") or [{}])[0]
                finish = choice.get("finish_reason") or finish
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text += delta["content"]
                    yield delta["content"]
        if (whole := _whole(params, finish)) is not None and (problem := check_text(whole, text)):
            raise ConstraintNotKept(f"{self.base_url}: {problem}")

    # --- scoring ---------------------------------------------------------------------------

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        prompts = [req.prompt if isinstance(req.prompt, str) else self.render(req.prompt)
                   for req in requests]
        jobs = [(p, c) for p, req in zip(prompts, requests, strict=True)
                for c in req.continuations]
        with ThreadPoolExecutor(self.opts.concurrency) as pool:
            flat = list(pool.map(lambda pc: self._score_one(*pc), jobs))
        out, k = [], 0
        for req in requests:
            out.append(flat[k:k + len(req.continuations)])
            k += len(req.continuations)
        return out

    def render(self, conversation: Conversation) -> str:
        """The served model's prompt text for a conversation (ending with the assistant
        header), as the server's completion endpoint should be sent it."""
        import json

        key = json.dumps(plain_conversation(conversation), sort_keys=True)
        if key not in self._rendered:
            if self._renderer is None:
                self._renderer = self._make_renderer()
            self._rendered[key] = self._renderer.render(plain_conversation(conversation))
        return self._rendered[key]

    def _make_renderer(self) -> _Renderer:
        source = self._template_source
        if source is None and self.opts.tokenizer is None:
            try:
                source = resolve_chat_model(self.model_name)
            except ModelNotFoundError:
                source = None
            if source is not None and source.kind == "openai":
                source = None
            if source is None:
                log.warning("%s is not a model on this machine: rendering chat prompts with "
                            "the server's /tokenize (set the `tokenizer` option to render "
                            "them here)", self.model_name)
        if source is not None:
            return _LocalRenderer(source)
        return _ServerRenderer(self)

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
        # lm-evaluation-harness's convention, as the local backend: the prompt's trailing
        # whitespace belongs to the continuation
        start = len(prompt.rstrip())
        idx = [i for i, off in enumerate(offsets) if off >= start]
        total = sum(values[i] for i in idx if values[i] is not None)
        greedy = bool(top) and all(
            top[i] and max(top[i], key=top[i].get) == tokens[i] for i in idx)
        return ContinuationScore(logprob=float(total), n_tokens=len(idx),
                                 n_chars=len(continuation), is_greedy=greedy)

    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        """Per-token logprobs of `text` from the server's `/v1/completions` with `echo` and
        `logprobs` (vLLM and `workbench serve` answer it): how a teacher on a server scores
        a rollout for on-policy distillation."""
        body = {"model": self.model_name, "prompt": text, "max_tokens": 0, "echo": True,
                "logprobs": max(top, 1), "temperature": 0.0}
        try:
            data = self._request("POST", "/completions", json=body)
            lp = data["choices"][0]["logprobs"]
            tokens, offsets, values = lp["tokens"], lp["text_offset"], lp["token_logprobs"]
            tops = lp.get("top_logprobs") if top else None
        except (BackendError, _GaveUp, KeyError, TypeError, IndexError) as e:
            raise BackendError(f"{self.base_url} does not return prompt logprobs "
                               f"(/v1/completions with echo and logprobs): {e}") from None
        return TokenLogprobs(list(tokens), list(offsets), list(values),
                             list(tops) if tops is not None else None)

    def close(self) -> None:
        self._client.close()


class _GaveUp(BackendError):
    pass


def _wire_messages(conv: Conversation) -> list[dict[str, Any]]:
    """Messages as OpenAI takes them: reasoning stays home, a tool-calling turn may have no
    content."""
    out = []
    for m in plain_conversation(conv):
        m.pop("reasoning_content", None)
        m.setdefault("content", None if m.get("tool_calls") else "")
        out.append(m)
    return out


class _Renderer:
    def render(self, conversation: Conversation) -> str:
        raise NotImplementedError


def _strip_doubled_specials(text: str, plain: list[int], added: list[int], decode) -> str:
    """`plain`: the ids of `text` as rendered; `added`: the same text tokenised with the
    special tokens a completion request gets. When those repeat the text's first tokens
    (a template that writes BOS, a server that adds BOS again), drop them from the text."""
    extra = len(added) - len(plain)
    if extra > 0 and added[extra:] == plain and added[:extra] == plain[:extra]:
        head = decode(plain[:extra])
        if text.startswith(head):
            return text[len(head):]
    return text


class _LocalRenderer(_Renderer):
    """The chat template from the served model's tokenizer on this machine."""

    def __init__(self, source: ModelSource):
        from transformers import AutoTokenizer

        self.source = source
        self.tokenizer = AutoTokenizer.from_pretrained(model_folder(source))
        if not getattr(self.tokenizer, "chat_template", None):
            raise WorkbenchError(f"{source.name}: the tokenizer has no chat template to "
                                 "render chat prompts with")

    def render(self, conversation: Conversation) -> str:
        tok = self.tokenizer
        msgs = template_messages(conversation, TemplateTools.of(tok.chat_template), None)
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)  # tokenize=False: the prompt's text
        plain = tok(text, add_special_tokens=False)["input_ids"]
        added = tok(text)["input_ids"]
        return _strip_doubled_specials(text, plain, added,
                                       lambda ids: tok.decode(ids))


class _ServerRenderer(_Renderer):
    """vLLM's `/tokenize` (messages -> ids) and `/detokenize` (ids -> text), which
    `workbench serve` offers too; they live at the server root, not under /v1."""

    def __init__(self, model: OpenAIChatModel):
        self.model = model
        self.root = model.base_url.rsplit("/v1", 1)[0] if model.base_url.endswith("/v1") \
            else model.base_url

    def _post(self, path: str, body: dict) -> dict:
        try:
            return self.model._request("POST", f"{self.root}{path}",
                                       json={"model": self.model.model_name, **body})
        except BackendError as e:
            raise BackendError(
                f"cannot render a chat prompt for scoring: {e}; pass the `tokenizer` option "
                "(a local model spec or folder with the served model's chat template) or use "
                "a server with /tokenize and /detokenize (vLLM, workbench serve)") from None

    def render(self, conversation: Conversation) -> str:
        plain = self._post("/tokenize", {"messages": _wire_messages(conversation),
                                         "add_generation_prompt": True})["tokens"]
        text = self._post("/detokenize", {"tokens": plain})["prompt"]
        added = self._post("/tokenize", {"prompt": text})["tokens"]
        return _strip_doubled_specials(
            text, plain, added, lambda ids: self._post("/detokenize", {"tokens": ids})["prompt"])


def _whole(params: GenerationParams, finish: str | None) -> Constraint | None:
    """The constraint a reply must keep whole, if any: one that ended by itself. One cut by
    max_tokens ("length") or by a stop string need only be a valid beginning, which the text
    alone cannot judge; OpenAI reports a stop string's cut as "stop" too, so with stop strings
    it is not judged either."""
    return params.constraint if finish == "stop" and not params.stop else None


def _error_kind(code: Any) -> type[BackendError]:
    """The exception for a server's error code: a constraint it could not keep, or another."""
    return ConstraintNotKept if code == "constraint_not_kept" else BackendError


def _error_code(resp) -> Any:
    """The `code` of an OpenAI-shaped error reply, if any."""
    try:
        err = resp.json().get("error")
        return err.get("code") if isinstance(err, dict) else None
    except Exception:  # noqa: BLE001 - any body that is not the usual JSON
        return None


def _error_text(resp) -> str:
    try:
        data = resp.json()
        err = data.get("error", data)
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return msg[:300] if isinstance(msg, str) else resp.text[:300]
    except Exception:  # noqa: BLE001 - any body that is not the usual JSON: its text
        return resp.text[:300]
