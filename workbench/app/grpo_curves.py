"""GRPO's live metric rows as the app's curves: finding a folder's trainings, reading their
rows, and shaping them into chart data and Vega-Lite specs. No Streamlit here: the pages draw
what these functions return (`common.show_grpo_training`), and the tests check it without a
page.

A GRPO training (`train.grpo_recipe.train_grpo`) appends one JSON row per optimizer step to
`<adapter folder>.live.jsonl` beside its adapter folder (the RF pack's `tools+grpo`:
`agent/rf_grpo.live.jsonl` and `agent/rf_grpo/`). A row holds the step's rollout statistics
(`agents.rollout.group_stats`: reward_mean, reward_std_in_group, groups_no_signal,
tool_calls_per_rollout, ...), the update's (loss, grad_norm, clip_fraction, kl when
grpo.beta > 0, distill_kl under on-policy distillation), throughput (rollout_tokens_per_s,
update_tokens_per_s) and, at held-out evaluation steps, heldout_reward and
heldout_tool_calls, with the held-out reward before the first step
(heldout_reward_start); every row says how many steps are planned (steps_planned). Once the
adapter is exported its manifest names the kept step (`outputs.adapter_step`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.io import iter_jsonl_raw
from workbench.text import number, percent

LIVE_SUFFIX = ".live.jsonl"
PACK_NAMES = {"rf": "RF design", "kgv": "KGV", "litsearch": "literature search"}
# the agent condition a stage's training stands for, where the stage's name does not say it
CONDITIONS = {"rf_grpo": "tools+grpo", "kgv_grpo": "agent_grpo"}

# chart titles and the series names of the multi-line charts
REWARD = "reward_mean"
STD = "reward_std_in_group"
HELDOUT = "heldout_reward"
KL_SERIES = {"kl": "KL to the start policy", "distill_kl": "KL to the teacher (distillation)"}
TOOL_SERIES = {"tool_calls_per_rollout": "training rollouts",
               "heldout_tool_calls": "held-out (greedy)"}
SPEED_SERIES = {"rollout_tokens_per_s": "rollouts (generation)",
                "update_tokens_per_s": "update (forward and backward)"}


# --- finding and reading ----------------------------------------------------------------------

@dataclass(frozen=True)
class GrpoTraining:
    """One GRPO training of a folder: its live file, its adapter folder (there once
    exported) and a label naming the pack and condition where the stage's name says them."""

    stage: str  # the live file's name less `.live.jsonl` (rf_grpo)
    live: Path
    label: str
    folder: Path | None = None  # the adapter folder, where it is not the live file's stage

    @property
    def adapter(self) -> Path:
        return self.folder or self.live.parent / self.stage

    @property
    def manifest(self) -> Path:
        return self.adapter / "manifest.json"


def label(stage: str) -> str:
    """rf_grpo -> "rf_grpo (RF design, tools+grpo)"; a name that is no pack's stays as it is."""
    words = [PACK_NAMES[p] for p in (stage.split("_")[0],) if p in PACK_NAMES]
    words += [CONDITIONS[stage]] if stage in CONDITIONS else []
    return f"{stage} ({', '.join(words)})" if words else stage


def find_trainings(folder: Path) -> list[GrpoTraining]:
    """Every GRPO live file of a folder (a run's `agent/` folder), by name: one whose stage
    name holds "grpo" (rf_grpo, kgv_grpo, agent_grpo; an empty one is a training that has not
    finished its first step), or any other `*.live.jsonl` whose first row is a GRPO row (an
    SFT or DPO training's live file is not)."""
    if not folder.is_dir():
        return []
    out = []
    for f in sorted(folder.glob(f"*{LIVE_SUFFIX}")):
        stage = f.name.removesuffix(LIVE_SUFFIX)
        if f.is_file() and ("grpo" in stage or is_grpo_row(_first_row(f))):
            out.append(GrpoTraining(stage, f, label(stage)))
    return out


