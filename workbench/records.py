"""Typed records that the pipelines exchange through JSONL files.

Every record rejects unknown fields and mistyped values (`content: 5` is an error, not a
string), so a typo in a data file surfaces at read time with its line number.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_serializer,
    model_validator,
)

from workbench import __version__
from workbench.io import read_jsonl, sha256_text, write_jsonl

ROLES = ("system", "user", "assistant", "tool")
LETTERS = "ABCDEFGHIJ"


class RecordError(ValueError):
    """A record-level problem with a stable code (used in error counts and exit messages)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class StrictModel(BaseModel):
    """The one strict base model: a key the model does not declare is an error. Records,
    report parts, config sections, a domain pack's sections and the server's request bodies
    derive from it (a subclass may add to its config, e.g. frozen=True)."""

    model_config = ConfigDict(extra="forbid")


class Record(StrictModel):
    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# --- chat -------------------------------------------------------------------------------------

class FunctionCall(Record):
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr = Field("{}", description="The arguments as JSON text.")

    def parsed_arguments(self) -> Any:
        """The arguments decoded; raises ValueError when the model wrote invalid JSON."""
        return json.loads(self.arguments)


class ToolCall(Record):
    """One call an assistant turn makes: OpenAI's `tool_calls[i]`. The arguments are JSON
    *text*, as OpenAI sends them: a model may write invalid JSON, and that must reach the
    caller as written."""

    id: StrictStr = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def make(cls, name: str, arguments: dict[str, Any] | str | None = None,
             id: str | None = None) -> ToolCall:
        args = arguments if isinstance(arguments, str) else json.dumps(
            arguments or {}, ensure_ascii=False)
        return cls(id=id or new_call_id(), function=FunctionCall(name=name, arguments=args))


class FunctionSpec(Record):
    name: StrictStr = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: StrictStr | None = None
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON schema of the arguments object.")
    strict: bool | None = None


class ToolSpec(Record):
    """One entry of OpenAI's `tools` list."""

    type: Literal["function"] = "function"
    function: FunctionSpec

    @classmethod
    def of(cls, name: str, description: str | None = None,
           parameters: dict[str, Any] | None = None) -> ToolSpec:
        schema = {} if parameters is None else {"parameters": parameters}
        return cls(function=FunctionSpec(name=name, description=description, **schema))

    @property
    def name(self) -> str:
        return self.function.name


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class Message(Record):
    """One turn in OpenAI's shape. An assistant turn may call tools (`tool_calls`; its content
    may then be empty or absent); a `tool` turn carries a result, naming the call it answers
    in `tool_call_id` (optional here: ShareGPT data has no call ids)."""

    role: StrictStr
    content: StrictStr | None = None
    # Reasoning kept apart from the answer (the `<think>` channel of thinking models); the name
    # follows the OpenAI-compatible servers (vLLM, DeepSeek) and Qwen-style chat templates.
    reasoning_content: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    name: StrictStr | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, v: str) -> str:
        if v not in ROLES:
            raise RecordError(f"unknown role {v!r} (expected one of {', '.join(ROLES)})",
                              "unknown_role")
        return v

    @model_validator(mode="after")
    def _fields_fit_role(self) -> Message:
        if self.tool_calls is not None and self.role != "assistant":
            raise RecordError(f"tool_calls: only assistant turns call tools (role is "
                              f"{self.role!r})", "misplaced_field")
        if self.tool_calls is not None and not self.tool_calls:
            raise RecordError("tool_calls: empty list (leave the field out)", "misplaced_field")
        if self.tool_call_id is not None and self.role != "tool":
            raise RecordError(f"tool_call_id: only tool turns answer a call (role is "
                              f"{self.role!r})", "misplaced_field")
        if self.content is None and not self.tool_calls:
            raise RecordError("content: missing field", "missing_field")
        return self


class ChatExample(Record):
    """One training conversation in OpenAI `messages` form, with the `tools` it may call."""

    messages: list[Message]
    tools: list[ToolSpec] | None = None
    id: StrictStr | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _well_formed(self) -> ChatExample:
        msgs = self.messages
        if not msgs:
            raise RecordError("messages is empty", "empty_messages")
        call_ids: set[str] = set()
        for i, m in enumerate(msgs):
            if m.role == "system" and i != 0:
                raise RecordError(f"messages.{i}: system message must come first",
                                  "system_not_first")
            if m.tool_call_id is not None and m.tool_call_id not in call_ids:
                raise RecordError(f"messages.{i}.tool_call_id: {m.tool_call_id!r} answers no "
                                  "earlier tool call", "unknown_tool_call")
            call_ids.update(tc.id for tc in m.tool_calls or ())
        if not any(m.role == "assistant" for m in msgs):
            raise RecordError("no assistant turn", "no_assistant")
        if msgs[-1].role != "assistant":
            raise RecordError("last turn is not an assistant turn", "last_not_assistant")
        return self



