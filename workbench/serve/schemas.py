"""The request bodies the server accepts (OpenAI's and vLLM's fields, each one implemented:
any other field is refused; caller-supplied schemas, regexes and grammars within the bounds of
`limits`), and the generation settings a request asks for."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from workbench.models.base import GenerationParams
from workbench.models.bounds import bounded_pattern, bounded_schema
from workbench.models.constrain import Constraint
from workbench.models.messages import NamedToolChoice, ToolCall, ToolSpec
from workbench.records import StrictModel
from workbench.serve.limits import MAX_SCHEMA_ALTERNATIVES, MAX_SCHEMA_CHARS
from workbench.serve.replies import WithinField


def _bounded_tools(tools: list[ToolSpec] | None) -> list[ToolSpec] | None:
    for i, t in enumerate(tools or ()):
        if problem := bounded_schema(t.function.parameters):
            raise WithinField(f"[{i}].function.parameters", problem)
    return tools


BoundedTools = Annotated[list[ToolSpec] | None, AfterValidator(_bounded_tools)]


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessageIn(StrictModel):
    # validated in this order: each check sees the fields above it
    role: Literal["system", "user", "assistant", "tool"]
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(None, validate_default=True)
    name: str | None = None
    content: str | list[TextPart] | None = Field(None, validate_default=True)

    @field_validator("tool_calls")
    @classmethod
    def _calls(cls, v, info: ValidationInfo):
        if v is not None and info.data.get("role") != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return v

    @field_validator("tool_call_id")
    @classmethod
    def _call_id(cls, v, info: ValidationInfo):
        role = info.data.get("role")
        if role == "tool" and not v:
            raise ValueError("a tool message needs the id of the call it answers")
        if v is not None and role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return v

    @field_validator("content")
    @classmethod
    def _content(cls, v, info: ValidationInfo):
        role = info.data.get("role")
        if v is None and role is not None and not (role == "assistant"
                                                   and info.data.get("tool_calls")):
            raise ValueError(f"a {role} message needs content" + (
                " or tool_calls" if role == "assistant" else ""))
        return v

    def plain(self) -> dict[str, Any]:
        text = self.content if not isinstance(self.content, list) else \
            "".join(p.text for p in self.content)
        out: dict[str, Any] = {"role": self.role, "content": text or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump(mode="json") for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def conversation(messages: list[ChatMessageIn]) -> list[dict[str, Any]]:
    """The request's messages as the models' plain conversation."""
    return [m.plain() for m in messages]


MAX_STOPS, MAX_STOP_CHARS = 4, 256


class ResponseFormat(StrictModel):
    """OpenAI's `response_format`: "text", "json_object" (any JSON object) or "json_schema"
    (`{"name", "schema", "strict"?, "description"?}`); the reply is generated under it."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @field_validator("json_schema")
    @classmethod
    def _named_schema(cls, v, info: ValidationInfo):
        if v is None:
            return v
        if extra := set(v) - {"name", "schema", "strict", "description"}:
            raise ValueError(f"json_schema: unsupported field {min(extra)!r}")
        if not isinstance(v.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}",
                                                                   v["name"]):
            raise ValueError("json_schema.name: 1 to 64 letters, digits, _ or -")
        if not isinstance(v.get("schema", {}), dict):
            raise ValueError("json_schema.schema: a JSON schema object")
        if problem := bounded_schema(v.get("schema", {})):
            raise WithinField(".schema", problem)
        return v

    def constraint(self) -> Constraint | None:
        if self.type == "json_object":
            return Constraint.json_object()
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError("response_format: type json_schema needs `json_schema`")
            return Constraint.json_schema(self.json_schema.get("schema") or {"type": "object"})
        return None


class _Sampling(StrictModel):
    """The sampling fields both generation routes accept."""

    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float | None = Field(None, gt=0.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # int64, as OpenAI

    @field_validator("stop")
    @classmethod
    def _few_short_stops(cls, v):
        """At most MAX_STOPS strings (OpenAI's 4) of 1 to MAX_STOP_CHARS characters: each
        costs a pass over the vocabulary, and 10,000 of them wedged the server."""
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not 1 <= len(x) <= MAX_STOP_CHARS for x in stops):
            raise ValueError(f"each stop string has 1 to {MAX_STOP_CHARS} characters")
        return v
    stream: bool = False
    n: int = Field(1, ge=1, le=1)


class ChatCompletionRequest(_Sampling):
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: BoundedTools = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # vLLM's guided decoding fields (what `models.openai_compat` sends for non-JSON shapes)
    guided_regex: str | None = Field(None, max_length=10_000)
    guided_choice: list[str] | None = Field(None, min_length=1,
                                            max_length=MAX_SCHEMA_ALTERNATIVES)
    guided_grammar: str | None = Field(None, max_length=MAX_SCHEMA_CHARS, description="Lark")

    @field_validator("guided_regex", "guided_grammar")
    @classmethod
    def _bounded_pattern(cls, v, info: ValidationInfo):
        if v is not None and (problem := bounded_pattern(v, info.field_name == "guided_grammar")):
            raise ValueError(problem)
        return v

    @field_validator("guided_choice")
    @classmethod
    def _bounded_choices(cls, v):
        if v is not None and (size := sum(len(c) for c in v)) > MAX_SCHEMA_CHARS:
            raise ValueError(f"the choices are {size} characters in all, over the size "
                             f"limit of {MAX_SCHEMA_CHARS}")
        return v

    def constraint(self) -> tuple[Constraint | None, str]:
        """The output constraint asked for, and the field that asked (at most one)."""
        asked: list[tuple[str, Any]] = [(f, v) for f, v in (("guided_regex", self.guided_regex),
                                     ("guided_choice", self.guided_choice),
                                     ("guided_grammar", self.guided_grammar)) if v is not None]
        if self.response_format is not None and self.response_format.type != "text":
            asked.append(("response_format", self.response_format))
        if len(asked) > 1:
            raise ValueError(f"{asked[1][0]}: send one of response_format, guided_regex, "
                             "guided_choice and guided_grammar")
        if not asked:
            return None, ""
        field, v = asked[0]
        if field == "response_format":
            return v.constraint(), field
        if field == "guided_regex":
            return Constraint.regex(v), field
        if field == "guided_choice":
            return Constraint.choice(v), field
        return Constraint.lark(v), field


class CompletionRequest(_Sampling):
    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _some_prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("an empty list of prompts")
        return v


class TokenizeRequest(StrictModel):
    """vLLM's `/tokenize`: a `prompt` (text) or `messages` (rendered by the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageIn] | None = Field(None, min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    tools: BoundedTools = None


class DetokenizeRequest(StrictModel):
    model: str | None = None
    tokens: list[int]


def generation_params(req: ChatCompletionRequest | CompletionRequest,
                      max_tokens: int) -> GenerationParams:
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    return GenerationParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                            top_k=req.top_k, stop=tuple(stop), seed=req.seed,
                            repetition_penalty=req.repetition_penalty)
