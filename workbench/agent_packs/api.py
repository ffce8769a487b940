"""Entry points of the domain-agent pipeline: one call per CLI command or job.

Packs plug in by name through the entry-point group `workbench.agent_packs`
(`workbench.plugins`; the built-ins kgv, rf and litsearch are entries of the workbench's own): a
pack module offers `evaluate(cfg, ctx) -> PipelineResult` (the registered job: baselines,
teacher, student, report) and `run_inputs(cfg, inputs, log) -> list[AgentTrajectory]` (run
the agent on a few inputs and show its steps).

Each pack's report is a typed record with one reader: `read_report(run, pack)` dispatches to
the pack's report module (`REPORTS`; a plugin pack module offers `read_report(run)` and
`REPORT_JSON` itself), and `report_packs(run)` says which packs' reports a run holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

# the module holding each pack's report record, its file name and its reader; in the order a
# run folder holding more than one is shown by the app
REPORTS = {"kgv": "workbench.agent_packs.kgv.report",
           "litsearch": "workbench.agent_packs.litsearch.report",
           "rf": "workbench.agent_packs.rf.report"}


def conditions(ac, known: tuple[str, ...]) -> list[str]:
    """The configured conditions, checked against what the pack knows (default: all)."""
    from workbench.errors import ConfigError

    wanted = list(ac.conditions or known)
    bad = [c for c in wanted if c not in known]
    if bad:
        raise ConfigError([f"agent.conditions: {', '.join(map(repr, bad))} not known to pack "
                           f"{ac.pack!r} (known: {', '.join(known)})"])
    return wanted


def pack_names() -> list[str]:
    from workbench import plugins

    return sorted(plugins.entries(plugins.AGENT_PACKS))


def pack_module(name: str) -> Any:
    from workbench import plugins

    found = plugins.entries(plugins.AGENT_PACKS)
    if name not in found:
        raise WorkbenchError(f"unknown agent pack {name!r} (available: "
                             f"{', '.join(sorted(found))})")
    return plugins.load(found[name], what=f"agent pack {name!r}")


def _check_pack_options(ac) -> None:
    """Options that only some packs read, refused for the others in one line."""
    from workbench.errors import ConfigError

    if ac.adapters and ac.pack != "litsearch":
        raise ConfigError([f"agent.adapters: pack {ac.pack!r} has no adapter "
                           "conditions (litsearch has; kgv trains its own: agent_sft)"])
    if ac.index is not None and ac.pack != "kgv":
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
    """The module with a pack's `REPORT_JSON` and `read_report(run)`."""
    import importlib

    if pack in REPORTS:
        return importlib.import_module(REPORTS[pack])
    mod = pack_module(pack)
    if not hasattr(mod, "read_report") or not hasattr(mod, "REPORT_JSON"):
        raise WorkbenchError(f"agent pack {pack!r} has no report reader (its module offers "
                             "no read_report and REPORT_JSON)")
    return mod


def report_path(run, pack: str) -> Path:
    """Where a pack's report JSON lies in a run (a run folder or its `RunLayout`)."""
    from workbench.agent_packs.reports import agent_folder

    return agent_folder(run) / report_module(pack).REPORT_JSON


def read_report(run, pack: str) -> Any:
    """A pack's report of a run (a run folder, its `RunLayout`, or the report file) as the
    pack's typed record (`KgvReport`, `RfReport`, `LitsearchReport`). A missing, broken or
    foreign file is a DataError of one line naming it."""
    return report_module(pack).read_report(run)


def report_packs(run) -> list[str]:
    """The packs whose report the run's agent folder holds (by file name, not yet read: a
    broken one is listed, and its reader says what is wrong); built-in packs only."""
    import os

    from workbench.agent_packs.reports import agent_folder

    folder = agent_folder(run)
    return [p for p in REPORTS
            if os.path.lexists(folder / report_module(p).REPORT_JSON)]
