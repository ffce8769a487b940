"""Local transformers backend: fp32 on CPU, bf16 on a GPU that supports it.

GGUF files (the bundled SmolLM2 among them) are converted once into a safetensors folder under
`workbench_home()/models`: transformers dequantises a GGUF on every load (~30 s for the 135M
model here) and refuses `save_pretrained` on it, so we rebuild the model from its config,
copy the weights and save that; later loads read the safetensors in well under a second.

Prompts are rendered by `hf_chat.TokenizerChatModel` (shared with the CTranslate2 backend) and
continuations scored by `local_scoring.CachedScoring`; this module loads the model and
generates.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from workbench.errors import BackendError, WorkbenchError
from workbench.io import sha256_file
from workbench.models.backends import register_backend
from workbench.models.base import (
    Cancelled,
    Capabilities,
    Conversation,
    Generation,
    GenerationParams,
    TokenLogprobs,
    Tools,
    cancel_event,
)
from workbench.models.constrain import (
    CallSplitter,
    ConstraintNotKept,
    GrammarProcessor,
    check_constraint,
    tool_call_constraint,
)
from workbench.models.gguf_cache import TOKENIZER_DONE, gguf_cache_dir, gguf_tokenizer_folder
from workbench.models.hf_chat import TokenizerChatModel
from workbench.models.local_scoring import CachedScoring
from workbench.models.messages import NamedToolChoice, ToolChoice, ToolSpec
from workbench.models.postprocess import cut_at_stop, with_tool_calls
from workbench.models.publish import publish_once
from workbench.models.resolve import ModelSource
from workbench.models.tools import strip_special_tokens
from workbench.progress import Tally, progress, tally
from workbench.records import StrictModel

log = logging.getLogger(__name__)


class LocalOptions(StrictModel):
    device: str = Field("auto", description="auto, cpu, cuda, cuda:N or mps.")
    dtype: str = Field("auto", description="auto (fp32 on CPU, bf16 on GPU), float32, "
                                           "bfloat16 or float16.")
    adapter: str | None = Field(None, description="Folder of a PEFT LoRA adapter to attach.")
    merge_adapter: bool = Field(False, description="Merge the adapter (faster generation).")
    batch_size: int = Field(8, ge=1, description="Conversations per forward pass.")
    chat_template: str | None = Field(None, description="Jinja template when the tokenizer "
                                                        "has none.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads.")


def pick_device(device: str = "auto") -> str:
    import torch

    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def pick_dtype(device: str, dtype: str = "auto"):
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32  # bf16 on this kind of CPU runs at ~1 GFLOP/s: never use it here


LOGPROB_CHUNK = 256  # positions scored per forward pass in `token_logprobs`
_DONE = "workbench-source.json"  # written last: a conversion folder without it is unfinished


def _converted(folder: Path) -> bool:
    return (folder / _DONE).is_file() and (folder / "model.safetensors").is_file()


def convert_gguf(source: ModelSource, *, force: bool = False) -> Path:
    """Convert a GGUF model once into a safetensors folder; return that folder.

    Published like every conversion (`publish.publish_once`): written into a temp folder,
    finished with `workbench-source.json`, fsynced and renamed in under a per-model lock,
    so the final name only ever holds a complete conversion.
    """
    target = gguf_cache_dir(source)

    def write(tmp: Path) -> None:
        t0 = time.perf_counter()
        log.info("converting %s to safetensors (once)", source.gguf_file)
        _write_conversion(source, tmp)  # a module global read per call: tests replace it
        (tmp / _DONE).write_text(json.dumps(
            {"gguf": str(source.gguf_path),
             "seconds": time.perf_counter() - t0}))

    publish_once(target, write, complete=_converted, force=force)
    return target


def _write_conversion(source: ModelSource, folder: Path) -> None:
    """Dequantise the GGUF and save it (config, safetensors weights, tokenizer) into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = gguf_tokenizer_folder(source)  # read from the GGUF once per tokenizer
    quantised = AutoModelForCausalLM.from_pretrained(source.folder, gguf_file=source.gguf_file,
                                                     dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(quantised.state_dict(), strict=False)
    real_missing = [k for k in missing if "lm_head" not in k]  # tied to the embeddings
    if real_missing or unexpected:
        raise BackendError(f"converting {source.gguf_file}: weights do not match "
                           f"(missing {real_missing[:3]}, unexpected {unexpected[:3]})")
    fresh.tie_weights()
    fresh.save_pretrained(folder, safe_serialization=True)
    for f in tokenizer.iterdir():  # what `save_pretrained` of that tokenizer wrote
        if f.is_file() and f.name != TOKENIZER_DONE:
            shutil.copyfile(f, folder / f.name)


def model_folder(source: ModelSource) -> Path:
    """The Hugging Face folder of a local model: a GGUF's through `convert_gguf` (the module
    global, so the test suite's guard around it sees every conversion)."""
    if source.kind in ("bundled-gguf", "gguf"):
        return convert_gguf(source)
    return source.folder


def check_adapter_dir(adapter: str | os.PathLike) -> Path:
    """Accept only safetensors adapters: a pickle (`.bin`) adapter can run code on load."""
    path = Path(adapter)
    if not (path / "adapter_config.json").exists():
        raise WorkbenchError(f"{path}: not a PEFT adapter folder (no adapter_config.json)")
    if not (path / "adapter_model.safetensors").exists():
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found {', '.join(pickles)}: pickle files are refused)" if pickles else ""
        raise WorkbenchError(f"{path}: no adapter_model.safetensors{hint}")
    check_safetensors(path / "adapter_model.safetensors")
    return path


