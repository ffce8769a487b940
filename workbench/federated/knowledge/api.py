"""Track B as an experiment: the data-agent sites (or `sites_dir`), federated knowledge rounds
in process (through the same Flower apps a deployment runs), each site alone (local-only,
`k_min` 1), then no units / local-only / federated units on every site's eval slice, and the
report. The Flower ClientApp, which serves both tracks, is the caller's to give
(`inprocess.client_app()`): this track's modules sit below it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.federated.config import FederatedConfig
from workbench.federated.inprocess import InProcessGrid, site_node_configs
from workbench.federated.knowledge.report import write_knowledge_report
from workbench.federated.knowledge.server import KnowledgeServer
from workbench.federated.knowledge.site import DataAgentSite, make_data_sites
from workbench.federated.knowledge.units import load_latest_kb
from workbench.federated.task import initial_state
from workbench.federated.weights import state_bytes
from workbench.federated.wire import WireAudit
from workbench.io import atomic_write_json, write_jsonl
from workbench.registry import PipelineResult
from workbench.runs import outputs_at


def knowledge_sites(fc: FederatedConfig, out: Path) -> list[Path]:
    """The experiment's data-agent sites (or `sites_dir`), with the listener marked."""
    ks = fc.knowledge
    if fc.sites_dir:
        return sorted(p for p in Path(fc.sites_dir).iterdir() if (p / "site.json").exists())
    folders = make_data_sites(outputs_at("fed", out).path("sites"), chinook_parts=ks.chinook_parts,
                              extra=ks.extra, scaffolds=ks.scaffolds, poison=ks.poison,
                              seed=fc.seed)
    for i, d in enumerate(folders):
        meta = json.loads((d / "site.json").read_text())
        meta["contribute"] = i != ks.listener
        atomic_write_json(d / "site.json", meta)
    return folders


def run_knowledge_rounds(fc: FederatedConfig, folders: list[Path], out: Path, client_app, *,
                         log=print, on_round=None) -> dict[str, Any]:
    """The knowledge rounds in process, each site's replies from `client_app` (the
    deployment's ClientApp) through an `InProcessGrid`, every reply audited on the wire."""
    canaries = [c for d in folders
                for c in json.loads((d / "site.json").read_text()).get("canaries", [])]
    audit = WireAudit(canaries)
    grid = InProcessGrid(client_app, site_node_configs(folders), wire=audit)
    summary = KnowledgeServer(fc, out, log=log, on_round=on_round).run(grid)
    summary["wire"] = {"replies": audit.replies, "bytes": audit.bytes,
                       "canary_leaks": audit.leaks, "long_strings": audit.long_strings,
                       "record_names": sorted(audit.keys), "canaries": len(canaries)}
    atomic_write_json(outputs_at("fed", out, under="federation").path("summary"), summary)
    return summary


def final_views(out: Path) -> list[dict]:
    kb = load_latest_kb(out)
    return kb.view(None) if kb else []


def evaluate_knowledge(fc: FederatedConfig, folders: list[Path], views: dict[str, Any],
                       out: Path) -> list[dict]:
    """Each site's eval slice under each condition's final units, task by task."""
    ks = fc.knowledge
    rows = []
    for d in folders:
        site = DataAgentSite(d, iterations=ks.eval_iterations, seed=fc.seed, agent=ks.agent,
                             agent_settings=ks.prompted)
        tasks = site.tasks("dev", 2 * ks.slice if ks.slice else None)[1::2]
        for cond, view in views.items():
            units = view(site.name) if callable(view) else view
            res = site.attempt(tasks, units, boost=ks.boost)
            rows.append({"condition": cond, "site": site.name, "scaffold": site.scaffold,
                         "contributes": bool(site.meta.get("contribute", True)),
                         "poison": site.poison, "units": len(units),
                         "verified": [o.verified for o in res],
                         "iterations": [o.iterations for o in res]})
    write_jsonl(outputs_at("fed", out).path("eval"), rows)
    return rows


def run_knowledge(fc: FederatedConfig, ctx, out: Path, client_app):
    """Track B experiment: federated rounds, each site alone (local-only, k_min=1), final
    evaluation of no units / local-only / federated units on every site's eval slice."""
    t0 = time.perf_counter()
    files = outputs_at("fed", out)
    folders = knowledge_sites(fc, out)
    fed = run_knowledge_rounds(fc, folders, files.path("federation"), client_app, log=ctx.log)
    local_views = {}
    solo = fc.model_copy(update={
        "knowledge": fc.knowledge.model_copy(update={"k_min": 1}),
        "guards": fc.guards.model_copy(update={"min_nodes": 1, "min_replies": 1})})
    for d in folders:
        name = json.loads((d / "site.json").read_text())["name"]
        run_knowledge_rounds(solo, [d], files.path("local") / name, client_app, log=ctx.log)
        local_views[name] = final_views(files.path("local") / name)
    fed_view = final_views(files.path("federation"))
    rows = evaluate_knowledge(fc, folders, {"none": [], "local": lambda n: local_views[n],
                                            "federated": fed_view}, out)
    adapter_bytes = None
    if fc.model:
        try:
            adapter_bytes = state_bytes(initial_state(fc.model, fc.local, fc.seed))
        except WorkbenchError:
            adapter_bytes = None
    report = write_knowledge_report(out, fc, rows, fed, adapter_bytes=adapter_bytes,
                                    seconds=time.perf_counter() - t0)
    return PipelineResult(
        pipeline="fed", run_dir=str(ctx.layout.root),
        outputs={"report": str(files.path("report_md")), "kb": str(files.path("kb"))},
        figures=report.figures.model_dump(),
        message=f"{len(folders)} sites x {fc.rounds} rounds (knowledge): {report.headline}; "
                f"report {files.path('report_md')}")
