"""What an agent pack declares, and the registry of packs.

A pack is data: an `AgentPack` names its code (a module offering `evaluate(cfg, ctx)` and
`run_inputs(cfg, inputs, log)`), the conditions it compares, the stages it runs in the agent
pipeline (each with the files it writes: `Stage` and `Artifact`, as every pipeline declares
them) and its report (`PackReport`: the typed record, its one reader, the declared output that
holds it). The agent pipeline's stages are composed from the registered packs' (`stages`), so
a pack from another installed package brings its own stages and report without an edit to the
workbench: it adds an entry to the group `workbench.agent_packs` in its own `pyproject.toml`,

    [project.entry-points."workbench.agent_packs"]
    mypack = "mypack.declare:PACK"

naming its `AgentPack` (the built-ins are the workbench's own entries of that group), or
registers one from code (`PACKS.register(name, pack)`). An entry that names a module (the older
form) is a pack whose declaration is that module's `STAGES` (if any), with its report through
the module's `REPORT_JSON` and `read_report`.

This module imports only the registry's types: the workbench reads every pack's declaration
when it builds the agent pipeline (for `--help` too), so a declaration imports no pack code.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from workbench.errors import WorkbenchError
from workbench.plugins import AGENT_PACKS, Registry, load
from workbench.registry import Artifact, Stage


@dataclass(frozen=True)
class PackReport:
    """A pack's report: a typed record with `schema_version`, read by one function."""

    record: str  # "module:Class": the record type (a pydantic model)
    reader: str  # "module:function": read_report(run) -> the record (a run folder or layout)
    artifact: str  # the declared output (of one of the pack's stages) holding its JSON


@dataclass(frozen=True)
class AgentPack:
    """One agent pack, as the agent pipeline sees it (data only; the code is `entry`)."""

    name: str
    entry: str  # "module" offering evaluate(cfg, ctx) and run_inputs(cfg, inputs, log)
    help: str = ""
    conditions: tuple[str, ...] = ()  # what it compares by default, in report order
    stages: tuple[Stage, ...] = ()  # its stages of the agent pipeline
    report: PackReport | None = None
    # the `agent` settings only some packs read that this one reads ("index", "adapters");
    # set for another pack, they are refused in one line
    reads: tuple[str, ...] = ()

    def module(self) -> Any:
        return load(self.entry, what=f"agent pack {self.name!r}")


def grpo_outputs(stage: str) -> tuple[Artifact, ...]:
    """What a pack's GRPO training writes (`agent_packs.grpo.train`): the kept adapter, and
    beside it the rollouts of every step, one metric row per step (the live curves), the
    inputs its checkpoints were made under and the checkpoints while it trains."""
    return (Artifact(stage, f"{stage}/adapter_model.safetensors"),
            Artifact(f"{stage}_key", f".{stage}.key", kind="text", required=False,
                     help="the hash of the inputs the checkpoints were made under (other "
                          "inputs start over)"),
            Artifact(f"{stage}_checkpoints", f".{stage}.checkpoints", required=False,
                     help="a checkpoint every step, removed once the adapter is written"),
            Artifact(f"{stage}_rollouts", f"{stage}.rollouts", required=False,
                     help="every step's rollouts (one JSONL file a step)"),
            Artifact(f"{stage}_live", f"{stage}.live.jsonl", required=False,
                     help="one metric row per step: reward, groups with no signal, tool "
                          "calls, KL, clipping, dev reward"))


# name -> the pack's declaration (or, in the older form, its module)
PACKS: Registry[AgentPack | ModuleType] = Registry(
    "agent pack", group=AGENT_PACKS, sort=True,
    unknown="unknown {kind} {name!r} (available: {known})")


def declaration(name: str) -> AgentPack:
    """The pack registered under `name` as an `AgentPack` (an entry naming a module is
    read as one); an unknown or broken one is a WorkbenchError of one line."""
    obj = PACKS.get(name)
    if isinstance(obj, AgentPack):
        return obj
    if isinstance(obj, ModuleType):
        return AgentPack(name=name, entry=obj.__name__,
                         stages=tuple(getattr(obj, "STAGES", ())))
    raise WorkbenchError(f"agent pack {name!r}: its entry is a {type(obj).__name__}, not an "
                         "AgentPack or a module")


def names() -> list[str]:
    return sorted(PACKS.names())


def stages(*, skip: tuple[Stage, ...] = ()) -> tuple[Stage, ...]:
    """Every registered pack's stages, in the order the packs are registered (the group's
    entries first), less those of `skip`'s names. A pack that cannot be loaded adds none (it
    says why when it is used); two packs declaring one stage name is an error."""
    out: dict[str, tuple[str, Stage]] = {s.name: ("", s) for s in skip}
    for name in PACKS.names():
        try:
            pack = declaration(name)
        except WorkbenchError:
            continue
        for s in pack.stages:
            owner, old = out.get(s.name, (name, s))
            if owner != name and old != s:
                raise WorkbenchError(f"agent pack {name!r} declares stage {s.name!r}, which "
                                     f"{'the agent pipeline' if not owner else repr(owner)} "
                                     "declares too")
            out.setdefault(s.name, (name, s))
    skipped = {s.name for s in skip}
    return tuple(s for n, (_, s) in out.items() if n not in skipped)
