"""Paired comparisons of literature-search conditions on the same intents (issue 27): each
adapter condition (`agent+NAME`) against the plain agent, and agent+sft_dpo against agent+sft
(without those two, the last adapter condition against the first, e.g. two adapters given in
`agent.adapters`). Read from the conditions' dialogue files; written into the report's
`paired` list and its markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workbench.agent_packs.litsearch.tuned import SFT, SFT_DPO
from workbench.evaluate.stats import bootstrap_interval, clustered_sign_flip_p
from workbench.io import read_jsonl
from workbench.runs import outputs_at
from workbench.text import markdown_table, number_interval, p_value


def comparisons(conditions: list[str]) -> list[tuple[str, str]]:
    """(condition, against) for every comparison the report makes."""
    tuned = [c for c in conditions if c.startswith("agent+")]
    pairs = [(c, "agent") for c in tuned if "agent" in conditions]
    if SFT in tuned and SFT_DPO in tuned:
        pairs.append((SFT_DPO, SFT))
    elif len(tuned) > 1:
        pairs.append((tuned[-1], tuned[0]))
    return pairs


def sign_flip_p(diffs: list[float], *, exact_up_to: int = 16, resamples: int = 20000,
                seed: int = 0) -> float:
    """Two-sided p of the paired sign-flip (randomisation) test of a mean difference: under
    "no difference" each intent's difference is as likely + as -. Exact over every sign
    pattern up to `exact_up_to` non-zero differences, else a seeded Monte Carlo estimate
    ((hits + 1) / (resamples + 1))."""
    d = np.asarray([x for x in diffs if x != 0.0], dtype=float)
    if d.size == 0:
        return 1.0
    observed = abs(d.sum()) * (1 - 1e-9) - 1e-12  # ties count as extreme
    if d.size <= exact_up_to:
        bits = (np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1
        return float(np.mean(np.abs((1 - 2 * bits) @ d) >= observed))
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(resamples, d.size))
    hits = int(np.sum(np.abs(signs @ d) >= observed))
    return (hits + 1) / (resamples + 1)


def _compare(a: list[dict], b: list[dict], cond: str, against: str) -> dict[str, Any]:
    by_id = {r["id"]: r for r in a}
    both = [(by_id[r["id"]], r) for r in b if r["id"] in by_id]
    diff = [x["turns"][-1]["ndcg10"] - y["turns"][-1]["ndcg10"] for x, y in both]
    ok_a, ok_b, clusters = [], [], []
    for x, y in both:
        for tx, ty in zip(x["turns"], y["turns"], strict=False):
            ok_a.append(tx["error"] is None)
            ok_b.append(ty["error"] is None)
            clusters.append(x["id"])
    lo, hi = bootstrap_interval(diff, n_resamples=1000) if diff else (0.0, 0.0)
    return {"condition": cond, "against": against, "intents": len(both),
            "ndcg10_final_diff": float(np.mean(diff)) if diff else 0.0,
            "ndcg10_final_diff_ci95": [lo, hi], "ndcg10_final_p": sign_flip_p(diff),
            "turns": len(ok_a), "errors": ok_a.count(False),
            "errors_against": ok_b.count(False),
            "errors_p": clustered_sign_flip_p(ok_a, ok_b, clusters)}


def paired(out: Path, conditions: list[str]) -> list[dict[str, Any]] | None:
    """The report's `paired` entries (None when no adapter condition ran)."""
    pairs = comparisons(conditions)
    if not pairs:
        return None
    files = outputs_at("agent", out)
    rows = {c: read_jsonl(files.path("litsearch", c)) for c in {x for p in pairs for x in p}}
    return [_compare(rows[a], rows[b], a, b) for a, b in pairs]


def paired_lines(report) -> list[str]:
    """Markdown: the paired comparisons, then the adapters trained here."""
    lines: list[str] = []
    if report.paired:
        lines += ["", markdown_table(
            ["comparison (same intents)", "nDCG@10 final, difference [95% CI]", "sign-flip p",
             "execution errors (turns)", "McNemar p"],
            [[f"{p.condition} vs {p.against}",
              number_interval(p.ndcg10_final_diff, p.ndcg10_final_diff_ci95.low,
                              p.ndcg10_final_diff_ci95.high, signed=True),
              p_value(p.ndcg10_final_p), f"{p.errors} vs {p.errors_against} of {p.turns}",
              p_value(p.errors_p)] for p in report.paired])]
        lines += ["", "Paired over the same intents: the nDCG@10 difference with its "
                      "bootstrap interval and a sign-flip test over intents; execution errors "
                      "with the exact McNemar test (an intent's turns flipped together)."]
    for cond, t in (report.trained or {}).items():
        loss = "-" if t.first_loss is None else f"{t.first_loss:.3f} -> {t.last_loss:.3f}"
        start = f" from `{t.init_adapter}` (also the reference)" if t.init_adapter else ""
        dpo = "" if t.reward_accuracy is None else \
            f", reward accuracy {t.reward_accuracy:.2f}, margin {t.reward_margin:+.3f}"
        what = "dialogues" if t.method == "sft" else "pairs"
        lines += ["", f"{cond}: `{t.adapter}/`, {t.method.upper()}{start} on {t.examples} "
                      f"{what}, {t.steps} steps, loss {loss}{dpo}."]
    return lines
