"""The downstream check: does the synthesised data make a small data agent better?

On held-out tasks (unseen templates or tables), a one-step agent gets the schema digest and
the question, may call `run_sql` once, and is scored on execution accuracy (the statement's
result passes the task's answer check). Four conditions, same model, same tasks:

- `zero_shot`: the bundled model as it is;
- `icl`: k demonstrations retrieved from the ICL bank's index by the question;
- `sft`: the model after LoRA SFT on the exported trajectories (through the train library);
- `sft_dpo`: that SFT adapter then trained by DPO, the SFT adapter as the reference, on the
  run's pairs: the exported `preferences.jsonl` (a verified path's call against its failed
  sibling's) or step-level pairs made from the SFT trajectories (`dpo_pairs: steps`).

Each accuracy goes out with its Wilson interval, the outcome distribution behind it (a
verified result, a wrong result, an SQL error, no statement at all) and McNemar's exact test
of every condition against zero-shot (and of `sft_dpo` against `sft`), in `downstream.json`
(a `DownstreamReport`).

Every step is a stage of the trajsynth pipeline (`StageRunner`, declared in its spec): the
SFT adapter (`sft_adapter`), the DPO adapter (`dpo_adapter`), each condition's scored
rows (`downstream` per condition) and the report; a re-run skips what is done and unchanged.
The stages are recorded in the run's stages.json when the folder is `<run>/trajsynth`, else in
the folder's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

import workbench.models  # by module: tests count its loads and sessions
import workbench.train.session
from workbench import registry
from workbench.dataenv.env import DataEnvironment
from workbench.datatasks.generators import extract_sql
from workbench.datatasks.pool import Task
from workbench.errors import ConfigError
from workbench.formats import read_preferences
from workbench.io import atomic_write_text, read_jsonl, write_jsonl
from workbench.models.base import GenerationParams
from workbench.progress import progress
from workbench.records import ChatExample, StrictModel
from workbench.runs import RunLayout, StageRunner, file_hash, outputs_at
from workbench.text import p_value, percent_interval
from workbench.train.config import TrainConfig
from workbench.train.session import export, train_steps
from workbench.train.steppairs import step_pairs
from workbench.trajsynth.downstream_report import DownstreamReport
from workbench.trajsynth.export import RUN_SQL_TOOL, SYSTEM

CONDITIONS = ("zero_shot", "icl", "sft", "sft_dpo")


class DownstreamConfig(StrictModel):
    model_config = ConfigDict(frozen=True)

    conditions: list[str] = Field(
        default_factory=lambda: ["zero_shot", "icl", "sft"], description=(
            "What to score: zero_shot, icl, sft, sft_dpo. sft_dpo (the SFT adapter, then DPO "
            "on the run's pairs, scored on the same tasks and compared with sft by McNemar's "
            "exact test) is off by default: its reference pass and DPO steps over "
            "trajectory pairs of up to sft_max_length tokens a side add about as much CPU "
            "time as the SFT itself (tens of minutes with the bundled model on 2 cores); "
            "name it to run it."))
    k: int = Field(3, ge=1, description="icl: demonstrations per question.")
    max_tokens: int = Field(160, ge=16)
    max_tasks: int | None = Field(None, ge=1)
    sft_steps: int = Field(60, ge=1, description="sft: LoRA optimizer steps.")
    sft_learning_rate: float = Field(1e-3, gt=0)
    sft_rank: int = Field(16, ge=1)
    sft_max_length: int = Field(2048, ge=64, description=(
        "Longest conversation or preference side trained, in tokens; a longer one is "
        "refused before step 0, naming it. The demo's longest trajectory is ~1,600."))
    dpo_steps: int = Field(30, ge=1, description="sft_dpo: DPO optimizer steps after SFT.")
    dpo_learning_rate: float = Field(5e-5, gt=0)
    dpo_beta: float = Field(0.1, gt=0)
    dpo_pairs: Literal["preferences", "steps"] = Field("preferences", description=(
        "sft_dpo's pairs: preferences: the run's preferences.jsonl (a verified path's call "
        "against its failed sibling's); steps: step-level pairs made from its SFT "
        "trajectories (workbench.train.steppairs: at each run_sql call, a wrong call that "
        "still fits the tool's schema), written to step_pairs.jsonl."))
    seed: int = 0

    @field_validator("conditions")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [c for c in v if c not in CONDITIONS]
        if bad:
            raise ValueError(f"unknown condition(s) {', '.join(map(repr, bad))} (known: "
                             f"{', '.join(CONDITIONS)})")
        return v

    @classmethod
    def checked(cls, **settings) -> DownstreamConfig:
        """The config from `settings`; what does not fit is one ConfigError naming each
        setting (the CLI's options)."""
        from pydantic import ValidationError

        try:
            return cls(**settings)
        except ValidationError as e:
            raise ConfigError([f"{'.'.join(map(str, x['loc']))}: {x['msg']}"
                               for x in e.errors()]) from None


def _messages(digest: str, question: str, demos: list[str]) -> list[dict[str, Any]]:
    user = digest
    if demos:
        user += "\n\nSolved examples:\n\n" + "\n\n".join(demos)
    user += f"\n\nQuestion: {question}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def agent_statement(model, digest: str, question: str, demos: list[str], max_tokens: int
                    ) -> str | None:
    """The statement the agent runs: its `run_sql` call, else SQL in its text."""
    gen = model.generate([_messages(digest, question, demos)],
                         GenerationParams(max_tokens=max_tokens, temperature=0.0),
                         tools=[RUN_SQL_TOOL])[0]
    for call in gen.tool_calls or ():
        args = call.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {}
        if isinstance(args, dict) and isinstance(args.get("sql"), str) and args["sql"].strip():
            return args["sql"].strip()
    return extract_sql(gen.text or "")


