"""CTranslate2 backend: int8 (CPU) or float16/bfloat16 (CUDA) generation and scoring.

Any local Hugging Face folder (the bundled GGUF after its safetensors conversion included) is
converted once into a cached CTranslate2 folder (`ct2_convert.convert_ct2`, whose names are
re-exported here).

Prompts are rendered with the model's own tokenizer and chat template by the code the
transformers backend uses too (`hf_chat.TokenizerChatModel`), tool calls go through the same
parsers, and scoring follows lm-eval's context/continuation split exactly as
`TokenizerChatModel._encode_pair` does.

Seeds: CTranslate2 seeds each worker thread's random generator once, at that thread's first
draw (`set_random_seed` does not restart a generator that has drawn). A seeded sampling call
therefore runs on a fresh one-shot `Generator` (loading the converted folder again: ~0.1 s
for the bundled model), so the same seed gives the same sample whatever ran before.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import Field, field_validator

from workbench.errors import BackendError, WorkbenchError
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
from workbench.models.ct2_convert import (
    COMPLETE,
    QUANTIZATIONS,
    conversions,
    convert_ct2,
    ct2_cache_dir,
    is_complete,
    source_fingerprint,
)
from workbench.models.ct2_watch import SeedGate, Watch, held_back
from workbench.models.hf_chat import TokenizerChatModel
from workbench.models.local import LocalChatModel, model_folder
from workbench.models.messages import ToolChoice
from workbench.models.postprocess import cut_at_stop, with_tool_calls
from workbench.models.resolve import ModelSource
from workbench.records import StrictModel

SCORE_BYTES = 256 * 2**20  # log-probabilities held at once while scoring (rows x len x vocab)


class CT2Options(StrictModel):
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
    quantization: str = Field("auto", description="Weights of the conversion: auto (int8 on "
                                                  "CPU, bfloat16 or float16 on CUDA), "
                                                  + ", ".join(QUANTIZATIONS) + ".")
    compute_type: str = Field("default", description="CTranslate2 compute type at load "
                                                     "(default: the conversion's).")
    intra_threads: int = Field(1, ge=0, description="OpenMP threads per generation (1 was "
                                                    "~3x faster than 2 on a 2-core CPU; 0: "
                                                    "CTranslate2's default).")
    inter_threads: int | None = Field(None, ge=1, description=(
        "Batches run in parallel (a call's batch is split across them). Default: 2 on a CPU "
        "with 2 or more cores (1 intra x 2 inter was the fastest layout on 2 cores: "
        "BENCHMARKS.md), 1 on CUDA."))
    batch_size: int = Field(8, ge=1, description="Conversations per batch.")
    chat_template: str | None = Field(None, description="Jinja template when the tokenizer "
                                                        "has none.")
    adapter: str | None = Field(None, description="PEFT LoRA adapter folder: merged into a "
                                                  "copy of the model, then converted (cached).")
    scoring: Literal["auto", "ctranslate2", "transformers"] = Field(
        "auto", description="Backend for score/token_logprobs: this one, or the transformers "
                            "model (loaded on first use). auto: this one only where its "
                            "parity was measured (float32: same choice on 100/100 items); "
                            "int8 scoring changed 10 of 100 choices, so it stays on "
                            "transformers.")
    cache_dir: str | None = Field(None, description="Where conversions are cached (default: "
                                                    "<workbench home>/models).")
    # The transformers backend's own options, accepted so that a config written for it
    # switches with `-s models.chat.backend=ctranslate2` alone; they do not apply here.
    dtype: str | None = Field(None, description="Ignored (transformers only).")
    threads: int | None = Field(None, description="Ignored (transformers only; see "
                                                  "intra_threads).")
    merge_adapter: bool | None = Field(None, description="Ignored: adapters are always "
                                                         "merged here.")

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, v: str) -> str:
        if v != "auto" and v not in QUANTIZATIONS:
            raise ValueError(f"quantization must be auto or one of {', '.join(QUANTIZATIONS)}")
        return v


def scoring_backend(scoring: str, compute_type: str) -> str:
    """Where scoring runs: as asked, or (auto) on CTranslate2 only for float32 compute, the
    one layout whose parity with transformers was measured (100/100 same choices, max
    |dloglik| 7e-5); int8 changed 10 of 100 choices (benchmarks/bench_ct2.py)."""
    if scoring != "auto":
        return scoring
    return "ctranslate2" if compute_type == "float32" else "transformers"


# --- devices -----------------------------------------------------------------------------------

def pick_device(device: str = "auto") -> tuple[str, int]:
    """(CTranslate2 device, device index)."""
    import ctranslate2

    if device == "auto":
        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    name, _, index = device.partition(":")
    if name not in ("cpu", "cuda"):
        raise WorkbenchError(f"device {device!r}: the ctranslate2 backend runs on cpu or cuda")
    return name, int(index or 0)


def pick_quantization(device: str, quantization: str = "auto") -> str:
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types(device)
    if quantization == "auto":
        if device == "cpu":
            return "int8"
        return "bfloat16" if "bfloat16" in supported else "float16"
    return quantization


# --- the backend -------------------------------------------------------------------------------

@register_backend("ctranslate2")
class CT2ChatModel(TokenizerChatModel):
    capabilities = Capabilities(score=True, tool_calls=True, token_logprobs=True, stream=True,
                                complete=True, tokenize=True)

    def __init__(self, source: ModelSource, **options: Any):
        self.opts = CT2Options(**options)
        if source.kind == "openai" or source.path is None:
            raise WorkbenchError(f"{source.name}: the ctranslate2 backend runs local models, "
                                 "not a server")
        from transformers import AutoTokenizer

        self.source = source
        self.device, self.device_index = pick_device(self.opts.device)
        self.quantization = pick_quantization(self.device, self.opts.quantization)
        t0 = time.perf_counter()
        self.folder = convert_ct2(model_folder(source), self.quantization,
                                  adapter=self.opts.adapter, cache_dir=self.opts.cache_dir)
        self.meta = json.loads((self.folder / COMPLETE).read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.inter_threads = self.opts.inter_threads or (
            1 if self.device == "cuda" else max(1, min(2, os.cpu_count() or 1)))
        self.generator = self._new_generator(self.inter_threads)
        self.compute_type = self.generator.compute_type
        self.load_seconds = time.perf_counter() - t0
        if self.opts.chat_template:
            self.tokenizer.chat_template = self.opts.chat_template
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_ids = set(self.meta.get("eos_token_ids") or [])
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        self._tool_notice = False
        self._scorer: ChatModel | None = None
        self._scorer_lock = threading.Lock()
        adapter = ("+adapter:" + self.meta["adapter_sha256"][:16]
                   if self.meta.get("adapter_sha256") else "")
        self.scoring = scoring_backend(self.opts.scoring, self.compute_type)
        scoring = "+score:transformers" if self.scoring == "transformers" else ""
        self._identity = f"ctranslate2:{source.name}{adapter}:{self.compute_type}{scoring}"

    def _new_generator(self, inter_threads: int):
        import ctranslate2

        return ctranslate2.Generator(str(self.folder), device=self.device,
                                     device_index=self.device_index,
                                     compute_type=self.opts.compute_type,
                                     inter_threads=inter_threads,
                                     intra_threads=self.opts.intra_threads)

    @classmethod
    def uses(cls, options: dict[str, Any] | None = None) -> dict[str, str]:
        """Which backend serves each use with these options (nothing is loaded)."""
        o = options or {}
        compute = o.get("compute_type") if o.get("compute_type", "default") != "default" \
            else o.get("quantization", "auto")
        return {"generate": "ctranslate2",
                "score": scoring_backend(o.get("scoring", "auto"), compute or "auto")}

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def max_positions(self) -> int | None:
        return self.meta.get("max_position_embeddings")

    @property
    def batch_size(self) -> int:
        return self.opts.batch_size

    # --- generation ----------------------------------------------------------------------

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        params = params or GenerationParams()
        specs, choice = self._tool_request(tools, tool_choice)
        calling = bool(specs) and choice != "none"
        prompts = [self._prompt(c, specs, choice) for c in conversations]
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p, _ in prompts]
        gens = self._generate_ids(ids, params, keep_markers=calling)
        if calling:
            names = [t.name for t in specs or ()]
            gens = [with_tool_calls(g, prefix, self.template_tools.family, names)
                    for g, (_, prefix) in zip(gens, prompts, strict=True)]
        return gens

    def complete(self, prompts: Sequence[str],
                 params: GenerationParams | None = None) -> list[Generation]:
        """Continue raw prompts, tokenised like any text (special tokens added as usual)."""
        params = params or GenerationParams()
        ids = [self.tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
        return self._generate_ids(ids, params)

    def _start_id(self) -> int:
        tok = self.tokenizer
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def _sampling(self, params: GenerationParams) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_length": params.max_tokens,
                              "end_token": sorted(self.eos_ids)}
        if params.greedy:
            kw.update(sampling_topk=1)
        else:
            kw.update(sampling_topk=params.top_k or 0, sampling_topp=params.top_p,
                      sampling_temperature=params.temperature)
        if params.repetition_penalty:
            kw["repetition_penalty"] = params.repetition_penalty
        return kw

    def _generate_ids(self, ids: list[list[int]], params: GenerationParams, *,
                      keep_markers: bool = False) -> list[Generation]:
        if not ids:
            return []
        tok = self.tokenizer
        starts = [tok.convert_ids_to_tokens(row or [self._start_id()]) for row in ids]
        watch = Watch(len(ids), params.stop, cancel_event(), tok, keep_markers)
        kw = self._sampling(params)
        kw.update(include_prompt_in_result=False, return_end_token=True)
        seed = None if params.greedy else params.seed
        seeded = seed is not None
        # a seeded call runs on one fresh worker thread, which then draws every number
        parts = 1 if seeded else self.inter_threads
        cap = max(1, min(self.opts.batch_size, math.ceil(len(ids) / parts)))
        groups = length_groups([len(s) for s in starts], params.max_tokens, cap)
        results: list[Any] = [None] * len(ids)
        try:
            if seed is not None:
                gate = SeedGate(seed)
                try:
                    gen = self._new_generator(1)
                    for group in groups:
                        out = gen.generate_batch([starts[i] for i in group],
                                                 callback=gate.wrap(watch.of(group)), **kw)
                        for i, res in zip(group, out, strict=True):
                            results[i] = res
                finally:
                    gate.release()
            else:  # queued at once: with inter_threads > 1 the groups run in parallel
                pending = [(group, self.generator.generate_batch(
                    [starts[i] for i in group], asynchronous=True, callback=watch.of(group),
                    **kw)) for group in groups]
                for group, out in pending:
                    for i, res in zip(group, out, strict=True):
                        results[i] = res.result()
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"generation failed: {e}") from e
        gens = []
        for i, (res, prompt) in enumerate(zip(results, ids, strict=True)):
            row = list(res.sequences_ids[0])
            ended_eos = bool(row) and row[-1] in self.eos_ids
            n = len(row) - 1 if ended_eos else len(row)
            text = watch.decode(row[:n])
            text, hit_stop = cut_at_stop(text, params.stop)
            finish = "stop" if (ended_eos or hit_stop or watch.hit[i]) else "length"
            if finish == "length" and n < params.max_tokens:
                finish = "stop"
            gens.append(Generation(text=text, finish_reason=finish,
                                   prompt_tokens=len(prompt), completion_tokens=n))
        return gens

    def stream(self, conversation: Conversation,
               params: GenerationParams | None = None) -> Iterator[str]:
        """Yield text pieces as tokens come; text that may be the start of a stop string is
        held back until it is known not to be one."""
        params = params or GenerationParams()
        ids = self.tokenizer(self.render(conversation), add_special_tokens=False)["input_ids"]
        cancel = cancel_event()  # read here: the generation thread has its own context
        kw = self._sampling(params)
        if cancel is not None:
            kw["callback"] = lambda step: cancel.is_set()
        stop_on_cancel = (lambda step: cancel.is_set()) if cancel is not None else None
        out: list[int] = []
        emitted = ""
        gen, gate = self.generator, None
        if params.seed is not None and not params.greedy:
            gate = SeedGate(params.seed)
        try:
            if gate is not None:
                gen = self._new_generator(1)
                stop_on_cancel = gate.wrap(stop_on_cancel)
            if stop_on_cancel is not None:
                kw["callback"] = stop_on_cancel
            steps = gen.generate_tokens(self.tokenizer.convert_ids_to_tokens(ids), **kw)
            try:
                for step in steps:
                    if step.token_id in self.eos_ids:
                        break
                    out.append(step.token_id)
                    text = self.tokenizer.decode(out, skip_special_tokens=True)
                    if text.endswith("\ufffd"):  # half of a multi-byte character
                        continue
                    cut, hit = cut_at_stop(text, params.stop)
                    safe = cut if hit else cut[:len(cut) - held_back(cut, params.stop)]
                    if len(safe) > len(emitted):
                        yield safe[len(emitted):]
                        emitted = safe
                    if hit:
                        return
            except RuntimeError as e:
                raise BackendError(f"generation failed: {e}") from e
            finally:
                steps.close()
        finally:
            if gate is not None:
                gate.release()
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        cut, _ = cut_at_stop(text, params.stop)
        if len(cut) > len(emitted):
            yield cut[len(emitted):]

    # --- scoring ---------------------------------------------------------------------------

    def _transformers_scorer(self) -> ChatModel:
        with self._scorer_lock:
            if self._scorer is None:
                opts: dict[str, Any] = {"batch_size": self.opts.batch_size,
                                        "chat_template": self.opts.chat_template,
                                        "adapter": self.opts.adapter,
                                        "device": ("cpu" if self.device == "cpu"
                                                   else f"cuda:{self.device_index}")}
                self._scorer = LocalChatModel(self.source, **opts)
            return self._scorer

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        """Log-likelihood of each continuation after its prompt (lm-eval's conventions,
        `LocalChatModel._encode_pair`).

        CTranslate2 has no key/value cache to share between the continuations of a prompt,
        so rows are shared instead: a continuation is read off any row that starts with its
        context and all but its last token. The letters of a multiple-choice item ("A".."D",
        or the template's newline and a letter) then cost one pass over the prompt, not
        four; the options of a cloze item cost one pass each."""
        if self.scoring == "transformers":
            return self._transformers_scorer().score(requests)
        flat = self._flat_pairs(requests, self._start_id())
        needed = [tuple(ctx + cont[:-1]) for _, ctx, cont, _ in flat]
        rows = _covering_rows(needed)
        row_of = [rows.index_of(r) for r in needed]
        spans: list[list[tuple[int, list[int]]]] = [[] for _ in rows.rows]
        for (_, ctx, cont, _), r in zip(flat, row_of, strict=True):
            spans[r].append((len(ctx), cont))
        logprobs = self._row_logprobs(rows.rows, spans)
        taken = [0] * len(rows.rows)
        grouped: list[list[ContinuationScore]] = [[] for _ in requests]
        for k, (ri, _, cont, nchar) in enumerate(flat):
            r = row_of[k]
            total, greedy = logprobs[r][taken[r]]
            taken[r] += 1
            grouped[ri].append(ContinuationScore(logprob=total, n_tokens=len(cont),
                                                 n_chars=nchar, is_greedy=greedy))
        return grouped

    def _forward(self, batch: list[list[int]]):
        """Log-probabilities [rows, positions, vocab] as a float32 numpy array."""
        import ctranslate2
        import numpy as np

        try:
            out = self.generator.forward_batch(batch, return_log_probs=True)
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"scoring failed: {e}") from e
        if out.device != "cpu":
            out = out.to(ctranslate2.DataType.float32).to_device(ctranslate2.Device.cpu)
        elif str(out.dtype) != "DataType.float32":
            out = out.to(ctranslate2.DataType.float32)
        return np.asarray(out)

    def _row_logprobs(self, rows: list[tuple[int, ...]],
                      spans: list[list[tuple[int, list[int]]]]
                      ) -> list[list[tuple[float, bool]]]:
        """For each row, (sum of logprobs, all greedy) of each (start, tokens) span read off
        it: token k of a span is predicted at position start + k - 1."""
        vocab = len(self.tokenizer)
        order = sorted(range(len(rows)), key=lambda r: len(rows[r]))
        chunks: list[list[int]] = []
        for r in order:  # similar lengths together; bounded memory per forward pass
            width = len(rows[r])
            if chunks and len(chunks[-1]) < 64 and \
                    (len(chunks[-1]) + 1) * width * vocab * 4 <= SCORE_BYTES:
                chunks[-1].append(r)
            else:
                chunks.append([r])
        out: list[list[tuple[float, bool]]] = [[] for _ in rows]

        def run(chunk: list[int]) -> None:
            lp = self._forward([list(rows[r]) for r in chunk])
            for j, r in enumerate(chunk):
                for start, toks in spans[r]:
                    pos = range(start - 1, start - 1 + len(toks))
                    picked = lp[j, list(pos), toks]
                    best = lp[j, list(pos)].argmax(-1)
                    out[r].append((float(picked.sum(dtype="float64")),
                                   bool((best == toks).all())))

        if self.inter_threads > 1 and len(chunks) > 1:
            with ThreadPoolExecutor(self.inter_threads) as pool:
                list(pool.map(run, chunks))
        else:
            for c in chunks:
                run(c)
        return out

    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        if self.scoring == "transformers":
            return self._transformers_scorer().token_logprobs(text, top)
        import numpy as np

        enc = self.tokenizer(text, return_offsets_mapping=True)
        ids = enc["input_ids"]
        if not ids:
            return TokenLogprobs([], [], [], [] if top else None)
        lp = self._forward([ids])[0]
        values: list[float | None] = [None]
        values += [float(lp[k - 1, ids[k]]) for k in range(1, len(ids))]
        tops: list[dict[str, float] | None] | None = None
        if top:
            tops = [None]
            for k in range(1, len(ids)):
                best = np.argsort(-lp[k - 1])[:top]
                tops.append({self.tokenizer.decode([int(i)]): float(lp[k - 1, i])
                             for i in best})
        return TokenLogprobs([self.tokenizer.decode([t]) for t in ids],
                             [a for a, _ in enc["offset_mapping"]], values, tops)

    def info(self):
        info = super().info()
        info.details.update(device=self.device, compute_type=self.compute_type,
                            quantization=self.quantization, folder=str(self.folder),
                            source=self.source.describe(), load_seconds=self.load_seconds,
                            intra_threads=self.opts.intra_threads,
                            inter_threads=self.inter_threads, scoring=self.scoring)
        return info

    def close(self) -> None:
        gen = getattr(self, "generator", None)
        if gen is not None:
            gen.unload_model()
        if self._scorer is not None:
            self._scorer.close()


STEP_GROWTH = 0.2  # a decoding step of a batch of b costs (1 + 0.2 (b - 1)) steps of one


def length_groups(lengths: Sequence[int], max_tokens: int, cap: int) -> list[list[int]]:
    """Split prompts (by index) into batches of at most `cap` that cost the fewest decoding
    steps. CTranslate2 forwards a batch's prompts at once only up to the shortest one; each
    further prompt token is a decoding step of the whole batch (a 37- and a 414-token prompt
    together took 12 s, apart 1 s). A batch of b prompts whose lengths spread over d tokens
    costs about (d + max_tokens) (1 + STEP_GROWTH (b - 1)) steps; the split is the cheapest
    over contiguous runs of the prompts sorted by length."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sl = [lengths[i] for i in order]
    n = len(order)
    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(max(0, i - cap), i):
            cost = best[j] + (sl[i - 1] - sl[j] + max_tokens) * (1 + STEP_GROWTH * (i - j - 1))
            if cost < best[i]:
                best[i], cut[i] = cost, j
    groups, i = [], n
    while i > 0:
        groups.append(order[cut[i]:i])
        i = cut[i]
    return groups[::-1]


class _Rows:
    def __init__(self, rows: list[tuple[int, ...]]):
        self.rows = rows

    def index_of(self, needed: tuple[int, ...]) -> int:
        import bisect

        i = bisect.bisect_left(self.rows, needed)
        return i  # _covering_rows guarantees rows[i] starts with `needed`


def _covering_rows(needed: list[tuple[int, ...]]) -> _Rows:
    """The fewest rows that cover every needed row (a row covers those it starts with),
    sorted: a needed row is covered by the first kept row not below it."""
    uniq = sorted(set(needed))
    kept = [r for i, r in enumerate(uniq)
            if i + 1 == len(uniq) or uniq[i + 1][:len(r)] != r]
    return _Rows(kept)


__all__ = ["COMPLETE", "QUANTIZATIONS", "CT2ChatModel", "CT2Options", "conversions",
           "convert_ct2", "ct2_cache_dir", "is_complete", "length_groups", "source_fingerprint"]
