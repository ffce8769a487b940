"""Domain packs: a domain is data (prompts, perspectives, settings), not a copy of a pipeline.

A pack is a YAML file with a section per pipeline:

    distill:    perspectives, prompt templates, advanced terms (difficulty)
    eval:       option count, chance level, metric names
    agent:      system prompt and tools (JSON schemas) for agents of this domain
    trajsynth:  task templates for trajectory synthesis
    train:      prompts for the merge parity check
    smoke:      the file and question of `workbench smoke`

The bundled packs live in `packs/`; `load_pack("rf")` reads one, `load_pack("my.yaml")` a
user's own. Every template's placeholders are checked when the pack loads, so a typo in a
prompt fails at once with the pack, key and field named, not half-way through a run.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from workbench.errors import ConfigError, WorkbenchError
from workbench.records import StrictModel

PACKS = Path(__file__).parent / "packs"


def placeholders(template: str) -> set[str]:
    """The `{field}` names of a str.format template."""
    try:
        return {f.split(".")[0].split("[")[0] for _, f, _, _ in
                string.Formatter().parse(template) if f}
    except ValueError as e:  # unbalanced braces
        raise ValueError(f"bad template ({e})") from None


def _check(template: str, where: str, allowed: set[str],
           required: frozenset[str] | set[str] = frozenset()) -> list[str]:
    try:
        used = placeholders(template)
    except ValueError as e:
        return [f"{where}: {e}"]
    problems = [f"{where}: unknown placeholder {{{f}}} (allowed: "
                f"{', '.join('{' + a + '}' for a in sorted(allowed)) or 'none'})"
                for f in sorted(used - allowed)]
    problems += [f"{where}: must contain {{{f}}}" for f in sorted(required - used)]
    return problems


class Perspective(StrictModel):
    id: str
    name: str
    focus: str = Field(description="What questions from this perspective ask about.")
    question_start: str | None = Field(
        None, description="Word the questions of this perspective start with when the model "
                          "writes a question for a sentence of the text (composed mode, "
                          "answers from the text): `{start}` in question_from_fact. A 135M "
                          "writer follows a first word; it does not follow a described focus.")


class DistillPrompts(StrictModel):
    """Prompt templates of the distillation (Python str.format fields)."""

    system: str
    writer_mc: str
    writer_nd: str
    question: str
    question_from_fact: str
    reference_answer: str
    answerer: str
    rationale: str
    verifier: str
    postprocess: str


# the fields each template is formatted with (see workbench/distill/pipeline.py)
DISTILL_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "system": ({"domain"}, set()),
    "writer_mc": ({"text", "perspective", "focus", "domain"}, {"text"}),
    "writer_nd": ({"text", "perspective", "focus", "domain"}, {"text"}),
    "question": ({"text", "perspective", "focus", "domain"}, {"text"}),
    "question_from_fact": ({"fact", "domain", "perspective", "start"}, {"fact"}),
    "reference_answer": ({"text", "question", "domain"}, {"text", "question"}),
    "answerer": ({"text", "question", "options", "answer_hint", "domain"}, {"question"}),
    "rationale": ({"text", "question", "options", "answer", "domain"}, {"question", "answer"}),
    "verifier": ({"text", "question", "options", "domain"}, {"question", "options"}),
    "postprocess": ({"raw"}, {"raw"}),
}


class DistillPack(StrictModel):
    perspectives: list[Perspective] = Field(min_length=1)
    prompts: DistillPrompts
    advanced_terms: list[str] = Field(default_factory=list)

    def problems(self) -> list[str]:
        out = []
        for key, (allowed, required) in DISTILL_FIELDS.items():
            out += _check(getattr(self.prompts, key), f"distill.prompts.{key}", allowed,
                          required)
        ids = [p.id for p in self.perspectives]
        if len(set(ids)) != len(ids):
            out.append("distill.perspectives: ids repeat")
        return out


class EvalPack(StrictModel):
    options: int = Field(4, ge=2, le=10, description="Options per multiple-choice item.")
    chance: float | None = Field(None, ge=0, le=1, description="Accuracy of a random guess; "
                                                               "default 1 / options.")
    metrics: list[str] = Field(default_factory=lambda: ["accuracy"],
                               description="Metric names the domain reports.")

    @property
    def chance_level(self) -> float:
        return self.chance if self.chance is not None else 1 / self.options


class ToolDecl(StrictModel):
    """A tool an agent of the domain may call (OpenAI function-tool shape)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                "properties": {}})

    @model_validator(mode="after")
    def _schema(self) -> ToolDecl:
        if self.parameters.get("type") != "object":
            raise ValueError("parameters must be a JSON schema of type 'object'")
        return self

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}


