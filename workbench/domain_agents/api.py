"""Entry points of the domain-agent pipeline: one call per CLI command or job.

Packs plug in here by name (`PACKS`, or the entry-point group `workbench.agent_packs`): a
pack module offers `evaluate(cfg, ctx) -> PipelineResult` (the registered job: baselines,
teacher, student, report) and `run_inputs(cfg, inputs, log) -> list[AgentTrajectory]` (run
the agent on a few inputs and show its steps).
"""

from __future__ import annotations

from typing import Any

from workbench.errors import WorkbenchError

PACKS = {"kgv": "workbench.domain_agents.kgv.api", "rf": "workbench.domain_agents.rf.api",
         "litsearch": "workbench.domain_agents.litsearch.api"}


def conditions(ac, known: tuple[str, ...]) -> list[str]:
    """The configured conditions, checked against what the pack knows (default: all)."""
    from workbench.errors import ConfigError

    wanted = list(ac.conditions or known)
    bad = [c for c in wanted if c not in known]
    if bad:
        raise ConfigError([f"agent.conditions: {', '.join(map(repr, bad))} not known to pack "
                           f"{ac.pack!r} (known: {', '.join(known)})"])
    return wanted


def pack_module(name: str) -> Any:
    import importlib
    from importlib.metadata import entry_points

    found = dict(PACKS)
    for ep in entry_points(group="workbench.agent_packs"):
        found.setdefault(ep.name, ep.value)
    if name not in found:
        raise WorkbenchError(f"unknown agent pack {name!r} (available: "
                             f"{', '.join(sorted(found))})")
    return importlib.import_module(found[name])


def run(cfg, ctx):
    """The registered job: evaluate the configured pack end to end."""
    if cfg.agent.adapters and cfg.agent.pack != "litsearch":
        from workbench.errors import ConfigError

        raise ConfigError([f"agent.adapters: pack {cfg.agent.pack!r} has no adapter "
                           "conditions (litsearch has; kgv trains its own: agent_sft)"])
    return pack_module(cfg.agent.pack).evaluate(cfg, ctx)


def run_inputs(cfg, inputs: list[str], log=print):
    return pack_module(cfg.agent.pack).run_inputs(cfg, inputs, log=log)
