"""Talk to what you built: up to three setups side by side, each a model (the base, an adapter
of the workspace, an OpenAI-compatible endpoint) with or without a retrieval index.

One question goes to every setup; each answer streams piece by piece, with the passages its
index retrieved (and their sources) kept beside it. Each setup keeps its own history, as a
person reading one column expects; the retrieved passages go into the current question's
prompt only (the evaluation's `with_context` wording), so the history stays short.

A person can mark an answer good or bad and write what it should have said. Ratings are kept
in `<workspace>/chat/ratings.jsonl` (the last rating of an answer wins) and turned into
training data the training core reads, rewritten whole after every rating:

- `chat/sft.jsonl`: a `messages` row per answer marked good (the answer) and per answer
  marked bad with a correction (the correction), the prompt as the model saw it;
- `chat/pairs.jsonl`: a preference pair per bad answer with a correction (chosen: the
  correction) and per bad answer whose turn has a good answer of another setup that was
  given the same prompt (chosen: that answer).

`workbench chat` (a terminal REPL) and the app's Chat page call this module.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_text, describe_validation_error, iter_jsonl_raw, write_jsonl
from workbench.models import load_model
from workbench.models.base import GenerationParams, cancel_on
from workbench.records import ChatExample, PreferencePair, StrictModel
from workbench.retrieval.context import cite, format_context, token_counter, with_context
from workbench.train.merge import adapter_base
from workbench.workspace import list_runs

MAX_SETUPS = 3
RETRIEVERS = ("hybrid", "semantic", "keyword")
DEFAULT_SYSTEM = "You are a helpful domain assistant. Answer clearly and briefly."
CHAT_DIR = "chat"
RATINGS, SFT, PAIRS = "ratings.jsonl", "sft.jsonl", "pairs.jsonl"
MAX_RATINGS_BYTES = 64 * 1024 * 1024


class ChatSetup(StrictModel):
    """One column of the chat: a model, an optional adapter and an optional index."""

    name: str = Field("", description="A label; default: made from the model, adapter, index.")
    model: str | None = Field(None, description="Model spec: bundled name, local folder, "
                                                ".gguf, or an OpenAI-compatible URL "
                                                "(URL#model). Default: the adapter's base "
                                                "model, else the bundled model.")
    model_label: str = Field("", description="How labels name the model (default: from the "
                                             "spec; the bundled model is `base`).")
    adapter: str | None = Field(None, description="A PEFT LoRA adapter folder.")
    index: str | None = Field(None, description="A retrieval index folder (`rag build`).")
    retriever: str = Field("hybrid", description="hybrid, semantic or keyword.")
    k: int = Field(3, ge=1, le=20, description="Passages retrieved per question.")
    system: str = DEFAULT_SYSTEM
    max_tokens: int = Field(256, ge=1, le=4096)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Backend options (e.g. a scripted model's).")

    @field_validator("retriever")
    @classmethod
    def _known_retriever(cls, v: str) -> str:
        if v not in RETRIEVERS:
            raise ValueError(f"retriever {v!r}: expected one of {', '.join(RETRIEVERS)}")
        return v

    @model_validator(mode="after")
    def _model_of_the_adapter(self) -> ChatSetup:
        if self.model is None:
            self.model = (adapter_base(self.adapter) if self.adapter else None) or "default"
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        model = self.model_label or self.model or "default"
        if model == "default":
            model = "base"
        elif "://" not in model:
            model = Path(model).name or model  # a folder or a .gguf: its name
        parts = [model]
        if self.adapter:
            parts.append(f"adapter {_adapter_name(Path(self.adapter))}")
        if self.index:
            parts.append(f"{self.retriever} k={self.k}")
        return " + ".join(parts)


def _adapter_name(path: Path) -> str:
    """The run an adapter belongs to (the folder above it holding stages.json), else its
    folder's name."""
    for p in [path, *path.parents][:4]:
        if (p / "stages.json").is_file():
            return p.name
    return path.parent.name if path.name == "adapter" and path.parent.name else path.name


@dataclass
class Passage:
    """A retrieved passage as shown under an answer."""

    rank: int
    cite: str
    text: str
    source: str
    score: float