def check_safetensors(file: Path) -> None:
    """Read the header and every tensor's extent: a truncated or corrupt file fails here,
    naming the file, before any model is touched."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            for k in f.keys():  # noqa: SIM118 - a safetensors handle: keys(), no iteration
                f.get_slice(k)
        import json as _json
        import struct

        with open(file, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = _json.loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
        if file.stat().st_size < 8 + n + end:
            raise ValueError("file is shorter than its header says (truncated)")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise WorkbenchError(f"{file}: corrupt or truncated safetensors ({e})") from None


@register_backend("local")
class LocalChatModel(CachedScoring, TokenizerChatModel):
    capabilities = Capabilities(score=True, tool_calls=True, token_logprobs=True, stream=True,
                                constrained=True,
                                complete=True, tokenize=True)

    def __init__(self, source: ModelSource, **options: Any):
        self.opts = LocalOptions(**options)
        self.source = source
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.opts.threads:
            torch.set_num_threads(self.opts.threads)
        self.device = pick_device(self.opts.device)
        self.dtype = pick_dtype(self.device, self.opts.dtype)
        t0 = time.perf_counter()
        folder = model_folder(source)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        # a transformers model, then maybe a PeftModel or the merged model (Any: the three
        # share the calls made here, which transformers' own annotations do not say)
        model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype)
        self._adapter_id = ""
        if self.opts.adapter:
            from peft import PeftModel

            adapter = check_adapter_dir(self.opts.adapter)
            with warnings.catch_warnings():  # PEFT reads an attribute transformers 5 deprecates
                warnings.filterwarnings("ignore", category=FutureWarning,
                                        message="`is_gradient_checkpointing` is deprecated")
                model = PeftModel.from_pretrained(model, adapter)
            if self.opts.merge_adapter:
                model = model.merge_and_unload()
            self._adapter_id = "+adapter:" + sha256_file(
                adapter / "adapter_model.safetensors")[:16]
        self.model = model.to(self.device).eval()
        self.load_seconds = time.perf_counter() - t0
        self._finish_setup(f"local:{source.name}{self._adapter_id}")

    def _finish_setup(self, identity: str) -> None:
        if self.opts.chat_template:
            self.tokenizer.chat_template = self.opts.chat_template
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._lock = threading.Lock()
        self._identity = identity
        self._tool_notice = False

    @classmethod
    def wrap(cls, model, tokenizer, *, device: str = "cpu", identity: str = "in-memory",
             batch_size: int = 8) -> LocalChatModel:
        """A backend over a model already in memory (e.g. the one being trained)."""
        self = cls.__new__(cls)
        self.opts = LocalOptions(batch_size=batch_size)
        self.source = ModelSource("in-memory", identity)
        self.device, self.dtype = device, next(model.parameters()).dtype
        self.tokenizer, self.model, self.load_seconds = tokenizer, model, 0.0
        self._adapter_id = ""
        self._finish_setup(f"local:{identity}")
        return self

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def max_positions(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def batch_size(self) -> int:
        return self.opts.batch_size

    # --- generation ------------------------------------------------------------------------

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        params = params or GenerationParams()
        specs, choice = self._tool_request(tools, tool_choice)
        calling = bool(specs) and choice != "none"
        prompts = [self._prompt(c, specs, choice) for c in conversations]
        if calling and choice != "auto":
            params = self._forced(params, specs or [], choice)
        out: list[Generation] = []
        bs = self.opts.batch_size
        # tokens counted as they are made: a log's line moves inside a batch, which may take
        # minutes (its own count moves only when it is done)
        with tally("tokens", "token") as tokens:
            for i in progress(range(0, len(prompts), bs), desc="generating", unit="batch",
                              delay=2):
                chunk = prompts[i:i + bs]
                gens = self._generate_batch([p for p, _ in chunk], params,
                                            add_special_tokens=False, keep_markers=calling,
                                            tokens=tokens)
                if calling:
                    names = [t.name for t in specs or ()]
                    gens = [with_tool_calls(g, prefix, self.template_tools.family, names,
                                             forced=choice != "auto")
                            for g, (_, prefix) in zip(gens, chunk, strict=True)]
                out.extend(gens)
        return out

    def complete(self, prompts: Sequence[str],
                 params: GenerationParams | None = None) -> list[Generation]:
        """Continue raw prompts, tokenised like any text (special tokens added as usual)."""
        params = params or GenerationParams()
        out: list[Generation] = []
        bs = self.opts.batch_size
        for i in range(0, len(prompts), bs):
            out.extend(self._generate_batch(list(prompts[i:i + bs]), params,
                                            add_special_tokens=True))
        return out

    def _forced(self, params: GenerationParams, specs: list[ToolSpec],
                choice: ToolChoice) -> GenerationParams:
        """`params` with the grammar of a forced call (the tool's schema), so it parses."""
        if params.constraint is not None:
            return params
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        return params.model_copy(update={"constraint": tool_call_constraint(
            self.template_tools.family, self.chat_template, specs, name)})

    def _vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def grammar_processor(self, constraint, batch: int):
        """The logits processor that holds `batch` rows to `constraint`."""
        return GrammarProcessor(constraint, self.tokenizer, self._vocab_size(),
                                _eos_ids(self.model, self.tokenizer), batch)

    def check_constraint(self, constraint) -> None:
        """Raise WorkbenchError naming the problem when `constraint` cannot be built."""
        check_constraint(constraint, self.tokenizer, self._vocab_size(),
                         _eos_ids(self.model, self.tokenizer))

    def _gen_kwargs(self, params: GenerationParams,
                    cancel: threading.Event | _AnyEvent | None = None,
                    batch: int = 1, tokens: Tally | None = None) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": params.max_tokens,
                              "pad_token_id": self.tokenizer.pad_token_id}
        if params.constraint is not None:
            from transformers import LogitsProcessorList

            kw["logits_processor"] = LogitsProcessorList(
                [self.grammar_processor(params.constraint, batch)])
        criteria = []
        if cancel is not None:
            criteria.append(_cancel_criterion(cancel))
        if tokens is not None and tokens.live:
            criteria.append(_counting_criterion(tokens, self.tokenizer.pad_token_id))
        if params.stop:
            cache = self.__dict__.setdefault("_stop_criteria", {})
            if params.stop not in cache:  # building one takes ~0.2 s over a 49k vocabulary
                if len(cache) >= 64:
                    cache.clear()
                cache[params.stop] = _stop_criterion(self.tokenizer, params.stop)
            if cache[params.stop] is not None:
                criteria.append(cache[params.stop])
        if criteria:
            from transformers import StoppingCriteriaList

            kw["stopping_criteria"] = StoppingCriteriaList(criteria)
        if params.greedy:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kw.update(do_sample=True, temperature=params.temperature, top_p=params.top_p,
                      top_k=params.top_k or 0)
        if params.repetition_penalty:
            kw["repetition_penalty"] = params.repetition_penalty
        return kw

    def _generate_batch(self, prompts: list[str], params: GenerationParams, *,
                        add_special_tokens: bool, keep_markers: bool = False,
                        tokens: Tally | None = None) -> list[Generation]:
        import torch

        tok = self.tokenizer
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True,
                  add_special_tokens=add_special_tokens)
        enc = {k: v.to(self.device) for k, v in enc.items()}
        kw = self._gen_kwargs(params, cancel_event(), len(prompts), tokens)
        with self._lock, torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            seqs = self.model.generate(**enc, **kw)
        new = seqs[:, enc["input_ids"].shape[1]:]
        eos_ids = _eos_ids(self.model, tok)
        gens = []
        for row, mask in zip(new.tolist(), enc["attention_mask"].tolist(), strict=True):
            n = len(row)
            while n and row[n - 1] == tok.pad_token_id:
                n -= 1
            ended_eos = n < len(row) or (n and row[n - 1] in eos_ids)
            if keep_markers:  # tool-call markers may be special tokens (Mistral, Llama 3)
                text = strip_special_tokens(tok.decode(row[:n], skip_special_tokens=False),
                                            tok.all_special_tokens)
            else:
                text = tok.decode(row[:n], skip_special_tokens=True)
            text, hit_stop = cut_at_stop(text, params.stop)
            finish = "stop" if (ended_eos or hit_stop) else "length"
            if finish == "length" and n < params.max_tokens:
                finish = "stop"
            gens.append(Generation(text=text, finish_reason=finish,
                                   prompt_tokens=int(sum(mask)), completion_tokens=n))
        if (grammar := _grammar(kw)) is not None:  # rows llguidance gave up on fail alone
            gens = [g if (why := grammar.failure(i)) is None else g.not_kept(why)
                    for i, g in enumerate(gens)]
        return gens

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        yield from self._stream_text(self.render(conversation), params or GenerationParams())

    def stream_tool_call(self, conversation: Conversation, params: GenerationParams | None,
                         tools: Tools, tool_choice: ToolChoice) -> Iterator[tuple[str, str]]:
        """A forced call streamed as it is generated (under the tools' schemas, so the
        pieces always add up to a valid call, unless max_tokens cuts it)."""
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
        import torch
        from transformers import TextIteratorStreamer

        enc = self.tokenizer([prompt], return_tensors="pt",
                             add_special_tokens=False).to(self.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True,
                                        skip_special_tokens=True)
        errors: list[BaseException] = []
        cancel = cancel_event()  # read here: the thread below does not share this context
        left = threading.Event()  # the consumer is done: a stop string, or it closed us
        ended = _AnyEvent(cancel, left)
        kw = self._gen_kwargs(params, ended)

        def run():
            try:
                with self._lock, torch.inference_mode():
                    if params.seed is not None:
                        torch.manual_seed(params.seed)
                    self.model.generate(**enc, streamer=streamer, **kw)
            except BaseException as e:  # noqa: BLE001 - surfaced to the consumer below
                errors.append(e)
                streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        emitted = ""
        try:
            for piece in streamer:
                emitted += piece
                cut, hit = cut_at_stop(emitted, params.stop)
                if hit:
                    start = len(emitted) - len(piece)
                    yield cut[start:] if len(cut) > start else ""
                    break
                yield piece
        finally:  # generation ends within a token of the consumer leaving, and is waited for
            left.set()
            thread.join()
        if errors:
            if isinstance(errors[0], WorkbenchError):
                raise errors[0]
            raise BackendError(f"generation failed: {errors[0]}")
        if (grammar := _grammar(kw)) is not None and (why := grammar.failure(0)):
            raise ConstraintNotKept(why)  # the row ended where llguidance gave up

    # --- scoring (`score` is CachedScoring's) ----------------------------------------------

    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        """Per-token logprobs of `text`, tokenised as a prompt (special tokens added as
        usual, like vLLM); with `top`, the `top` likeliest tokens at each position too.
        Serves `/v1/completions` with `echo` + `logprobs` (prompt scoring over HTTP)."""
        import torch

        enc = self.tokenizer(text, return_offsets_mapping=True)
        ids = enc["input_ids"]
        if not ids:
            return TokenLogprobs([], [], [], [] if top else None)
        values: list[float | None] = [None]
        tops: list[dict[str, float] | None] | None = [None] if top else None
        cancel = cancel_event()
        # the text runs in chunks over the key/value cache, so memory holds one chunk's logits
        # (not 8k positions x the vocabulary, several GB) and a client that leaves stops the
        # work within one chunk
        with self._lock, torch.inference_mode():
            past, x = None, torch.tensor([ids], device=self.device)
            for start in range(0, len(ids), LOGPROB_CHUNK):
                if cancel is not None and cancel.is_set():
                    raise Cancelled("scoring stopped: its client left")
                out = self.model(input_ids=x[:, start:start + LOGPROB_CHUNK],
                                 use_cache=True, **({self._cache_kwarg: past} if past else {}))
                past = getattr(out, "cache", None) or out.past_key_values
                lp = torch.log_softmax(out.logits[0].float(), dim=-1)
                nxt = x[0, start + 1:start + 1 + lp.shape[0]]
                lp = lp[:nxt.shape[0]]  # the last position predicts nothing in the text
                values.extend(lp.gather(1, nxt[:, None])[:, 0].tolist())
                if tops is not None:
                    best = torch.topk(lp, top, dim=-1)
                    for vals, idx in zip(best.values.tolist(), best.indices.tolist(),
                                         strict=True):
                        tops.append({self.tokenizer.decode([i]): v
                                     for v, i in zip(vals, idx, strict=True)})
                del out, lp
        return TokenLogprobs([self.tokenizer.decode([t]) for t in ids],
                             [a for a, _ in enc["offset_mapping"]], values, tops)

    def info(self):
        info = super().info()
        info.details.update(device=self.device, dtype=str(self.dtype).removeprefix("torch."),
                            source=self.source.describe(), load_seconds=self.load_seconds)
        return info


