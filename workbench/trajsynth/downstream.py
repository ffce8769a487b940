"""The downstream check: does the synthesised data make a small data agent better?

On held-out tasks (unseen templates or tables), a one-step agent gets the schema digest and
the question, may call `run_sql` once, and is scored on execution accuracy (the statement's
result passes the task's answer check). Three conditions, same model, same tasks:

- `zero_shot`: the bundled model as it is;
- `icl`: k demonstrations retrieved from the ICL bank's index by the question;
- `sft`: the model after LoRA SFT on the exported trajectories (through the train library);
- `sft_dpo`: that SFT adapter then trained by DPO on the exported preference pairs (a verified
  path's call against its failed sibling's), the SFT adapter as the reference.

Each accuracy goes out with its Wilson interval, the outcome distribution behind it (a
verified result, a wrong result, an SQL error, no statement at all) and McNemar's exact test
of every condition against zero-shot (and of `sft_dpo` against `sft`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workbench.records import ChatExample
from workbench.trajsynth.env import DataEnvironment
from workbench.trajsynth.export import RUN_SQL_TOOL, SYSTEM
from workbench.trajsynth.generators import extract_sql
from workbench.trajsynth.pool import Task


class DownstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    conditions: list[str] = Field(default_factory=lambda: ["zero_shot", "icl", "sft"])
    k: int = Field(3, ge=1, description="icl: demonstrations per question.")
    max_tokens: int = Field(160, ge=16)
    max_tasks: int | None = Field(None, ge=1)
    sft_steps: int = Field(60, ge=1, description="sft: LoRA optimizer steps.")
    sft_learning_rate: float = Field(1e-3, gt=0)
    sft_rank: int = Field(16, ge=1)
    sft_max_length: int = Field(1536, ge=64)
    dpo_steps: int = Field(30, ge=1, description="sft_dpo: DPO optimizer steps after SFT.")
    dpo_learning_rate: float = Field(5e-5, gt=0)
    dpo_beta: float = Field(0.1, gt=0)
    seed: int = 0


def _messages(digest: str, question: str, demos: list[str]) -> list[dict[str, Any]]:
    user = digest
    if demos:
        user += "\n\nSolved examples:\n\n" + "\n\n".join(demos)
    user += f"\n\nQuestion: {question}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def agent_statement(model, digest: str, question: str, demos: list[str], max_tokens: int
                    ) -> str | None:
    """The statement the agent runs: its `run_sql` call, else SQL in its text."""
    from workbench.models.base import GenerationParams

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
    from workbench.progress import progress

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


def sft_adapter(examples: list[ChatExample], out: Path, cfg: DownstreamConfig,
                model_spec: str = "default", log=print) -> Path:
    """LoRA SFT on the exported conversations through the train library; the adapter folder."""
    from workbench.train.config import TrainConfig
    from workbench.train.session import export, setup, train_steps

    tc = TrainConfig(max_steps=cfg.sft_steps, learning_rate=cfg.sft_learning_rate,
                     # 4 packed rows a step, one at a time: the same step, a quarter of
                     # the peak memory (attention over 1.5k-token rows is most of it)
                     max_length=cfg.sft_max_length, batch_size=1, grad_accum=4,
                     eval_fraction=0.0,
                     lora={"r": cfg.sft_rank, "alpha": 2 * cfg.sft_rank}, device="cpu",
                     warmup_ratio=0.1)
    session = setup(tc, seed=cfg.seed, model_spec=model_spec, examples=examples)
    rows = train_steps(session, session.total)
    log(f"sft: {session.total} steps on {len(examples)} trajectories, loss "
        f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}")
    export(session, out)
    return out


def dpo_adapter(pairs: list, init: Path, out: Path, cfg: DownstreamConfig,
                model_spec: str = "default", log=print) -> Path:
    """DPO from the SFT adapter `init` (also the reference) on the exported pairs."""
    from workbench.train.config import TrainConfig
    from workbench.train.session import export, setup, train_steps

    tc = TrainConfig(method="dpo", init_adapter=str(init), max_steps=cfg.dpo_steps,
                     learning_rate=cfg.dpo_learning_rate, dpo={"beta": cfg.dpo_beta},
                     max_length=cfg.sft_max_length, batch_size=1, grad_accum=2,
                     eval_fraction=0.0, lora={"r": cfg.sft_rank, "alpha": 2 * cfg.sft_rank},
                     device="cpu", warmup_ratio=0.1)
    session = setup(tc, seed=cfg.seed, model_spec=model_spec, pairs=pairs,
                    reference_cache=out.parent / "dpo_reference_cache.jsonl")
    rows = train_steps(session, session.total)
    log(f"sft_dpo: {session.total} DPO steps on {len(pairs)} pairs, loss "
        f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}")
    export(session, out)
    return out


def run_downstream(env: DataEnvironment, held_out: list[Task], out: str | Path,
                   cfg: DownstreamConfig, *, model_spec: str = "default", log=print
                   ) -> dict[str, Any]:
    """Score the conditions on the held-out tasks; write downstream.json next to the
    exports (`out` holds sft.messages.jsonl and icl_index/)."""
    from workbench import services
    from workbench.evaluate.stats import mcnemar_exact
    from workbench.io import atomic_write_json, read_jsonl
    from workbench.models import load_model

    out = Path(out)
    tasks = held_out[:cfg.max_tasks] if cfg.max_tasks else held_out
    per: dict[str, list[dict[str, Any]]] = {}
    base = None
    if {"zero_shot", "icl"} & set(cfg.conditions):
        base = load_model(model_spec)
    if "zero_shot" in cfg.conditions:
        per["zero_shot"] = score(base, env, tasks, max_tokens=cfg.max_tokens)
    if "icl" in cfg.conditions:
        query = services.query_index()
        index = out / "icl_index"

        def demos(question: str) -> list[str]:
            hits = query(index, question, retriever="hybrid", k=cfg.k)
            return [h.text for h in hits]

        per["icl"] = score(base, env, tasks, demos_for=demos, max_tokens=cfg.max_tokens)
    notes: dict[str, str] = {}
    if {"sft", "sft_dpo"} & set(cfg.conditions):
        examples = read_jsonl(out / "sft.messages.jsonl", ChatExample.model_validate)
        adapter = sft_adapter(examples, out / "sft_adapter", cfg, model_spec, log=log)
        if "sft" in cfg.conditions:
            tuned = load_model(model_spec, adapter=str(adapter))
            per["sft"] = score(tuned, env, tasks, max_tokens=cfg.max_tokens)
        if "sft_dpo" in cfg.conditions:
            from workbench.formats import read_preferences

            path = out / "preferences.jsonl"
            pairs = read_preferences(path) if path.exists() and path.stat().st_size else []
            if pairs:
                dpo = dpo_adapter(pairs, adapter, out / "sft_dpo_adapter", cfg, model_spec,
                                  log=log)
                per["sft_dpo"] = score(load_model(model_spec, adapter=str(dpo)), env, tasks,
                                       max_tokens=cfg.max_tokens)
            else:
                notes["sft_dpo"] = "no preference pairs were exported: not run"
                log(f"sft_dpo: {notes['sft_dpo']}")
    result: dict[str, Any] = {"tasks": len(tasks), "conditions": {}, "notes": notes}
    for name, rows in per.items():
        s = summary(rows)
        if name != "zero_shot" and "zero_shot" in per:
            s["mcnemar_p_vs_zero_shot"] = mcnemar_exact(
                [r["verified"] for r in per["zero_shot"]], [r["verified"] for r in rows])
        if name == "sft_dpo" and "sft" in per:
            s["mcnemar_p_vs_sft"] = mcnemar_exact(
                [r["verified"] for r in per["sft"]], [r["verified"] for r in rows])
        s["rows"] = rows
        result["conditions"][name] = s
    atomic_write_json(out / "downstream.json", result)
    return result


def format_downstream(result: dict[str, Any]) -> str:
    lines = [f"held-out tasks: {result['tasks']}"]
    for name, s in result["conditions"].items():
        lo, hi = s["ci95"]
        p = s.get("mcnemar_p_vs_zero_shot")
        q = s.get("mcnemar_p_vs_sft")
        lines.append(f"  {name:9s} {s['verified']}/{s['n']} = {100 * s['accuracy']:.1f}% "
                     f"[{100 * lo:.1f}, {100 * hi:.1f}]  outcomes {s['outcomes']}"
                     + (f"  McNemar p vs zero-shot {p:.3g}" if p is not None else "")
                     + (f", vs sft {q:.3g}" if q is not None else ""))
    for name, note in result.get("notes", {}).items():
        lines.append(f"  {name:9s} {note}")
    return "\n".join(lines)
