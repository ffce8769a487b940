"""The federated experiment as a registered pipeline: split one QTSA dataset into sites, run
FedAvg-LoRA rounds (in process, through the same Flower apps a deployment runs), train the
local-only and centralised baselines at equal total steps, evaluate every adapter where each
site's data is, and write the report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.federated.config import FederatedConfig
from workbench.federated.flower_app import client_app
from workbench.federated.report import write_report
from workbench.federated.server import FedServer
from workbench.federated.sites import SiteData, load_site, site_folders, split_sites
from workbench.federated.task import evaluate, local_train
from workbench.federated.weights import GlobalStore, State, state_hash
from workbench.federated.wire import WireAudit
from workbench.io import atomic_path, atomic_write_json, write_jsonl
from workbench.registry import PipelineResult
from workbench.runs import outputs_at


def _save(path: Path, state: State) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file(state, str(tmp))


def _load(path: Path) -> State:
    from safetensors.numpy import load_file

    return load_file(str(path))


def pooled(sites: list[SiteData]) -> SiteData:
    return SiteData(name="pooled", folder=sites[0].folder.parent,
                    train=[e for s in sites for e in s.train],
                    eval=[e for s in sites for e in s.eval],
                    benchmark=[b for s in sites for b in s.benchmark])


def run_federated(fc: FederatedConfig, folders: list[Path], out: Path, *, log=print,
                  on_round=None) -> dict[str, Any]:
    """The rounds, in process (resumes from `out/global` when it holds saved rounds)."""
    from workbench.federated.inprocess import InProcessGrid, site_node_configs

    files = outputs_at("fed", out, under="federation")
    if files.path("summary").exists():
        prev = json.loads(files.path("summary").read_text())
        latest = GlobalStore(files.path("global")).latest()
        if prev.get("rounds") == fc.rounds and latest and latest[0] == fc.rounds \
                and prev.get("sha256") == latest[2]["sha256"] and "wire" in prev:
            return prev
    sites = [load_site(f) for f in folders]
    audit = WireAudit([c for s in sites for c in s.canaries])
    grid = InProcessGrid(client_app(), site_node_configs(folders), wire=audit)
    summary = FedServer(fc, out, log=log, on_round=on_round).run(grid)
    summary["wire"] = {"replies": audit.replies, "bytes": audit.bytes,
                       "canary_leaks": audit.leaks, "long_strings": audit.long_strings,
                       "record_names": sorted(audit.keys)}
    atomic_write_json(files.path("summary"), summary)
    return summary


def train_baselines(fc: FederatedConfig, sites: list[SiteData], initial: State, out: Path, *,
                    log=print) -> dict[str, Path]:
    """Local-only (each site alone, rounds x steps) and centralised (all rows pooled,
    rounds x steps x sites): the same optimizer steps in total as the federation. Each
    adapter file is written once; a rerun skips it."""
    steps = fc.rounds * fc.local.steps
    paths = {}
    for s in sites:
        p = outputs_at("fed", out).path("local") / f"{s.name}.safetensors"
        if not p.exists():
            t0 = time.perf_counter()
            res = local_train(s, initial, model=fc.model, local=fc.local,
                              aggregation=fc.aggregation, seed=fc.seed, rnd=0, steps=steps,
                              eval_before=False)
            _save(p, res.state)
            log(f"local-only {s.name}: {steps} steps in {time.perf_counter() - t0:.0f} s")
        paths[f"local:{s.name}"] = p
    p = outputs_at("fed", out).path("central")
    if not p.exists():
        t0 = time.perf_counter()
        res = local_train(pooled(sites), initial, model=fc.model, local=fc.local,
                          aggregation=fc.aggregation, seed=fc.seed, rnd=0,
                          steps=steps * len(sites), eval_before=False)
        _save(p, res.state)
        log(f"centralised: {steps * len(sites)} steps in {time.perf_counter() - t0:.0f} s")
    paths["central"] = p
    return paths


def evaluate_all(fc: FederatedConfig, sites: list[SiteData], adapters: dict[str, State],
                 out: Path, *, log=print) -> list[dict]:
    """Every condition on every site's held-out rows and benchmark items (rows cached in
    `out/eval.jsonl` by condition and adapter hash)."""
    cache_path = outputs_at("fed", out).path("eval")
    cache = {}
    if cache_path.exists():
        for line in cache_path.read_text().splitlines():
            try:
                r = json.loads(line)
                cache[(r["condition"], r["site"], r["sha256"])] = r
            except (json.JSONDecodeError, KeyError):
                continue
    rows = []
    for cond, state in adapters.items():
        digest = state_hash(state)
        for s in sites:
            if cond.startswith("local:") and cond != f"local:{s.name}":
                continue  # a local-only adapter is judged where it was trained
            key = (cond.split(":")[0], s.name, digest)
            if key not in cache:
                r = evaluate(s, state, model=fc.model, local=fc.local, mc=fc.mc_eval)
                cache[key] = {"condition": key[0], "site": s.name, "sha256": digest,
                              "eval_loss": r.get("eval-loss"), "n_eval": len(s.eval),
                              "mc_correct": r.get("mc_correct", []),
                              "mc_predictions": r.get("mc_predictions", [])}
                write_jsonl(cache_path, list(cache.values()))
                log(f"evaluated {key[0]} on {s.name}")
            rows.append(cache[key])
    return rows


def run(cfg, ctx):
    """The registered pipeline (`workbench fed sim -c CONFIG`)."""
    fc: FederatedConfig = cfg.federated
    out = ctx.layout.folder("fed")
    files = outputs_at("fed", out)
    if fc.track == "knowledge":
        from workbench.federated.knowledge.api import run_knowledge

        return run_knowledge(fc, ctx, out, client_app())
    t0 = time.perf_counter()
    if fc.sites_dir:
        folders = site_folders(fc.sites_dir)
    else:
        sp = fc.split
        ctx.stages("fed").run("sites", (sp.model_dump(), fc.seed), lambda: {
            "sites": len(split_sites(sp.source, files.path("sites"), sites=sp.sites, by=sp.by,
                                     eval_fraction=sp.eval_fraction, canaries=sp.canaries,
                                     seed=fc.seed))})
        folders = site_folders(files.path("sites"))
    sites = [load_site(f) for f in folders]
    if len({s.name for s in sites}) != len(sites):
        raise WorkbenchError(f"site names repeat in {[str(f) for f in folders]}")
    summary = run_federated(fc, folders, files.path("federation"), log=ctx.log)
    store = GlobalStore(files.path("global"))
    initial = store.load(0)
    final = store.latest()[1]
    adapters = {"initial": initial, "federated": final}
    if fc.baselines:
        for cond, p in train_baselines(fc, sites, initial, out, log=ctx.log).items():
            adapters[cond] = _load(p)
    rows = evaluate_all(fc, sites, adapters, out, log=ctx.log)
    report = write_report(out, fc, sites, rows, summary,
                          seconds=time.perf_counter() - t0)
    return PipelineResult(
        pipeline="fed", run_dir=str(ctx.layout.root),
        outputs={"report": str(files.path("report_md")), "global": str(files.path("global")),
                 "rounds": str(files.path("rounds"))},
        figures=report.figures.model_dump(),
        message=f"{len(sites)} sites x {fc.rounds} rounds: {report.headline}; "
                f"report {files.path('report_md')}")