def score(model, env: DataEnvironment, tasks: list[Task], *, demos_for=None,
          max_tokens: int = 160) -> list[dict[str, Any]]:
    """One row per task: the statement, the outcome, whether it was verified."""
    digest = env.profile.digest(max_values=6)
    rows = []
    for t in progress(tasks, desc="agent"):
        demos = demos_for(t.question) if demos_for else []
        sql = agent_statement(model, digest, t.question, demos, max_tokens)
        if not sql:
            rows.append({"task": t.id, "sql": None, "outcome": "no_sql", "verified": False})
            continue
        r = env.run_sql(sql)
        ok = r.ok and t.check(r)
        rows.append({"task": t.id, "sql": sql, "verified": ok,
                     "outcome": "verified" if ok else ("wrong" if r.ok else "error")})
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from collections import Counter

    from workbench.evaluate.stats import wilson_interval

    n = len(rows)
    k = sum(r["verified"] for r in rows)
    lo, hi = wilson_interval(k, n)
    return {"n": n, "verified": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi],
            "outcomes": dict(Counter(r["outcome"] for r in rows))}


def _info(method: str, out: Path, n: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the report says of a trained adapter (`DownstreamAdapter`)."""
    info = {"method": method, "adapter": out.name, "examples": n, "steps": len(rows),
            "first_loss": rows[0]["loss"] if rows else None,
            "last_loss": rows[-1]["loss"] if rows else None}
    if method == "dpo" and rows:
        info |= {k: rows[-1].get(k) for k in ("reward_accuracy", "reward_margin")}
    return info


def _steps(session, desc: str) -> list[dict[str, Any]]:
    """Every step of the session's schedule, counted on the terminal or in the log."""
    return [row for _ in progress(range(session.total), desc, unit="step")
            for row in train_steps(session, 1)]


def sft_adapter(examples: list[ChatExample], out: Path, cfg: DownstreamConfig,
                model_spec: str = "default", log=print) -> dict[str, Any]:
    """LoRA SFT on the exported conversations through the train library into the adapter
    folder `out`; what the report says of it."""
    tc = TrainConfig(max_steps=cfg.sft_steps, learning_rate=cfg.sft_learning_rate,
                     # 4 packed rows a step, one at a time: the same step, a quarter of
                     # the peak memory (attention over 1.5k-token rows is most of it)
                     max_length=cfg.sft_max_length, batch_size=1, grad_accum=4,
                     eval_fraction=0.0,
                     lora={"r": cfg.sft_rank, "alpha": 2 * cfg.sft_rank}, device="cpu",
                     warmup_ratio=0.1)
    session = workbench.train.session.setup(tc, seed=cfg.seed, model_spec=model_spec,
                                            examples=examples)
    rows = _steps(session, "sft steps")
    log(f"sft: {session.total} steps on {len(examples)} trajectories, loss "
        f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}")
    export(session, out)
    return _info("sft", out, len(examples), rows)


def dpo_adapter(pairs: list, init: Path, out: Path, cfg: DownstreamConfig,
                model_spec: str = "default", log=print) -> dict[str, Any]:
    """DPO from the SFT adapter `init` (also the reference) on `pairs` into the adapter
    folder `out`; what the report says of it. The reference log-probabilities are cached
    next to `out` (dpo_reference_cache.jsonl, keyed by the reference's weights)."""
    tc = TrainConfig(method="dpo", init_adapter=str(init), max_steps=cfg.dpo_steps,
                     learning_rate=cfg.dpo_learning_rate, dpo={"beta": cfg.dpo_beta},
                     max_length=cfg.sft_max_length, batch_size=1, grad_accum=2,
                     eval_fraction=0.0, lora={"r": cfg.sft_rank, "alpha": 2 * cfg.sft_rank},
                     device="cpu", warmup_ratio=0.1)
    session = workbench.train.session.setup(
        tc, seed=cfg.seed, model_spec=model_spec, pairs=pairs,
        reference_cache=outputs_at("trajsynth", out.parent).path("dpo_reference_cache"))
    rows = _steps(session, "dpo steps")
    log(f"sft_dpo: {session.total} DPO steps on {len(pairs)} pairs, loss "
        f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}")
    export(session, out)
    return {**_info("dpo", out, len(pairs), rows), "init_adapter": init.name,
            "source": cfg.dpo_pairs}


@dataclass(frozen=True)
class _OwnFolder(RunLayout):
    """The layout of a trajsynth folder outside a run folder: the folder is the pipeline's
    folder and holds its own stages.json."""

    def folder(self, pipeline: str) -> Path:
        return self.root


def downstream_stages(out: str | Path, *, log=print, fresh: bool = False) -> StageRunner:
    """The stage runner of the downstream check in the trajsynth folder `out`: the run's
    (stages.json of `<run>`) when `out` is `<run>/trajsynth`, else `out`'s own."""
    out = Path(out)
    layout = RunLayout.at(out.parent) if out.name == registry.get("trajsynth").subfolder \
        else _OwnFolder(out)
    return StageRunner(layout, "trajsynth", log=log, fresh=fresh)


class _Models:
    """The base model, loaded once and only when a condition is scored."""

    def __init__(self, spec: str):
        self.spec, self._base = spec, None

    def base(self):
        if self._base is None:
            self._base = workbench.models.load_model(self.spec)
        return self._base

    def tuned(self, adapter: Path):
        return workbench.models.load_model(self.spec, adapter=str(adapter))


def _pairs(out: Path, cfg: DownstreamConfig) -> tuple[list, str | None, str | None]:
    """sft_dpo's pairs, the hash of the file they come from, and a note when there are
    none: the exported preferences, or step-level pairs from the SFT trajectories."""
    if cfg.dpo_pairs == "preferences":
        path = outputs_at("trajsynth", out).path("preferences")
        pairs = read_preferences(path) if path.is_file() and path.stat().st_size else []
        return pairs, file_hash(path), None if pairs else \
            "no preference pairs were exported: not run"

    path = outputs_at("trajsynth", out).path("sft")
    examples = read_jsonl(path, ChatExample.model_validate) if path.is_file() else []
    pairs, _ = step_pairs(examples, seed=cfg.seed)
    return pairs, file_hash(path), None if pairs else \
        "no step-level pairs could be made from sft.messages.jsonl: not run"


def _adapters(out: Path, cfg: DownstreamConfig, model_spec: str, stages: StageRunner,
              log) -> tuple[dict[str, Path], dict[str, dict], dict[str, str]]:
    """The adapters the conditions need, each trained as its stage (skipped when done):
    ({condition: adapter folder}, {condition: training info}, {condition: note})."""
    wanted = set(cfg.conditions)
    notes: dict[str, str] = {}
    pairs: list = []
    source: str | None = None
    if "sft_dpo" in wanted:
        pairs, source, note = _pairs(out, cfg)
        if note:
            notes["sft_dpo"] = note
            log(f"sft_dpo: {note}")
        elif "sft" not in wanted:
            log("sft_dpo without sft in the conditions: no McNemar test against sft")
    if "sft" not in wanted and not pairs:
        return {}, {}, notes  # nothing needs the SFT adapter
    files = outputs_at("trajsynth", out)
    data, sft = files.path("sft"), files.path("sft_adapter").parent
    sft_settings = (cfg.sft_steps, cfg.sft_learning_rate, cfg.sft_rank, cfg.sft_max_length,
                    cfg.seed, model_spec)
    rec, _ = stages.run("sft_adapter", (file_hash(data), sft_settings), lambda: sft_adapter(
        read_jsonl(data, ChatExample.model_validate), sft, cfg, model_spec, log=log))
    folders, infos = {"sft": sft}, {"sft": dict(rec.info)}
    if pairs:
        dpo = files.path("sft_dpo_adapter").parent

        def train() -> dict[str, Any]:
            if cfg.dpo_pairs == "steps":
                write_jsonl(files.path("step_pairs"), pairs)
            return dpo_adapter(pairs, sft, dpo, cfg, model_spec, log=log)

        rec, _ = stages.run("dpo_adapter", (
            cfg.dpo_pairs, source, file_hash(sft / "adapter_model.safetensors"),
            cfg.dpo_steps, cfg.dpo_learning_rate, cfg.dpo_beta, sft_settings), train)
        folders["sft_dpo"], infos["sft_dpo"] = dpo, dict(rec.info)
    return folders, infos, notes


def run_downstream(env: DataEnvironment, held_out: list[Task], out: str | Path,
                   cfg: DownstreamConfig, *, model_spec: str = "default", log=print,
                   stages: StageRunner | None = None) -> dict[str, Any]:
    """Score the conditions on the held-out tasks; write downstream.json next to the
    exports (`out` holds sft.messages.jsonl, preferences.jsonl and icl_index/). Each
    adapter, each condition's rows and the report are stages (`stages`, default
    `downstream_stages(out)`): a re-run skips what is done. Returns the report as a dict."""
    from workbench.retrieval.search import query_index

    out = Path(out)
    files = outputs_at("trajsynth", out)
    stages = stages or downstream_stages(out, log=log)
    tasks = held_out[:cfg.max_tasks] if cfg.max_tasks else held_out
    key = (env.profile.content_hash, [(t.id, t.question) for t in tasks], cfg.max_tokens,
           model_spec)
    models = _Models(model_spec)
    folders, infos, notes = _adapters(out, cfg, model_spec, stages, log)

    def icl_demos():
        index = files.path("icl_index")
        return lambda q: [h.text for h in query_index(index, q, retriever="hybrid", k=cfg.k)]

    # condition: (what its rows depend on besides the tasks, how to score it)
    scorers: dict[str, tuple[tuple, Callable[[], list[dict[str, Any]]]]] = {
        "zero_shot": ((), lambda: score(models.base(), env, tasks, max_tokens=cfg.max_tokens)),
        "icl": ((cfg.k, file_hash(files.path("icl_bank"))), lambda: score(
            models.base(), env, tasks, demos_for=icl_demos(), max_tokens=cfg.max_tokens))}

    def tuned(folder: Path) -> Callable[[], list[dict[str, Any]]]:
        return lambda: score(models.tuned(folder), env, tasks, max_tokens=cfg.max_tokens)

    for name, folder in folders.items():
        scorers[name] = ((file_hash(folder / "adapter_model.safetensors"),), tuned(folder))
    per: dict[str, list[dict[str, Any]]] = {}
    for name in [c for c in CONDITIONS if c in cfg.conditions and c in scorers]:
        extra, fn = scorers[name]
        path = files.path("downstream", name)

        def go(fn=fn, path=path) -> dict[str, Any]:
            rows = fn()
            write_jsonl(path, rows)
            return {"verified": sum(r["verified"] for r in rows), "n": len(rows)}

        stages.run("downstream", (key, *extra), go, part=name)
        per[name] = read_jsonl(path)
    return _report(out, len(tasks), per, infos, notes, stages)


def _report(out: Path, n: int, per: dict[str, list[dict[str, Any]]], infos: dict,
            notes: dict[str, str], stages: StageRunner) -> dict[str, Any]:
    """downstream.json (its stage) from the conditions' rows: each summed up, McNemar against
    zero-shot and (sft_dpo) against sft; returns it as a dict."""
    from workbench.evaluate.stats import mcnemar_exact

    conditions = {}
    for name, rows in per.items():
        s = summary(rows)
        if name != "zero_shot" and "zero_shot" in per:
            s["mcnemar_p_vs_zero_shot"] = mcnemar_exact(
                [r["verified"] for r in per["zero_shot"]], [r["verified"] for r in rows])
        if name == "sft_dpo" and "sft" in per:
            s["mcnemar_p_vs_sft"] = mcnemar_exact(
                [r["verified"] for r in per["sft"]], [r["verified"] for r in rows])
        conditions[name] = s | {"rows": rows}
    report = DownstreamReport(tasks=n, conditions=conditions, notes=notes,
                              adapters=infos or None)
    text = json.dumps(report.model_dump(mode="json"), indent=1) + "\n"
    files = outputs_at("trajsynth", out)
    inputs = (n, {c: file_hash(files.path("downstream", c)) for c in per}, notes, infos)
    stages.run("downstream_report", inputs, lambda: atomic_write_text(
        files.path("downstream_report"), text))
    return json.loads(text)


def format_downstream(result: dict[str, Any] | DownstreamReport) -> str:
    """The report in lines: each condition's verified rate with its interval, outcomes and
    McNemar tests; the adapters trained; the conditions not run."""
    r = result if isinstance(result, DownstreamReport) else \
        DownstreamReport.model_validate(result)
    lines = [f"held-out tasks: {r.tasks}"]
    for name, s in r.conditions.items():
        lo, hi = s.ci95
        p, q = s.mcnemar_p_vs_zero_shot, s.mcnemar_p_vs_sft
        lines.append(f"  {name:9s} {s.verified}/{s.n} = {percent_interval(s.accuracy, lo, hi)}"
                     f"  outcomes {s.outcomes}"
                     + (f"  McNemar p vs zero-shot {p_value(p)}" if p is not None else "")
                     + (f", vs sft {p_value(q)}" if q is not None else ""))
    for name, a in (r.adapters or {}).items():
        start = f" from {a.init_adapter} (its reference)" if a.init_adapter else ""
        what = f"{a.source} pairs" if a.method == "dpo" else "trajectories"
        loss = "" if a.first_loss is None else f", loss {a.first_loss:.3f} -> {a.last_loss:.3f}"
        lines.append(f"  {name:9s} adapter {a.adapter}/: {a.method.upper()}{start}, "
                     f"{a.steps} steps on {a.examples} {what}{loss}")
    for name, note in r.notes.items():
        lines.append(f"  {name:9s} {note}")
    return "\n".join(lines)