class AgentPack(StrictModel):
    system: str = "You are a careful assistant for {domain}."
    tools: list[ToolDecl] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict, description=(
        "Data the domain's agent code reads (e.g. how each predicate is verbalised); that "
        "code validates it."))

    def tool(self, name: str) -> ToolDecl:
        for t in self.tools:
            if t.name == name:
                return t
        raise WorkbenchError(f"agent.tools: no tool named {name!r} (has: "
                             f"{', '.join(t.name for t in self.tools) or 'none'})")

    def problems(self) -> list[str]:
        out = _check(self.system, "agent.system", {"domain", "tools"})
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            out.append("agent.tools: names repeat")
        return out


class TaskTemplate(StrictModel):
    id: str
    template: str = Field(description="A task with {slots} filled from the environment.")
    slots: list[str] = Field(default_factory=list)

    def problems(self, i: int) -> list[str]:
        return _check(self.template, f"trajsynth.task_templates.{i}", set(self.slots),
                      set(self.slots))


class TrajsynthPack(StrictModel):
    task_templates: list[TaskTemplate] = Field(default_factory=list)


class TrainPack(StrictModel):
    parity_prompts: list[str] = Field(
        default_factory=lambda: ["Hello.", "Explain your answer in one sentence.",
                                 "What is two plus two?", "Name one colour."],
        min_length=1, description="Prompts on which a merged model must match base+adapter.")


class SmokePack(StrictModel):
    document: str | None = Field(None, description="A file to ask about (relative paths are "
                                                   "taken from the working folder).")
    question: str | None = None


class DomainPack(StrictModel):
    name: str
    title: str
    prompt_version: str
    distill: DistillPack | None = None  # packs for agents only may have none
    eval: EvalPack = Field(default_factory=EvalPack)
    agent: AgentPack = Field(default_factory=AgentPack)
    trajsynth: TrajsynthPack = Field(default_factory=TrajsynthPack)
    train: TrainPack = Field(default_factory=TrainPack)
    smoke: SmokePack = Field(default_factory=SmokePack)
    pipelines: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "Settings a pipeline reads from the pack, by pipeline name (e.g. loop: the "
        "improvement loop's synthesis templates); that pipeline validates them."))

    # the distillation reads these directly
    @property
    def distill_pack(self) -> DistillPack:
        if self.distill is None:
            raise WorkbenchError(f"domain {self.name!r} has no distill section (it is a pack "
                                 "for agents only)")
        return self.distill

    @property
    def perspectives(self) -> list[Perspective]:
        return self.distill_pack.perspectives

    @property
    def prompts(self) -> DistillPrompts:
        return self.distill_pack.prompts

    @property
    def advanced_terms(self) -> list[str]:
        return self.distill_pack.advanced_terms

    def perspective(self, pid: str) -> Perspective:
        for p in self.distill_pack.perspectives:
            if p.id == pid:
                return p
        raise WorkbenchError(f"domain {self.name!r} has no perspective {pid!r} "
                             f"(has: {', '.join(p.id for p in self.distill_pack.perspectives)})")

    def problems(self) -> list[str]:
        out = (self.distill.problems() if self.distill else []) + self.agent.problems()
        for i, t in enumerate(self.trajsynth.task_templates):
            out += t.problems(i)
        return out


def available_packs() -> list[str]:
    return sorted(p.stem for p in PACKS.glob("*.yaml"))


def pack_path(name: str) -> Path:
    path = Path(name)
    if not path.suffix:
        path = PACKS / f"{name}.yaml"
    if not path.is_file():
        raise WorkbenchError(f"domain pack {name!r} not found (bundled: "
                             f"{', '.join(available_packs())}; or pass a YAML path)")
    return path


def load_pack(name: str) -> DomainPack:
    path = pack_path(name)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        pack = DomainPack.model_validate(data)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError([f"invalid YAML ({e})"], source=str(path)) from None
    except ValidationError as e:
        raise ConfigError([f"{'.'.join(map(str, x['loc'])) or '(top level)'}: {x['msg']}"
                           for x in e.errors()], source=str(path)) from None
    if problems := pack.problems():
        raise ConfigError(problems, source=str(path))
    return pack