def _first_row(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if line.strip():
                    return json.loads(line)
    except (OSError, ValueError):
        return None
    return None


def is_grpo_row(row: Any) -> bool:
    """A GRPO step's row: its rollouts' mean reward (SFT and DPO rows have a loss only)."""
    return isinstance(row, dict) and REWARD in row


def read_rows(path: Path) -> list[dict]:
    """The JSON object rows of a live file a training may be appending to (a torn last line
    skipped; a bad line elsewhere raises the DataError naming it)."""
    return [obj for _, obj in iter_jsonl_raw(path, torn_tail=lambda _e: None)
            if isinstance(obj, dict)]


def read_outputs(t: GrpoTraining, rows: list[dict]) -> dict[str, Any] | None:
    """The exported adapter's manifest outputs when they are of this training (written after
    the live file's last row, for as many steps), else None: while a training runs, the
    folder may still hold an earlier training's adapter. An unreadable manifest is None."""
    try:
        if not t.manifest.is_file() or t.manifest.stat().st_mtime < t.live.stat().st_mtime:
            return None
        outputs = json.loads(t.manifest.read_text(encoding="utf-8")).get("outputs")
    except (OSError, ValueError, AttributeError):
        return None
    return outputs if isinstance(outputs, dict) and current(outputs, rows) else None


def current(outputs: dict[str, Any], rows: list[dict]) -> bool:
    """Whether a manifest's outputs are of the training whose rows these are: as many steps."""
    steps = [r["step"] for r in by_step(rows)]
    return bool(steps) and outputs.get("steps") == steps[-1]


# --- shaping ----------------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    """A finite number, or None (a missing value, NaN, a flag, a string)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def by_step(rows: list[dict]) -> list[dict]:
    """The GRPO rows in step order, one per step (the last written wins: a resumed training
    rewrites its file from its checkpoint's rows); a row without a step is numbered by its
    place."""
    out: dict[int, dict] = {}
    for i, r in enumerate(rows):
        if not is_grpo_row(r):
            continue
        s = r.get("step", i + 1)
        if isinstance(s, int) and not isinstance(s, bool):
            out[s] = {**r, "step": s}
    return [out[s] for s in sorted(out)]


def series(rows: list[dict], key: str) -> list[dict]:
    """One metric by step: [{"step", key}] where the row measures it."""
    return [{"step": r["step"], key: v} for r in by_step(rows)
            if (v := _num(r.get(key))) is not None]


def long_series(rows: list[dict], names: dict[str, str]) -> list[dict]:
    """Several metrics by step in long form, [{"step", "value", "series"}] (a chart draws one
    line per series); a metric no row measures is left out."""
    return [{"step": r["step"], "value": v, "series": name} for key, name in names.items()
            for r in by_step(rows) if (v := _num(r.get(key))) is not None]


def reward_band(rows: list[dict]) -> list[dict]:
    """The training rollouts' mean reward by step with the band of one within-group
    standard deviation either side ([{"step", "reward_mean", "low", "high"}])."""
    out = []
    for r in by_step(rows):
        mean, std = _num(r.get(REWARD)), _num(r.get(STD))
        if mean is None:
            continue
        std = std or 0.0
        out.append({"step": r["step"], REWARD: mean, STD: std,
                    "low": mean - std, "high": mean + std})
    return out


@dataclass(frozen=True)
class Kept:
    """The adapter the training keeps: `step` (0: the starting adapter) and its held-out
    reward; `final` once the adapter is exported (the manifest's), else the best so far."""

    step: int | None
    reward: float | None
    final: bool


def kept(rows: list[dict], outputs: dict[str, Any] | None = None) -> Kept:
    """The exported adapter's step (the manifest's `adapter_step`), or while training the
    first evaluated step with the highest held-out reward so far (as `grpo.keep_best` picks:
    a later tie does not replace it); the start (step 0) counts first, so a start that
    stays the best is the one kept."""
    ev = series(rows, HELDOUT)
    if outputs is not None and isinstance(outputs.get("adapter_step"), int):
        step = outputs["adapter_step"]
        at = [p[HELDOUT] for p in ev if p["step"] == step]
        reward = at[0] if at else _num(outputs.get("heldout_reward_start")) if step == 0 \
            else None
        return Kept(step, reward, True)
    best: dict | None = None
    start = start_reward(rows, outputs)
    for p in ([{"step": 0, HELDOUT: start}] if start is not None else []) + ev:
        if best is None or p[HELDOUT] > best[HELDOUT]:
            best = p
    return Kept(best["step"], best[HELDOUT], False) if best else Kept(None, None, False)


def start_reward(rows: list[dict], outputs: dict[str, Any] | None = None) -> float | None:
    """The held-out reward before the first step: the manifest's, else the first evaluated
    row's (`heldout_reward_start`; rows written before it was logged have none)."""
    got = _num((outputs or {}).get("heldout_reward_start"))
    for r in rows:
        if got is not None:
            break
        got = _num(r.get("heldout_reward_start"))
    return got


def heldout(rows: list[dict], outputs: dict[str, Any] | None = None,
            keep: Kept | None = None) -> list[dict]:
    """The held-out (dev) reward at its evaluation steps, with the start (step 0, from the
    manifest once exported) and the kept step marked: [{"step", "heldout_reward", "kept"}]."""
    keep = keep or kept(rows, outputs)
    pts = series(rows, HELDOUT)
    start = start_reward(rows, outputs)
    if start is not None and not any(p["step"] == 0 for p in pts):
        pts = [{"step": 0, HELDOUT: start}, *pts]
    return [{**p, "kept": p["step"] == keep.step} for p in pts]


@dataclass(frozen=True)
class GrpoCurves:
    """What the page draws for one training."""

    steps: int  # the last step with a row
    reward: list[dict]
    heldout: list[dict]
    kept: Kept
    no_signal: list[dict]
    tool_calls: list[dict]
    kl: list[dict]
    clip: list[dict]
    speed: list[dict]
    final: dict[str, Any] = field(default_factory=dict)  # the last row

    @property
    def kl_measured(self) -> bool:
        return bool(self.kl)


def shape(rows: list[dict], outputs: dict[str, Any] | None = None) -> GrpoCurves:
    """A training's rows (and its exported manifest's outputs, when current) as curves."""
    ordered = by_step(rows)
    keep = kept(ordered, outputs)
    return GrpoCurves(
        steps=ordered[-1]["step"] if ordered else 0, reward=reward_band(ordered),
        heldout=heldout(ordered, outputs, keep), kept=keep,
        no_signal=series(ordered, "groups_no_signal"),
        tool_calls=long_series(ordered, TOOL_SERIES), kl=long_series(ordered, KL_SERIES),
        clip=series(ordered, "clip_fraction"), speed=long_series(ordered, SPEED_SERIES),
        final=ordered[-1] if ordered else {})


def summary(c: GrpoCurves) -> str:
    """One line: steps, the last step's mean reward, the kept (or best so far) held-out
    reward and its step, the start's."""
    planned = _num(c.final.get("steps_planned"))
    of = f" of {int(planned)}" if planned is not None and planned > c.steps else ""
    parts = [f"{c.steps}{of} step{'s' if (planned or c.steps) != 1 else ''}"]
    if (r := _num(c.final.get(REWARD))) is not None:
        parts.append(f"mean reward at the last step {number(r)}")
    if (ns := _num(c.final.get("groups_no_signal"))) is not None:
        parts.append(f"groups with no signal {percent(ns)}")
    k = c.kept
    if k.step is not None:
        parts.append(f"{'kept' if k.final else 'best so far'}: step {k.step}"
                     + (f" (held-out reward {number(k.reward)})" if k.reward is not None
                        else ""))
    start = [p[HELDOUT] for p in c.heldout if p["step"] == 0]
    if start:
        parts.append(f"held-out reward before training {number(start[0])}")
    return "; ".join(parts)


# --- Vega-Lite specs --------------------------------------------------------------------------

STEP_X = {"field": "step", "type": "quantitative", "title": "step",
          "axis": {"format": "d", "tickMinStep": 1}}


def _y(field_: str, title: str, scale: tuple[float, float] | None,
       fmt: str | None = None) -> dict[str, Any]:
    y: dict[str, Any] = {"field": field_, "type": "quantitative", "title": title}
    if scale:
        y["scale"] = {"domain": list(scale)}
    if fmt:
        y["axis"] = {"format": fmt}
    return y


def line_spec(y: str, title: str, scale: tuple[float, float] | None = None,
              fmt: str | None = None) -> dict[str, Any]:
    """One metric by step, a line with a dot at each measurement (one point still shows);
    `fmt`: the y axis's d3 format ("~g": no trailing zeros)."""
    return {"mark": {"type": "line", "point": True, "tooltip": True},
            "encoding": {"x": STEP_X, "y": _y(y, title, scale, fmt)}}


def lines_spec(title: str, scale: tuple[float, float] | None = None) -> dict[str, Any]:
    """Long-form series (`long_series`) as one line each, coloured, with a legend below."""
    return {"mark": {"type": "line", "point": True, "tooltip": True},
            "encoding": {"x": STEP_X, "y": _y("value", title, scale),
                         "color": {"field": "series", "type": "nominal", "title": None,
                                   "legend": {"orient": "bottom"}}}}


def band_spec(title: str = "mean reward") -> dict[str, Any]:
    """`reward_band`'s rows: the mean reward as a line over a shaded band of one
    within-group standard deviation either side."""
    return {"encoding": {"x": STEP_X}, "layer": [
        {"mark": {"type": "area", "opacity": 0.25},
         "encoding": {"y": _y("low", title, None), "y2": {"field": "high"},
                      "tooltip": [{"field": "step"}, {"field": STD, "format": ".3f",
                                                      "title": "std within groups"}]}},
        {"mark": {"type": "line", "point": True, "tooltip": True},
         "encoding": {"y": {"field": REWARD, "type": "quantitative"}}}]}


def heldout_spec(title: str = "held-out reward", mark: str = "kept",
                 steps: int | None = None) -> dict[str, Any]:
    """`heldout`'s rows: the held-out reward by evaluation step, the kept step marked by a
    dashed rule and a larger red dot labelled `mark` ("kept", or "best so far" while the
    training runs); with `steps` the step axis runs from 0 to it (the training's steps so
    far, so a first evaluation does not fill the whole width)."""
    is_kept = {"filter": "datum.kept"}
    x = {**STEP_X, "scale": {"domain": [0, steps]}} if steps else STEP_X
    return {"encoding": {"x": x}, "layer": [
        {"mark": {"type": "line", "point": True, "tooltip": True},
         "encoding": {"y": _y(HELDOUT, title, None)}},
        {"transform": [is_kept], "mark": {"type": "rule", "strokeDash": [4, 4],
                                          "color": "#d62728"}},
        {"transform": [is_kept], "mark": {"type": "point", "filled": True, "size": 120,
                                          "color": "#d62728", "tooltip": True},
         "encoding": {"y": {"field": HELDOUT, "type": "quantitative"}}},
        {"transform": [is_kept], "mark": {"type": "text", "dy": -12, "color": "#d62728"},
         "encoding": {"y": {"field": HELDOUT, "type": "quantitative"},
                      "text": {"value": mark}}}]}