@dataclass
class Answer:
    """One setup's answer to one question."""

    turn: str
    setup: int
    label: str
    question: str
    prompt: list[dict[str, Any]]  # the conversation the model was given
    text: str = ""
    passages: list[Passage] = field(default_factory=list)
    finish: Literal["stop", "stopped", "error"] = "stop"
    error: str | None = None
    seconds: float = 0.0


def valid_text(text: str) -> str:
    """`text` with any lone surrogate (undecodable bytes as Python reads them from a pipe or
    argv, `surrogateescape`) turned into U+FFFD, so it can be stored as UTF-8 JSON."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")
    return data.decode("utf-8", "replace")


class ChatSession:
    """Setups, their models (loaded once per model + adapter + options), their indexes
    (loaded once) and their histories."""

    def __init__(self, setups: Sequence[ChatSetup | dict[str, Any]], *,
                 loader: Callable[..., Any] | None = None):
        checked = [s if isinstance(s, ChatSetup) else ChatSetup.model_validate(s)
                   for s in setups]
        if not checked:
            raise WorkbenchError("chat: no setup (give at least one model)")
        if len(checked) > MAX_SETUPS:
            raise WorkbenchError(f"chat: {len(checked)} setups; at most {MAX_SETUPS} side by "
                                 "side")
        self.setups = checked
        self._loader = loader
        self._models: dict[tuple, Any] = {}
        self._indexes: dict[tuple, Any] = {}
        self.histories: list[list[dict[str, Any]]] = [[] for _ in checked]
        self.answers: list[Answer] = []

    # --- resources -----------------------------------------------------------------------
    def model(self, i: int):
        s = self.setups[i]
        key = (s.model, s.adapter, tuple(sorted((k, repr(v)) for k, v in s.options.items())))
        if key not in self._models:
            opts = dict(s.options)
            if s.adapter:
                opts["adapter"] = s.adapter
            # validation gave every setup its model ("default" when nothing names one)
            self._models[key] = (self._loader or load_model)(s.model or "default", **opts)
        return self._models[key]

    def _index(self, i: int):
        s = self.setups[i]
        if s.index is None:
            raise WorkbenchError(f"chat: {s.label} has no index to retrieve from")
        key = (s.index, s.retriever)
        if key not in self._indexes:
            from workbench.retrieval.index import RagIndex

            index = RagIndex.load(s.index, semantic=s.retriever != "keyword")
            self._indexes[key] = (index, index.retriever(s.retriever), token_counter(index))
        return self._indexes[key]

    def prepare(self) -> None:
        """Load every setup's model and index now (a shell that wants bad input named before
        the first question; the app loads them as each column first answers)."""
        for i, s in enumerate(self.setups):
            if s.index:
                self._index(i)
            self.model(i)

    def retrieve(self, i: int, question: str) -> tuple[list[Passage], str]:
        """The passages of setup `i` for `question` and the context block made of them."""
        s = self.setups[i]
        if not s.index:
            return [], ""

        index, retriever, count = self._index(i)
        hits = retriever.retrieve(question, s.k)
        passages = [Passage(rank=h.rank, cite=cite(h), text=h.text, source=h.source or h.doc_id,
                            score=float(h.score)) for h in hits]
        return passages, format_context(hits, max_tokens=index.config.context_tokens,
                                        count_tokens=count)

    def prompt(self, i: int, question: str, context: str) -> list[dict[str, Any]]:
        s = self.setups[i]
        system = [{"role": "system", "content": s.system}] if s.system else []
        return system + self.histories[i] + [{"role": "user",
                                              "content": with_context(question, context)}]

    # --- asking --------------------------------------------------------------------------
    def new_turn(self) -> str:
        return uuid.uuid4().hex[:12]

    def stream(self, i: int, question: str, *, turn: str | None = None,
               stop: threading.Event | None = None) -> Generator[str, None, Answer]:
        """Setup `i`'s answer to `question`, piece by piece; the finished `Answer` is the
        generator's return value and is kept in `answers` (and the history) however the
        generator ends: finished, `stop` set, or closed by its consumer (a person who left).
        Generation itself stops within a token of either."""
        question = valid_text(question).strip()
        if not question:
            raise WorkbenchError("chat: the question is empty")
        s = self.setups[i]
        t0 = time.monotonic()
        ans = Answer(turn=turn or self.new_turn(), setup=i, label=s.label, question=question,
                     prompt=[])
        cancel = threading.Event()
        pieces: Iterator[str] | None = None
        try:
            ans.passages, context = self.retrieve(i, question)
            ans.prompt = self.prompt(i, question, context)
            params = GenerationParams(max_tokens=s.max_tokens, temperature=s.temperature)
            pieces = iter(self.model(i).stream(ans.prompt, params))
            while True:
                if stop is not None and stop.is_set():
                    ans.finish = "stopped"
                    break
                with cancel_on(cancel):  # a local backend reads the event on its first step
                    piece = next(pieces, None)
                if piece is None:
                    break
                ans.text += piece
                yield piece
        except GeneratorExit:
            ans.finish = "stopped"
            raise
        except WorkbenchError as e:
            ans.finish, ans.error = "error", str(e)
        except Exception as e:  # noqa: BLE001 - one setup's failure shows in its column
            ans.finish, ans.error = "error", f"{type(e).__name__}: {e}"
        finally:
            cancel.set()
            if pieces is not None and hasattr(pieces, "close"):
                pieces.close()
            ans.seconds = time.monotonic() - t0
            self._keep(ans)
        return ans

    def answer(self, i: int, question: str, *, turn: str | None = None,
               stop: threading.Event | None = None,
               on_piece: Callable[[str], Any] | None = None) -> Answer:
        """`stream` run to its end; `on_piece` sees each piece."""
        gen = self.stream(i, question, turn=turn, stop=stop)
        while True:
            try:
                piece = next(gen)
            except StopIteration as done:
                return done.value
            if on_piece is not None:
                on_piece(piece)

    def ask(self, question: str, *, stop: threading.Event | None = None,
            on_piece: Callable[[int, str], Any] | None = None) -> list[Answer]:
        """Every setup's answer to `question`, one after the other (one turn)."""
        turn = self.new_turn()
        return [self.answer(i, question, turn=turn, stop=stop,
                            on_piece=None if on_piece is None else
                            functools.partial(on_piece, i))
                for i in range(len(self.setups))]

    def _keep(self, ans: Answer) -> None:
        self.answers.append(ans)
        if ans.finish != "error" and ans.text.strip():
            self.histories[ans.setup] += [{"role": "user", "content": ans.question},
                                          {"role": "assistant", "content": ans.text}]

    def reset(self) -> None:
        """Forget the histories (the models and indexes stay loaded)."""
        self.histories = [[] for _ in self.setups]

    def close(self) -> None:
        for m in self._models.values():
            close = getattr(m, "close", None)
            if close is not None:
                close()
        self._models.clear()


