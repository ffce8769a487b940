"""Entry points of the domain-agent pipeline: one call per CLI command or job.

Packs plug in by name through the registry of packs (`agent_packs.pack.PACKS`: the
entry-point group `workbench.agent_packs`, whose built-ins kgv, rf and litsearch are entries
of the workbench's own): each declares itself (`AgentPack`: its stages, conditions and report)
and names a module that offers `evaluate(cfg, ctx) -> PipelineResult` (the registered job:
baselines, teacher, student, report) and `run_inputs(cfg, inputs, log) ->
list[AgentTrajectory]` (run the agent on a few inputs and show its steps). A pack's stages
are in the agent pipeline before its code runs (`declare`).

Each pack's report is a typed record with one reader: `read_report(run, pack)` calls the
reader its declaration names (`PackReport`; a pack module of the older form offers
`read_report(run)` and `REPORT_JSON` itself), and `report_packs(run)` says which packs'
reports a run holds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workbench import registry
from workbench.agent_packs.pack import AgentPack, declaration
from workbench.agent_packs.pack import names as registered_packs
from workbench.agent_packs.reports import agent_folder
from workbench.errors import ConfigError, WorkbenchError
from workbench.plugins import load


def conditions(ac, known: tuple[str, ...]) -> list[str]:
    """The configured conditions, checked against what the pack knows (default: all)."""
    wanted = list(ac.conditions or known)
    bad = [c for c in wanted if c not in known]
    if bad:
        raise ConfigError([f"agent.conditions: {', '.join(map(repr, bad))} not known to pack "
                           f"{ac.pack!r} (known: {', '.join(known)})"])
    return wanted


def pack_names() -> list[str]:
    return registered_packs()


def declare(pack: AgentPack) -> None:
    """Put the pack's stages into the agent pipeline, if they are not there yet (a pack
    registered or installed after the pipeline was built), so its stage runner, layout and
    report find them."""
    spec = registry.get("agent")
    have = {s.name: s for s in spec.stages}
    if all(have.get(s.name) == s for s in pack.stages):
        return
    mine = {s.name for s in pack.stages}
    registry.register(dataclasses.replace(
        spec, stages=(*(s for s in spec.stages if s.name not in mine), *pack.stages)),
        replace=True)


def pack_module(name: str) -> Any:
    """The module of the pack registered under `name`, its stages declared."""
    pack = declaration(name)
    declare(pack)
    return pack.module()


def _check_pack_options(ac) -> None:
    """Options that only some packs read (their declarations' `reads`), refused for the
    others in one line."""
    reads = declaration(ac.pack).reads
    if ac.adapters and "adapters" not in reads:
        raise ConfigError([f"agent.adapters: pack {ac.pack!r} has no adapter "
                           "conditions (litsearch has; kgv trains its own: agent_sft)"])
    if ac.index is not None and "index" not in reads:
        raise ConfigError([f"agent.index: pack {ac.pack!r} searches its own data; a "
                           "prebuilt index is evidence for kgv only"])


def run(cfg, ctx):
    """The registered job: evaluate the configured pack end to end."""
    _check_pack_options(cfg.agent)
    return pack_module(cfg.agent.pack).evaluate(cfg, ctx)


def run_inputs(cfg, inputs: list[str], log=print):
    _check_pack_options(cfg.agent)
    return pack_module(cfg.agent.pack).run_inputs(cfg, inputs, log=log)


def report_module(pack: str) -> Any:
    """A pack's `REPORT_JSON` (the report's file in the agent folder) and `read_report(run)`:
    from its declaration (`PackReport`), else from its module (the older form)."""
    decl = declaration(pack)
    if decl.report is not None:
        declare(decl)
        return SimpleNamespace(
            REPORT_JSON=registry.get("agent").artifact(decl.report.artifact).path,
            read_report=load(decl.report.reader, what=f"agent pack {pack!r}'s report reader"))
    mod = pack_module(pack)
    if not hasattr(mod, "read_report") or not hasattr(mod, "REPORT_JSON"):
        raise WorkbenchError(f"agent pack {pack!r} has no report reader (its module offers "
                             "no read_report and REPORT_JSON)")
    return mod


def report_record(pack: str) -> Any:
    """The record type of a pack's report (a declared pack's `PackReport.record`)."""
    decl = declaration(pack)
    if decl.report is None:
        raise WorkbenchError(f"agent pack {pack!r} declares no report record")
    return load(decl.report.record, what=f"agent pack {pack!r}'s report record")


def report_path(run, pack: str) -> Path:
    """Where a pack's report JSON lies in a run (a run folder or its `RunLayout`)."""
    return agent_folder(run) / report_module(pack).REPORT_JSON


def read_report(run, pack: str) -> Any:
    """A pack's report of a run (a run folder, its `RunLayout`, or the report file) as the
    pack's typed record (`KgvReport`, `RfReport`, `LitsearchReport`). A missing, broken or
    foreign file is a DataError of one line naming it."""
    return report_module(pack).read_report(run)


def report_packs(run) -> list[str]:
    """The packs whose report the run's agent folder holds (by file name, not yet read: a
    broken one is listed, and its reader says what is wrong); every registered pack that
    declares its report, by name."""
    import os

    folder = agent_folder(run)
    out = []
    for p in registered_packs():
        try:
            decl = declaration(p)
        except WorkbenchError:
            continue  # a pack that cannot be loaded wrote no report here
        if decl.report is not None and os.path.lexists(folder / report_module(p).REPORT_JSON):
            out.append(p)
    return out