class _AnyEvent:
    """Set when any of its events is (those that are None never are)."""

    def __init__(self, *events: threading.Event | None):
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


def _cancel_criterion(event: threading.Event | _AnyEvent):
    """A stopping criterion that ends every sequence of the batch once `event` is set."""
    import torch
    from transformers import StoppingCriteria

    class Cancelled(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), event.is_set(), dtype=torch.bool,
                              device=input_ids.device)

    return Cancelled()


def _counting_criterion(tokens: Tally, pad_id: int | None):
    """A stopping criterion that stops nothing: it counts the tokens each step made, in the
    rows not yet padded (a finished row is padded), into `tokens` (a progress figure)."""
    import torch
    from transformers import StoppingCriteria

    class Counting(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            rows = input_ids.shape[0]
            tokens.add(rows if pad_id is None else int((input_ids[:, -1] != pad_id).sum()))
            return torch.zeros((rows,), dtype=torch.bool, device=input_ids.device)

    return Counting()


def _stop_criterion(tokenizer, stops: Sequence[str]):
    """transformers' stop-string criterion, or None when it cannot map the strings onto the
    vocabulary (it refuses some characters): the text is still cut at them afterwards, the
    generation just runs on to its end."""
    from transformers import StopStringCriteria

    try:
        return StopStringCriteria(tokenizer, list(stops))
    except ValueError:
        log.info("stop strings %r not mappable to tokens; cutting the text afterwards", stops)
        return None


def _grammar(kw: dict[str, Any]):
    """The GrammarProcessor among a generate call's keyword arguments, if any."""
    return next((p for p in kw.get("logits_processor") or ()
                 if isinstance(p, GrammarProcessor)), None)


def _eos_ids(model, tok) -> set[int]:
    ids = model.generation_config.eos_token_id if model.generation_config else None
    ids = ids if isinstance(ids, list) else [ids]
    return {i for i in [*ids, tok.eos_token_id] if i is not None}


_with_tool_calls = with_tool_calls  # its old name: benchmarks/constrained_decoding.py uses it

with contextlib.suppress(Exception):
    logging.getLogger("transformers").setLevel(logging.ERROR)