class PreferencePair(Record):
    """One preference: a state (`prompt`, the conversation so far) and two continuations of
    it, `chosen` and `rejected` (assistant turns, with any tool results between them), the
    `tools` both may call, and where the pair came from. TRL's conversational preference
    format with tools; `formats.to_trl_preference` / `from_trl_preference` convert."""

    id: StrictStr | None = None
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    tools: list[ToolSpec] | None = None
    kind: StrictStr | None = Field(None, description="How the rejected side was made (e.g. "
                                                     "a corruption or perturbation name).")
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _well_formed(self) -> PreferencePair:
        if not self.prompt:
            raise RecordError("prompt is empty", "empty_messages")
        if self.prompt[-1].role == "assistant":
            raise RecordError("prompt: its last turn is an assistant turn; the pair should "
                              "continue from a user or tool turn", "prompt_ends_assistant")
        for side in ("chosen", "rejected"):
            msgs = getattr(self, side)
            if not msgs:
                raise RecordError(f"{side} is empty", "empty_messages")
            if msgs[0].role != "assistant" or msgs[-1].role != "assistant":
                raise RecordError(f"{side}: must start and end with an assistant turn",
                                  "not_assistant")
            try:  # call ids, system placement: as a whole conversation
                ChatExample(messages=self.prompt + msgs, tools=self.tools)
            except RecordError as e:
                raise RecordError(f"{side}: {e}", e.code) from None
        if [m.to_json() for m in self.chosen] == [m.to_json() for m in self.rejected]:
            raise RecordError("chosen and rejected are the same", "same_sides")
        return self

    def example(self, side: str) -> ChatExample:
        """prompt + one side as a ChatExample (what SFT on that side would train)."""
        return ChatExample(messages=self.prompt + getattr(self, side), tools=self.tools,
                           id=self.id)


# --- corpus -----------------------------------------------------------------------------------

class Document(Record):
    id: StrictStr
    source: StrictStr
    title: StrictStr = ""
    format: StrictStr = "md"
    content_hash: StrictStr
    n_sections: StrictInt = 0


class Section(Record):
    """A titled span of a document: the unit of distillation and the parent of RAG chunks."""

    id: StrictStr
    doc_id: StrictStr
    source: StrictStr
    heading_path: list[StrictStr] = Field(default_factory=list)
    text: StrictStr
    content_hash: StrictStr
    order: StrictInt = 0
    metadata: dict[str, Any] | None = None

    @staticmethod
    def make_id(doc_id: str, heading_path: list[str], order: int) -> str:
        """Deterministic id: same document, same headings, same position -> same id."""
        return "sec-" + sha256_text(f"{doc_id}\x1f{' > '.join(heading_path)}\x1f{order}")[:16]

    @property
    def title(self) -> str:
        return " > ".join(self.heading_path)


class Chunk(Record):
    """A retrieval unit cut from a section (token-aware size, with overlap)."""

    id: StrictStr
    section_id: StrictStr
    doc_id: StrictStr
    source: StrictStr
    heading_path: list[StrictStr] = Field(default_factory=list)
    text: StrictStr
    content_hash: StrictStr
    order: StrictInt = 0  # position of the chunk in its section


# --- distillation -----------------------------------------------------------------------------

class Provenance(Record):
    """Where a generated record came from: every score traces back to the text behind it."""

    section_id: StrictStr
    span_hash: StrictStr
    doc_id: StrictStr | None = None
    perspective: StrictStr | None = None
    models: dict[str, StrictStr] = Field(default_factory=dict)  # agent -> model identity
    prompt_version: StrictStr | None = None
    domain: StrictStr | None = None
    # the sentence of the text that is the answer (composed mode); items that share it share
    # their correct option and are not independent: evaluation clusters them
    fact_hash: StrictStr | None = None


def normalise_letters(answer: str, n_options: int = 4) -> str:
    """'b, a' -> 'AB'. Raises RecordError when a letter is outside the options."""
    letters = sorted(set(re.findall(r"[A-Za-z]", answer.upper())))
    valid = LETTERS[:n_options]
    if not letters or any(ch not in valid for ch in letters):
        raise RecordError(f"answer {answer!r} is not option letter(s) among {valid}",
                          "bad_answer")
    return "".join(letters)


