"""llama.cpp backend: generation on the GGUF's own engine, scoring where its parity is proven.

The bundled model is a GGUF file, and llama.cpp decodes it at this CPU's memory limit (the
transformers loop reaches about a fifth of it: BENCHMARKS.md, "Generation engines"). This
backend runs llama.cpp's own server (the C++ `llama-server`, from the `xllamacpp` wheel: no
build at install) inside this process, bound to 127.0.0.1 on a port the OS picks and locked
by a random key that never leaves the process, and talks to it through its native
`/completion` route:

- prompts are rendered and tokenised here, by the same code as the transformers and
  CTranslate2 backends (`hf_chat.TokenizerChatModel`), and sent as token ids, so every
  engine sees the same tokens; the reply's token ids are decoded here too, and cut at stop
  strings and read for tool calls by the same post-processing;
- a batch is sent as concurrent requests to the server's parallel slots (continuous
  batching; each slot has a KV cache of its own, so a reply does not depend on what else
  runs beside it);
- a small quantised GGUF (the bundled Q4_1 model) is decoded from an f16 copy made once
  (`gguf_file.f16_copy`): against quantised weights llama.cpp quantises activations to 8
  bits, which changed most greedy answers of the 135M model; the f16 copy gives transformers'
  answers at about 0.7x the quantised speed (the `weights` option);
- constraints (tool calls, schemas, regexes, choices, grammars) go to llama.cpp's llguidance
  as Lark text, the transformers backend's grammars; the tokens are followed by a matcher of
  ours, since where llguidance gives up llama.cpp samples on unconstrained (`ReplyCheck`);
- a PEFT LoRA adapter is converted once to a GGUF LoRA adapter (`gguf_lora`) and applied
  at run time, unmerged;
- replies stream, and a request whose caller has gone (a cancel event, a closed stream) is
  dropped by the server within a token.

Scoring (`score`, `token_logprobs`) stays on the transformers model, loaded on first use:
its per-item parity with lm-evaluation-harness is what the evaluations rest on. The
identity names both engines, and `score_identity` is the transformers model's, so cached
scores are shared with the transformers backend and cached generations never are.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from workbench import openmp
from workbench.errors import BackendError, WorkbenchError
from workbench.io import sha256_file
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
    cancel_event,
)
from workbench.models.constrain import (
    CONSTRAINT_ERROR,
    CallSplitter,
    ConstraintNotKept,
    ReplyCheck,
    check_constraint,
    tool_call_constraint,
)
from workbench.models.ct2_watch import held_back
from workbench.models.gguf_cache import gguf_cache_dir, gguf_tokenizer_folder
from workbench.models.gguf_file import FLOAT_FILE_TYPES, f16_copy
from workbench.models.gguf_header import context_length, file_type
from workbench.models.gguf_lora import adapter_fingerprint, cached_lora_gguf
from workbench.models.hf_chat import TokenizerChatModel
from workbench.models.llamacpp_server import PIP, Server, available, gpu_build
from workbench.models.local import LocalChatModel, check_adapter_dir
from workbench.models.messages import NamedToolChoice, ToolChoice, ToolSpec
from workbench.models.postprocess import cut_at_stop, with_tool_calls
from workbench.models.resolve import ModelSource, workbench_home
from workbench.models.tools import strip_special_tokens
from workbench.progress import progress, tally
from workbench.records import StrictModel

log = logging.getLogger(__name__)

SLOT_CONTEXT = 4096  # most KV tokens per parallel slot by default (the model's own when less)
PROMPT_CACHE_MAX_MIB = 8192  # the default prompt cache's most (llama-server's default)
F16_AUTO_MAX_MB = 512  # `weights: auto` decodes an f16 copy of quantised files up to this size
SAMPLERS = ["penalties", "temperature", "top_k", "top_p"]  # transformers' order


class LlamaCppOptions(StrictModel):
    device: str = Field("auto", description="auto, cpu, gpu or cuda[:N] (GPU layers need a GPU "
                                            "build of xllamacpp; auto offloads when it has "
                                            "one).")
    threads: int | None = Field(None, ge=1, description="CPU threads (default: all cores).")
    poll: int = Field(50, ge=0, le=100, description=(
        "llama.cpp's polling level (0-100: how long idle threads busy-wait for work; 50 is "
        "llama.cpp's own default). The xllamacpp wheel's ggml is built with OpenMP, whose "
        "threads wait by OpenMP's policy instead (the workbench sets GOMP_SPINCOUNT=1000: "
        "`workbench.openmp`), so it has no measured effect there (BENCHMARKS.md, "
        "\"llama.cpp under load\")."))
    batch_size: int = Field(8, ge=1, le=64, description="Parallel slots: conversations "
                                                        "decoded together.")
    slot_context: int | None = Field(None, ge=64, description=(
        "Tokens (prompt + reply) one slot holds: each slot has a KV cache of its own, so a "
        "reply does not depend on what else runs beside it (default: the model's positions, "
        f"at most {SLOT_CONTEXT}; ~23 kB a token for the bundled model)."))
    adapter: str | None = Field(None, description="PEFT LoRA adapter folder: converted once "
                                                  "to a GGUF LoRA adapter, applied unmerged.")
    weights: Literal["auto", "file", "f16"] = Field("auto", description=(
        "Which weights llama.cpp decodes: `file`, the GGUF as it is; `f16`, a copy with its "
        "quantised matrices dequantised to f16 (made once, in the model cache), since "
        "llama.cpp quantises activations to 8 bits against quantised weights, which changed "
        "most greedy answers of the bundled 135M model; `auto`: the f16 copy for quantised "
        f"files up to {F16_AUTO_MAX_MB} MB (small models: the bundled one decodes its copy "
        "at about 0.7x the Q4_1 file's speed), else the file."))
    prompt_cache_mib: int | None = Field(None, ge=0, description=(
        "Host memory for llama.cpp's prompt cache: the KV of earlier prompts, from which any "
        "slot takes the longest prefix it shares (a section's text read once for all its "
        "questions; an agent's dialogue taken up again on another slot: 1.53x on "
        "litsearch's free policy). Default: an eighth of the machine's memory, at most "
        f"{PROMPT_CACHE_MAX_MIB} (filled only as slots move on to other prompts; that run "
        "used about 1.7 GB); 0: none, each slot reuses only its own last prompt."))
    deterministic: bool = Field(False, description=(
        "The same inputs give the same replies, run after run: one slot, the prompts of a "
        "batch read and decoded one at a time in order, each from scratch (no KV reused "
        "from another prompt), and a sampling seed of 0 where the caller gives none. "
        "Batched, which requests share llama.cpp's batch and its prompt chunks depends on "
        "timing, and its matrix kernels change with the batch's size, so sampled replies "
        "drift from run to run. Costs the batching (BENCHMARKS.md, \"Generation "
        "engines\")."))
    lora: str | None = Field(None, description="A GGUF LoRA adapter file to apply.")
    lora_scale: float = Field(1.0, description="Scale of the adapter.")
    chat_template: str | None = Field(None, description="Jinja template when the model has "
                                                        "none.")
    scoring: Literal["transformers"] = Field(
        "transformers", description="Backend for score/token_logprobs (the transformers "
                                    "model, loaded on first use: its lm-eval parity is "
                                    "measured; llama.cpp scoring is not).")
    timeout_s: float = Field(600.0, gt=0, description="Longest wait for a reply (streamed: "
                                                      "for its next token).")
    # The transformers backend's own options, accepted so that a config written for it
    # switches with `-s models.chat.backend=llamacpp` alone; they do not apply here.
    dtype: str | None = Field(None, description="Ignored: the GGUF file's own types are used.")
    merge_adapter: bool | None = Field(None, description="Ignored: adapters run unmerged.")


def _gguf_file(source: ModelSource) -> Path:
    if source.kind not in ("bundled-gguf", "gguf") or source.path is None:
        raise WorkbenchError(
            f"{source.name}: the llamacpp backend runs GGUF files; for a Hugging Face folder "
            "use the transformers backend (-s models.chat.backend=transformers) or convert it "
            "with llama.cpp's convert_hf_to_gguf.py")
    return source.path / str(source.gguf_file)


def _weights_file(source: ModelSource, gguf: Path, weights: str) -> Path:
    """The GGUF file llama.cpp decodes for `weights` (see `LlamaCppOptions.weights`)."""
    if weights == "file":
        return gguf
    kind = file_type(gguf)
    if kind in FLOAT_FILE_TYPES and (weights == "auto" or FLOAT_FILE_TYPES[kind] == "f16"):
        return gguf  # already unquantised (an f32 or bf16 file is kept under auto)
    if weights == "auto" and gguf.stat().st_size > F16_AUTO_MAX_MB * 2**20:
        return gguf
    cache = gguf_cache_dir(source)
    try:
        return f16_copy(gguf, cache.with_name(cache.name + "-f16"))
    except (OSError, ValueError, NotImplementedError, KeyError) as e:
        # a quantisation the gguf package cannot dequantise, a full disk...
        why = f"{type(e).__name__}: {e}"
        if weights == "f16":
            raise WorkbenchError(f"{gguf.name}: could not make its f16 copy ({why})") from e
        log.warning("%s: no f16 copy (%s); llama.cpp decodes the file as it is", gguf.name,
                    why)
        return gguf


def tokenizer_folder(source: ModelSource) -> Path:
    """A folder holding the GGUF's tokenizer (and chat template) in Hugging Face form: the
    transformers backend's conversion when there is one, else the tokenizer folder made once
    per tokenizer (`gguf_cache.gguf_tokenizer_folder`)."""
    converted = gguf_cache_dir(source)
    if (converted / "workbench-source.json").is_file():
        return converted
    return gguf_tokenizer_folder(source)


@register_backend("llamacpp")
class LlamaCppChatModel(TokenizerChatModel):
    capabilities = Capabilities(score=True, tool_calls=True, token_logprobs=True, stream=True,
                                constrained=True, complete=True, tokenize=True,
                                concurrent=True)

    def __init__(self, source: ModelSource, **options: Any):
        self.opts = LlamaCppOptions(**options)
        if not available():
            raise WorkbenchError(f"the llamacpp backend needs the llama.cpp engine: `{PIP}`")
        from transformers import AutoTokenizer

        self.source = source
        gguf = _gguf_file(source)
        # the options checked before anything is converted or loaded
        if self.opts.adapter and self.opts.lora:
            raise WorkbenchError("pass either `adapter` (a PEFT folder) or `lora` (a GGUF "
                                 "LoRA file), not both")
        device = self.opts.device.split(":")[0]
        if device not in ("auto", "cpu", "gpu", "cuda"):
            raise WorkbenchError(f"device {self.opts.device!r}: the llamacpp backend takes "
                                 "auto, cpu or gpu")
        t0 = time.perf_counter()
        weights = _weights_file(source, gguf, self.opts.weights)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(source))
        if self.opts.chat_template:
            self.tokenizer.chat_template = self.opts.chat_template
        self._tool_notice = False
        lora, self._adapter_id = None, ""
        if self.opts.adapter:
            folder = check_adapter_dir(self.opts.adapter)
            lora = cached_lora_gguf(folder, gguf, workbench_home() / "models")
            # the transformers backend's adapter id (the safetensors' hash) would do, but
            # the GGUF form also depends on the config (alpha, patterns): hash both
            self._adapter_id = "+adapter:" + adapter_fingerprint(folder)[:16]
        elif self.opts.lora:
            lora = Path(self.opts.lora)
            if not lora.is_file():
                raise WorkbenchError(f"{lora}: no such GGUF LoRA adapter file")
            self._adapter_id = "+lora:" + sha256_file(lora)[:16]
        if lora is not None and self.opts.lora_scale != 1.0:
            self._adapter_id += f"x{self.opts.lora_scale:g}"
        self.slots = 1 if self.opts.deterministic else self.opts.batch_size
        gpu = device in ("gpu", "cuda") or (device == "auto" and gpu_build())
        self.device = "gpu" if gpu else "cpu"
        positions = context_length(gguf)
        context = self.opts.slot_context or min(positions or SLOT_CONTEXT, SLOT_CONTEXT)
        self.threads = self.opts.threads or max(1, os.cpu_count() or 1)
        self.prompt_cache_mib = self._prompt_cache_mib()
        self.server = Server(weights, slots=self.slots, context=context, threads=self.threads,
                              gpu_layers=-1 if gpu else 0, lora=lora,
                              lora_scale=self.opts.lora_scale, timeout_s=self.opts.timeout_s,
                              prompt_cache_mib=self.prompt_cache_mib,
                              poll=self.opts.poll)
        self.slot_context, self.model_positions = context, positions
        self._positions = min(positions or self.server.n_ctx_train or context, context)
        self.load_seconds = time.perf_counter() - t0
        self.eos_ids = {i for i in (self.tokenizer.eos_token_id,) if i is not None}
        self._scorer: ChatModel | None = None
        self._scorer_lock = threading.Lock()
        self.weights = "f16" if weights != gguf else "file"
        at = "@f16" if weights != gguf else ""
        self._identity = f"llamacpp:{source.name}{at}{self._adapter_id}+score:transformers"

    def _prompt_cache_mib(self) -> int:
        """The prompt cache's most: as asked, else an eighth of this machine's memory, at
        most `PROMPT_CACHE_MAX_MIB` (none in the deterministic mode, whose prompts are each
        read from scratch). llama.cpp fills it only as slots move on to other prompts."""
        if self.opts.prompt_cache_mib is not None:
            return self.opts.prompt_cache_mib
        if self.opts.deterministic:
            return 0
        try:
            ram_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
        except (ValueError, OSError, AttributeError):
            ram_mib = PROMPT_CACHE_MAX_MIB
        return min(PROMPT_CACHE_MAX_MIB, ram_mib // 8)

    @classmethod
    def uses(cls, options: dict[str, Any] | None = None) -> dict[str, str]:
        return {"generate": "llamacpp", "score": "transformers"}

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def score_identity(self) -> str:
        """The transformers model's identity: scores come from it, so they are its."""
        adapter = ""
        if self.opts.adapter:
            adapter = "+adapter:" + sha256_file(
                Path(self.opts.adapter) / "adapter_model.safetensors")[:16]
        elif self.opts.lora:
            return self._identity + ":scoring-without-lora"
        return f"local:{self.source.name}{adapter}"

    @property
    def max_positions(self) -> int | None:
        return self._positions

    @property
    def batch_size(self) -> int:
        return self.slots

    # --- requests ------------------------------------------------------------------------

    def _body(self, ids: list[int], params: GenerationParams, *, stream: bool
              ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": ids, "n_predict": params.max_tokens, "stream": stream,
            "return_tokens": True, "cache_prompt": not self.opts.deterministic,
            "samplers": SAMPLERS,
            "temperature": 0.0 if params.greedy else params.temperature,
            "top_k": params.top_k or 0, "top_p": params.top_p, "min_p": 0.0,
            "typical_p": 1.0, "repeat_penalty": params.repetition_penalty or 1.0,
            "repeat_last_n": 0 if not params.repetition_penalty else 2**31 - 1, "n_probs": 0}
        if params.seed is not None or self.opts.deterministic:
            body["seed"] = (params.seed or 0) % 2**32
        if params.constraint is not None:
            body["grammar"] = params.constraint.llama_grammar()
        return body

    def _tokens(self, ids: list[int], params: GenerationParams, cancel: threading.Event | None
                ) -> tuple[list[int], str | None, str | ConstraintNotKept | None]:
        """(generated token ids, how the server ended: "eos" | "word" | "limit" | None, an
        error or None) of one request. Without a cancel event it is one reply; with one, it
        streams, so that setting the event ends it within a token (closing the stream drops
        it from its slot). A constraint's tokens are followed by a matcher of ours
        (`ReplyCheck`: llama.cpp goes on unconstrained where its llguidance gives up)."""
        check = ReplyCheck.of(params.constraint, self.tokenizer, self.eos_ids,
                              self.tokenizer.all_special_ids)  # what llama.cpp may end on
        toks, ended, error = self._request_tokens(ids, params, cancel, check)
        if error is not None or check is None:
            return toks, ended, error
        hit_stop = bool(params.stop) and cut_at_stop(self.tokenizer.decode(
            toks, skip_special_tokens=True), params.stop)[1]  # then a valid beginning will do
        problem = check.take(toks[check.fed:], ended == "eos" and not hit_stop)
        return toks, ended, None if problem is None else ConstraintNotKept(problem)

    def _chunk_ids(self, chunk: dict[str, Any]) -> list[int]:
        """A streamed chunk's token ids: llama.cpp streams no token ending inside a UTF-8
        character, and the chunk completing it has its text but only its own token (the ids
        decoded to " \ufffd"): then the ids are this tokenizer's for that text."""
        ids = list(chunk.get("tokens") or ())
        content = chunk.get("content") or ""
        if content and self.tokenizer.decode(ids, skip_special_tokens=True) != content:
            ids = self.tokenizer(content, add_special_tokens=False)["input_ids"] + [
                t for t in ids if t in self.tokenizer.all_special_ids]
        return ids

    def _request_tokens(self, ids: list[int], params: GenerationParams,
                        cancel: threading.Event | None, check: ReplyCheck | None
                        ) -> tuple[list[int], str | None, str | None]:
        import httpx

        if cancel is None:
            body = self._body(ids, params, stream=False)
            if params.stop:
                body["stop"] = list(params.stop)
            try:
                r = self.server.http.post("/completion", json=body)
            except httpx.HTTPError as e:
                return [], None, f"llama.cpp server: {type(e).__name__}: {e}"
            if r.status_code != 200:
                return [], None, _error_text(r.content, r.status_code)
            reply = r.json()
            return list(reply.get("tokens") or ()), reply.get("stop_type"), None
        out: list[int] = []
        text, ended = "", None
        longest = max((len(s) for s in params.stop), default=0)
        try:
            with self.server.http.stream("POST", "/completion",
                                         json=self._body(ids, params, stream=True)) as r:
                if r.status_code != 200:
                    return out, None, _error_text(r.read(), r.status_code)
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return out, None, _error_text(json.dumps(chunk).encode(), 500)
                    out.extend(self._chunk_ids(chunk))
                    if chunk.get("stop"):
                        # a last token that ends inside a character is never streamed
                        ended = chunk.get("stop_type")
                        break
                    if cancel.is_set() or (check and check.feed(out[check.fed:])):
                        break  # left, or the reply broke its constraint
                    if longest:
                        text = (text + chunk.get("content", ""))[-(4 * longest + 64):]
                        if any(s in text for s in params.stop):
                            ended = "word"
                            break
        except httpx.HTTPError as e:
            return out, None, f"llama.cpp server: {type(e).__name__}: {e}"
        return out, ended, None

    def _generate_ids(self, rows: list[list[int]], params: GenerationParams, *,
                      keep_markers: bool = False) -> list[Generation]:
        if not rows:
            return []
        cancel = cancel_event()  # read here: the worker threads do not share this context
        limit = self._positions
        # the tokens made so far: the replies back plus what the busy slots have made (read
        # from the server when a progress line is made), so a line moves before any reply
        # of a batch is back (the first may take minutes)
        with tally("tokens", "token", probe=self.server.decoding) as tokens, \
                ThreadPoolExecutor(min(self.slots, len(rows))) as pool:
            # a seeded batch: the i-th row is sampled with seed + i, as the rows of one
            # transformers batch draw from one stream and the OpenAI-compatible backend
            # sends them (equal prompts, e.g. a GRPO group, get different samples)
            seeded = params.seed is not None or self.opts.deterministic
            futures = [None if len(ids) >= limit else
                       pool.submit(self._tokens, ids, params.model_copy(
                           update={"seed": (params.seed or 0) + i}) if seeded and i else
                           params, cancel) for i, ids in enumerate(rows)]
            # counted as each reply comes back, so a log says how far a batch has got
            running = [f for f in futures if f is not None]
            for f in progress(as_completed(running), desc="generating", total=len(running),
                              unit="reply", delay=2):
                tokens.add(len(f.result()[0]))
            results = [(([], None, self._too_long(len(ids))) if f is None else f.result())
                       for f, ids in zip(futures, rows, strict=True)]
        gens = []
        tok = self.tokenizer
        for (toks, ended, error), ids in zip(results, rows, strict=True):
            if error is not None:  # a row whose constraint was not kept fails alone
                kind = CONSTRAINT_ERROR if isinstance(error, ConstraintNotKept) else None
                gens.append(Generation(text="", finish_reason="error", error=str(error),
                                       prompt_tokens=len(ids), completion_tokens=len(toks),
                                       error_type=kind))
                continue
            n = len(toks)
            ended_eos = bool(toks) and toks[-1] in self.eos_ids
            if ended_eos:
                n -= 1
            if keep_markers:
                text = strip_special_tokens(tok.decode(toks[:n], skip_special_tokens=False),
                                            tok.all_special_tokens)
            else:
                text = tok.decode(toks[:n], skip_special_tokens=True)
            text, hit_stop = cut_at_stop(text, params.stop)
            finish = "length" if ended == "limit" and not hit_stop else \
                "stop" if (ended_eos or hit_stop or n < params.max_tokens) else "length"
            gens.append(Generation(text=text, finish_reason=finish, prompt_tokens=len(ids),
                                   completion_tokens=n))
        return gens

    def _too_long(self, n: int) -> str:
        more = "" if self.slot_context >= (self.model_positions or 0) else " (raise -s models.chat.options.slot_context, up to the model's positions)"
        return f"prompt of {n} tokens: a slot holds {self.slot_context}{more}"

    # --- generation ----------------------------------------------------------------------

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        params = params or GenerationParams()
        specs, choice = self._tool_request(tools, tool_choice)
        calling = bool(specs) and choice != "none"
        prompts = [self._prompt(c, specs, choice) for c in conversations]
        if calling and choice != "auto":
            params = self._forced(params, specs or [], choice)
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in prompts]
        gens = self._generate_ids(ids, params, keep_markers=calling)
        if calling:
            names = [t.name for t in specs or ()]
            gens = [g if g.error else with_tool_calls(g, prefix, self.template_tools.family,
                                                      names, forced=choice != "auto")
                    for g, (_, prefix) in zip(gens, prompts, strict=True)]
        return gens

    def complete(self, prompts: Sequence[str],
                 params: GenerationParams | None = None) -> list[Generation]:
        """Continue raw prompts, tokenised like any text (special tokens added as usual)."""
        params = params or GenerationParams()
        ids = [self.tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
        return self._generate_ids(ids, params)

    def _forced(self, params: GenerationParams, specs: list[ToolSpec],
                choice: ToolChoice) -> GenerationParams:
        """`params` with the grammar of a forced call (the tool's schema), so it parses."""
        if params.constraint is not None:
            return params
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        return params.model_copy(update={"constraint": tool_call_constraint(
            self.template_tools.family, self.chat_template, specs, name)})

    def check_constraint(self, constraint) -> None:
        """Raise WorkbenchError naming the problem when `constraint` cannot be built."""
        check_constraint(constraint, self.tokenizer, len(self.tokenizer), self.eos_ids)

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        yield from self._stream_text(self.render(conversation), params or GenerationParams())

    def stream_tool_call(self, conversation: Conversation, params: GenerationParams | None,
                         tools: Tools, tool_choice: ToolChoice) -> Iterator[tuple[str, str]]:
        """A forced call streamed as it is generated (under the tools' schemas)."""
        specs, choice = self._tool_request(tools, tool_choice)
        if not specs or choice in ("auto", "none"):
            raise WorkbenchError("stream_tool_call needs tools and a forced tool_choice")
        params = self._forced(params or GenerationParams(), specs, choice)
        prompt, _ = self._prompt(conversation, specs, choice)
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        split = CallSplitter(self.template_tools.family, self.chat_template, name)
        for piece in self._stream_text(prompt, params):
            yield from split.feed(piece)
        yield from split.finish()

    def _stream_text(self, prompt: str, params: GenerationParams) -> Iterator[str]:
        """Text pieces as tokens come; text that may begin a stop string is held back until
        it is known not to be one. Leaving the iterator closes the request."""
        import httpx

        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        cancel = cancel_event()
        out: list[int] = []
        emitted = ""
        check = ReplyCheck.of(params.constraint, self.tokenizer, self.eos_ids,
                              self.tokenizer.all_special_ids)  # as in `_tokens`
        try:
            with self.server.http.stream("POST", "/completion",
                                         json=self._body(ids, params, stream=True)) as r:
                if r.status_code != 200:
                    raise BackendError(_error_text(r.read(), r.status_code))
                for line in r.iter_lines():
                    if cancel is not None and cancel.is_set():
                        return
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise BackendError(_error_text(json.dumps(chunk).encode(), 500))
                    got = self._chunk_ids(chunk)
                    if check and check.take(got, chunk.get("stop_type") == "eos"):
                        raise ConstraintNotKept(check.problem or "")
                    out.extend(t for t in got if t not in self.eos_ids)
                    text = self.tokenizer.decode(out, skip_special_tokens=True)
                    if text.endswith("\ufffd") and not chunk.get("stop"):
                        continue  # half of a multi-byte character
                    cut, hit = cut_at_stop(text, params.stop)
                    safe = cut if hit or chunk.get("stop") else \
                        cut[:len(cut) - held_back(cut, params.stop)]
                    if len(safe) > len(emitted):
                        yield safe[len(emitted):]
                        emitted = safe
                    if hit or chunk.get("stop"):
                        return
        except httpx.HTTPError as e:
            raise BackendError(f"llama.cpp server: {type(e).__name__}: {e}") from e

    # --- scoring -------------------------------------------------------------------------

    def _transformers_scorer(self) -> ChatModel:
        with self._scorer_lock:
            if self._scorer is None:
                if self.opts.lora:
                    raise WorkbenchError(
                        "scoring with a GGUF LoRA file (`lora`) is not supported: pass the "
                        "PEFT adapter folder as `adapter` instead (it is scored on "
                        "transformers and generated on llama.cpp)")
                self._scorer = LocalChatModel(self.source, batch_size=self.slots,
                                              chat_template=self.opts.chat_template,
                                              adapter=self.opts.adapter,
                                              threads=self.opts.threads)
            return self._scorer

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        return self._transformers_scorer().score(requests)

    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        return self._transformers_scorer().token_logprobs(text, top)

    def info(self):
        info = super().info()
        info.details.update(engine="llama.cpp (xllamacpp)", gguf=str(_gguf_file(self.source)),
                            device=self.device, threads=self.threads, poll=self.opts.poll,
                            openmp_wait=openmp.state(), slots=self.slots,
                            slot_context=self.slot_context,
                            prompt_cache_mib=self.prompt_cache_mib,
                            load_seconds=self.load_seconds,
                            scoring="transformers")
        return info

    def close(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.close()
            del self.server  # closed: a second close finds none
        scorer = getattr(self, "_scorer", None)
        if scorer is not None:
            scorer.close()


def _error_text(body: bytes, status: int) -> str:
    try:
        err = json.loads(body).get("error") or {}
        msg = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        msg = body[:300].decode("utf-8", "replace")
    return f"llama.cpp server ({status}): {msg}"