# --- ratings ---------------------------------------------------------------------------------

class Rating(StrictModel):
    """A person's verdict on one answer (the row of `ratings.jsonl`)."""

    turn: str
    setup: int
    label: str
    question: str
    prompt: list[dict[str, Any]]
    answer: str
    verdict: Literal["good", "bad"]
    correction: str | None = None
    passages: list[dict[str, Any]] = Field(default_factory=list)
    rated_at: float = Field(default_factory=time.time)


@dataclass
class FeedbackCounts:
    """What a rating left in the workspace: how many ratings, SFT rows and pairs, and where."""

    ratings: int
    sft: int
    pairs: int
    folder: Path


def chat_folder(workspace: str | Path) -> Path:
    """`<workspace>/chat`, made here if absent; a link or a non-folder there is refused."""
    folder = Path(workspace) / CHAT_DIR
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise DataError("is not a folder the workbench made (a link or a file); nothing "
                        "written", path=str(folder), code="not_a_folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def read_ratings(workspace: str | Path) -> list[Rating]:
    """Every rating kept in the workspace, oldest first (a torn last line is skipped)."""
    path = Path(workspace) / CHAT_DIR / RATINGS
    if not path.exists():
        return []
    _check_regular(path)
    out = []
    for lineno, obj in iter_jsonl_raw(path, torn_tail=lambda _e: None):
        try:
            out.append(Rating.model_validate(obj))
        except ValueError as e:
            raise DataError(describe_validation_error(e), path=str(path), line=lineno,
                            code="bad_rating") from None
    return out


def _check_regular(path: Path) -> None:
    import os
    import stat

    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise DataError("is not a regular file; not read", path=str(path), code="not_a_file")
    if st.st_size > MAX_RATINGS_BYTES:
        raise DataError(f"{st.st_size} bytes, over {MAX_RATINGS_BYTES}; not read",
                        path=str(path), code="too_large")


def rate(workspace: str | Path, answer: Answer, verdict: str, correction: str | None = None
         ) -> FeedbackCounts:
    """Keep a person's verdict on `answer` and rewrite the training files made of all
    ratings. A bad verdict may carry what the answer should have said."""
    if verdict not in ("good", "bad"):
        raise WorkbenchError(f"verdict {verdict!r}: expected good or bad")
    if answer.finish == "error" or not answer.text.strip():
        raise WorkbenchError("this answer has no text to rate")
    correction = valid_text(correction or "").strip() or None
    if verdict == "good" and correction:
        raise WorkbenchError("a correction goes with a bad verdict")
    folder = chat_folder(workspace)
    rows = read_ratings(workspace)
    rows.append(Rating(turn=answer.turn, setup=answer.setup, label=answer.label,
                       question=answer.question, prompt=answer.prompt, answer=answer.text,
                       verdict=verdict, correction=correction,
                       passages=[p.__dict__ for p in answer.passages]))
    atomic_write_text(folder / RATINGS, "".join(r.model_dump_json() + "\n" for r in rows))
    return export_feedback(workspace)


def training_rows(ratings: Sequence[Rating]):
    """(SFT examples, preference pairs) made of `ratings` (the last rating of each answer
    counts), validated as the training core reads them."""
    last: dict[tuple[str, int], Rating] = {}
    for r in ratings:
        last[(r.turn, r.setup)] = r
    sft, pairs = [], []

    def meta(r: Rating, **kw) -> dict[str, Any]:
        return {"source": "chat", "setup": r.label, "turn": r.turn, "verdict": r.verdict, **kw}

    for r in last.values():
        target = r.answer if r.verdict == "good" else r.correction
        if target:
            sft.append(ChatExample(messages=[*r.prompt, {"role": "assistant",
                                                         "content": target}],
                                   id=f"chat-{r.turn}-{r.setup}", metadata=meta(r)))
        if r.verdict != "bad":
            continue
        chosen = [(r.correction, "correction")] if r.correction else []
        chosen += [(g.answer, f"good answer of {g.label}") for g in last.values()
                   if g.turn == r.turn and g.setup != r.setup and g.verdict == "good"
                   and g.prompt == r.prompt and g.answer.strip() != r.answer.strip()]
        for n, (text, why) in enumerate(chosen):
            if text.strip() == r.answer.strip():
                continue
            pairs.append(PreferencePair(
                id=f"chat-{r.turn}-{r.setup}-{n}", prompt=r.prompt,
                chosen=[{"role": "assistant", "content": text}],
                rejected=[{"role": "assistant", "content": r.answer}],
                kind="person", metadata=meta(r, chosen=why)))
    return sft, pairs


def export_feedback(workspace: str | Path) -> FeedbackCounts:
    """Rewrite `chat/sft.jsonl` and `chat/pairs.jsonl` from the ratings (atomically)."""
    folder = chat_folder(workspace)
    ratings = read_ratings(workspace)
    sft, pairs = training_rows(ratings)
    write_jsonl(folder / SFT, (e.to_json() for e in sft))
    write_jsonl(folder / PAIRS, (p.to_json() for p in pairs))
    return FeedbackCounts(ratings=len(ratings), sft=len(sft), pairs=len(pairs), folder=folder)


# --- what the workspace offers ---------------------------------------------------------------

@dataclass
class Choices:
    """Adapters and indexes of a workspace's runs, by a label a person reads."""

    adapters: dict[str, Path]
    indexes: dict[str, Path]


def workspace_choices(workspace: str | Path) -> Choices:
    adapters, indexes = {}, {}
    for run in list_runs(Path(workspace)):
        lay = run.layout
        if run.has_adapter:
            adapters[f"{run.name} (adapter)"] = lay.artifact("train", "weights").parent
        if run.has_index:
            indexes[f"{run.name} (index)"] = lay.artifact("rag", "manifest").parent
    return Choices(adapters=adapters, indexes=indexes)
