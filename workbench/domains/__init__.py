"""Domain packs: a domain is data (perspectives, prompts, terms), not a copy of a pipeline.

A pack is a YAML file; the bundled ones live in `packs/`. `load_pack("rf")` reads a bundled
pack, `load_pack("path/to/pack.yaml")` a user's own.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workbench.errors import ConfigError, WorkbenchError

PACKS = Path(__file__).parent / "packs"


class Perspective(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    name: str
    focus: str = Field(description="What questions from this perspective ask about.")


class Prompts(BaseModel):
    """Prompt templates (Python str.format fields: {text}, {perspective}, {focus},
    {question}, {options}, {answer}, {fact}, {domain})."""

    model_config = ConfigDict(extra="forbid")
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


class DomainPack(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    title: str
    prompt_version: str
    perspectives: list[Perspective]
    prompts: Prompts
    advanced_terms: list[str] = Field(default_factory=list)

    def perspective(self, pid: str) -> Perspective:
        for p in self.perspectives:
            if p.id == pid:
                return p
        raise WorkbenchError(f"domain {self.name!r} has no perspective {pid!r} "
                             f"(has: {', '.join(p.id for p in self.perspectives)})")


def available_packs() -> list[str]:
    return sorted(p.stem for p in PACKS.glob("*.yaml"))


def load_pack(name: str) -> DomainPack:
    path = Path(name)
    if not path.suffix:
        path = PACKS / f"{name}.yaml"
    if not path.exists():
        raise WorkbenchError(f"domain pack {name!r} not found (bundled: "
                             f"{', '.join(available_packs())}; or pass a YAML path)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return DomainPack.model_validate(data)
    except yaml.YAMLError as e:
        raise ConfigError([f"invalid YAML ({e})"], source=str(path)) from None
    except ValidationError as e:
        raise ConfigError([f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()],
                          source=str(path)) from None
