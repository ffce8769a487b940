"""An OpenAI-compatible HTTP server over any workbench model (FastAPI + uvicorn).

Routes: `/health`, `/v1/models`, `/v1/chat/completions` (plain and streaming SSE, with
`tools` / `tool_choice` and `tool` turns), `/v1/completions` (text generation, and prompt
scoring with `echo` + `logprobs` + `max_tokens: 0`, the request lm-evaluation-harness and our
`openai` backend send for log-likelihoods), vLLM's `/tokenize` and `/detokenize`, with
which a client renders a chat prompt in the served model's template, and vLLM's runtime LoRA
routes `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (with `lora_dir`: adapters by
name on the transformers backend, `loras`; GRPO's rollout server publishes to them).

Every request field is one this server implements: any other is refused with HTTP 400 naming
it (a silently ignored `logprobs` or `response_format` would give wrong results that look
right). Errors come back in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`.
Tool calls are parsed from the generated text with the syntax of the model's chat template
(see `workbench.models.tools`); with `stream: true` and tools, the reply is generated whole
and then sent as chunks, since a half-written call cannot be parsed.

The modules: `app` (the factory and the server), `state` (what the routes share), `work`
(running work off the event loop), `limits` (key, body size, text that can become UTF-8,
the bounds on caller schemas, admission), `batching`, `schemas` (request bodies), `replies`
(error and event shapes), and one per route group: `chat`, `completions`, `tokenizer`,
`loras` (the LoRA routes' adapters and checks).
"""

from workbench.serve.app import create_app, make_server, serve
from workbench.serve.batching import ApiGone
from workbench.serve.limits import ServerLimits
from workbench.serve.schemas import (
    MAX_STOP_CHARS,
    MAX_STOPS,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    DetokenizeRequest,
    ResponseFormat,
    TextPart,
    TokenizeRequest,
)

__all__ = [
    "MAX_STOPS", "MAX_STOP_CHARS", "ApiGone", "ChatCompletionRequest", "ChatMessageIn",
    "CompletionRequest", "DetokenizeRequest", "ResponseFormat", "ServerLimits", "TextPart",
    "TokenizeRequest", "create_app", "make_server", "serve",
]