class QTSASample(Record):
    """Question-Thinking-Solution-Answer; `kind` mc has four options and a letter answer."""

    id: StrictStr
    kind: Literal["mc", "nd"]
    question: StrictStr
    options: list[StrictStr] | None = None
    thinking: StrictStr
    solution: StrictStr
    answer: StrictStr
    difficulty: StrictInt | None = None
    provenance: Provenance
    # which side of the split the sample comes from: training data, the benchmark of held-out
    # sections ("benchmark": transfer), or a held-out item about a trained fact ("seen":
    # RF-Agent's item-level protocol). Only "train" samples are ever trained on.
    split: Literal["train", "benchmark", "seen"] = "train"
    flags: list[StrictStr] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _split_from_old_flags(cls, data: Any) -> Any:
        """Files written before `split` was a field kept it as a "train"/"benchmark" flag."""
        if isinstance(data, dict) and "split" not in data and isinstance(data.get("flags"),
                                                                          list):
            flags = data["flags"]
            side = "benchmark" if "benchmark" in flags else "train" if "train" in flags else None
            if side:
                data = {**data, "split": side,
                        "flags": [f for f in flags if f not in ("train", "benchmark")]}
        return data

    @model_validator(mode="after")
    def _mc_consistent(self) -> QTSASample:
        if self.kind == "mc":
            if not self.options or len(self.options) != 4:
                raise RecordError("multiple-choice sample needs exactly 4 options",
                                  "bad_options")
            self.answer = normalise_letters(self.answer, len(self.options))
        return self


class MCItem(Record):
    """A multiple-choice benchmark item."""

    id: StrictStr
    question: StrictStr
    options: list[StrictStr]
    answer: StrictStr
    difficulty: StrictInt | None = None
    provenance: Provenance | None = None

    @model_validator(mode="after")
    def _answer_in_options(self) -> MCItem:
        if len(self.options) < 2:
            raise RecordError("needs at least 2 options", "bad_options")
        self.answer = normalise_letters(self.answer, len(self.options))
        return self


# --- retrieval and evaluation -----------------------------------------------------------------

class RetrievalHit(Record):
    rank: StrictInt
    chunk_id: StrictStr
    score: float
    section_id: StrictStr
    doc_id: StrictStr
    heading_path: list[StrictStr] = Field(default_factory=list)
    text: StrictStr = ""
    retriever: StrictStr = ""
    source: StrictStr = ""  # the document's path in the corpus


class EvalResult(Record):
    """One example's outcome under one condition (model x retrieval x scoring method)."""

    example_id: StrictStr
    condition: StrictStr
    model: StrictStr
    prediction: StrictStr | None = None
    gold: StrictStr | None = None
    correct: StrictBool | None = None
    score: float | None = None
    scores: dict[str, float] = Field(default_factory=dict)
    latency_s: float | None = None
    error: StrictStr | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


# --- reports ----------------------------------------------------------------------------------

class ReportPart(StrictModel):
    """A part of a pipeline's report.json. Fields named in `omit_none` are left out of the
    JSON when they are None (keys a writer writes only for some conditions)."""

    omit_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit(self, handler) -> dict[str, Any]:
        data = handler(self)
        for k in self.omit_none:
            if data.get(k, 0) is None:
                del data[k]
        return data


# --- runs -----------------------------------------------------------------------------------

class RunManifest(Record):
    """What a run did: config, the hashes of its inputs, library versions and seed."""

    run_id: StrictStr
    kind: StrictStr
    created: float = Field(default_factory=time.time)
    config: dict[str, Any] = Field(default_factory=dict)
    input_hashes: dict[str, StrictStr] = Field(default_factory=dict)
    versions: dict[str, StrictStr] = Field(default_factory=dict)
    seed: StrictInt | None = None
    status: StrictStr = "running"
    outputs: dict[str, Any] = Field(default_factory=dict)
    # each role's model identity: its engine included ("llamacpp:...+score:transformers"),
    # so a run says which engine generated and which scored
    models: dict[str, StrictStr] = Field(default_factory=dict)


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the given distributions (and ours), without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"workbench": __version__}
    for name in names or ("torch", "transformers", "peft", "sentence-transformers",
                          "xllamacpp"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    import platform

    out["python"] = platform.python_version()
    return out


def read_records(path: str | Path, cls: type[Record]) -> list:
    return read_jsonl(path, cls.model_validate)


def write_records(path: str | Path, records) -> int:
    return write_jsonl(path, records)


# --- shared know-how (federated track B) --------------------------------------------------------

class KnowledgeOp(Record):
    """One ExpeL-style operation a site proposes on the shared knowledge units, as it goes on
    the wire: ADD a unit (a workflow of abstract steps, or an insight), AGREE with one, EDIT
    one into a new unit, REMOVE one; `count` is how many of the site's outcomes back it. The
    site's pipeline (trajectory synthesis's data-agent sites) makes it; the federated server
    votes on it."""

    op: Literal["ADD", "AGREE", "EDIT", "REMOVE"]
    count: int = Field(1, ge=1, le=10_000)
    target: str = ""
    kind: Literal["workflow", "insight", ""] = ""
    family: str = Field("", max_length=40, pattern=r"^[a-z0-9_]*$")
    text: str = Field("", max_length=200)
    steps: list[Annotated[str, Field(max_length=48)]] = Field(default_factory=list,
                                                             max_length=16)
