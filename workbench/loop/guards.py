"""Per-subset deltas with paired intervals, the automatic guards, and what they recommend.

A delta compares the candidate with the current model on the same items: MC subsets by
accuracy (paired bootstrap interval over items, exact McNemar), the open questions by rubric
score (paired bootstrap, sign-flip permutation test). The guards use the point estimates:
they exist to stop regressions, so a drop counts even when its interval is wide; the report
shows the intervals so nobody reads a small gain as a result.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from workbench.evaluate.stats import bootstrap_interval, mcnemar_exact, wilson_interval
from workbench.loop.records import Choice, Guard, GuardResult, SubsetDelta
from workbench.loop.suites import per_subset
from workbench.records import EvalResult
from workbench.text import percent, points, points_interval

REPORTED = ("test", "retention", "open")


def plan_guards(subsets: Sequence[str], settings, *, retention: bool, opens: bool
                ) -> list[Guard]:
    out = [Guard(name=f"test/{s} drop", kind="subset_drop", subset=f"test/{s}",
                 limit=settings.subset_drop) for s in subsets]
    if retention:
        out.append(Guard(name="retention drop", kind="subset_drop",
                         subset="retention/retention", limit=settings.retention_drop))
    if opens:
        out += [Guard(name="open rubric drop", kind="subset_drop", subset="open/*",
                      limit=settings.open_drop),
                Guard(name="answer length blow-up", kind="length_blowup",
                      limit=settings.length_blowup),
                Guard(name="non-termination", kind="non_termination",
                      limit=settings.non_termination)]
    return out


def _sign_flip_p(diff: Sequence[float], seed: int = 0, resamples: int = 4000) -> float:
    d = [x for x in diff if x != 0]
    if not d:
        return 1.0
    obs = abs(sum(d))
    if len(d) <= 12:  # exact
        hits = sum(abs(sum(s * x for s, x in zip(signs, d, strict=True))) >= obs - 1e-12
                   for signs in itertools.product((1, -1), repeat=len(d)))
        return hits / 2 ** len(d)
    rng = random.Random(seed)
    hits = sum(abs(sum(x if rng.random() < 0.5 else -x for x in d)) >= obs - 1e-12
               for _ in range(resamples))
    return (hits + 1) / (resamples + 1)


def deltas(before: Sequence[EvalResult], after: Sequence[EvalResult], *, target: str,
           seed: int = 0) -> list[SubsetDelta]:
    b, a = per_subset(before), per_subset(after)
    out = []
    for key in sorted(set(b) & set(a)):
        suite, subset = key
        if suite not in REPORTED:
            continue
        ids = sorted(set(b[key]) & set(a[key]))
        if not ids:
            continue
        x, y = [b[key][i] for i in ids], [a[key][i] for i in ids]
        diff = [q - p for p, q in zip(x, y, strict=True)]
        lo, hi = bootstrap_interval(diff, seed=seed)
        n = len(ids)
        if suite == "open":
            p = _sign_flip_p(diff, seed)
            bci = bootstrap_interval(x, seed=seed)
            aci = bootstrap_interval(y, seed=seed)
        else:
            p = mcnemar_exact([v > 0.5 for v in x], [v > 0.5 for v in y])
            bci = wilson_interval(int(sum(x)), n)
            aci = wilson_interval(int(sum(y)), n)
        out.append(SubsetDelta(suite=suite, subset=subset, n=n, before=sum(x) / n,
                               after=sum(y) / n, delta=sum(diff) / n, ci_low=lo, ci_high=hi,
                               p_value=p, before_ci=bci, after_ci=aci,
                               target=suite == "test" and subset == target))
    return out


def _open_stats(rows: Sequence[EvalResult], limit_tokens: int) -> tuple[float, float]:
    opens = [r for r in rows if r.condition == "open"]
    if not opens:
        return 0.0, 0.0
    mean_len = sum(r.extra.get("tokens", 0) for r in opens) / len(opens)
    at_limit = sum(r.extra.get("finish") == "length" for r in opens) / len(opens)
    return mean_len, at_limit


def check(guards: Sequence[Guard], ds: Sequence[SubsetDelta], before: Sequence[EvalResult],
          after: Sequence[EvalResult], *, limit_tokens: int) -> list[GuardResult]:
    out = []
    by = {f"{d.suite}/{d.subset}": d for d in ds}
    len_b, lim_b = _open_stats(before, limit_tokens)
    len_a, lim_a = _open_stats(after, limit_tokens)
    for g in guards:
        if g.kind == "subset_drop":
            if g.subset and g.subset.endswith("/*"):
                suite = g.subset[:-2]
                sel = [d for d in ds if d.suite == suite]
                n = sum(d.n for d in sel)
                delta = sum(d.delta * d.n for d in sel) / n if n else 0.0
            elif g.subset in by:
                delta = by[g.subset].delta
            else:
                out.append(GuardResult(guard=g, value=0.0, passed=True,
                                       detail="not measured"))
                continue
            drop = -delta
            out.append(GuardResult(guard=g, value=round(drop, 4) or 0.0,
                                   passed=drop <= g.limit + 1e-9,
                                   detail=f"{points(delta)} points (limit "
                                          f"{points(-g.limit)})"))
        elif g.kind == "length_blowup":
            ratio = len_a / len_b if len_b else 1.0
            out.append(GuardResult(guard=g, value=round(ratio, 3), passed=ratio <= g.limit,
                                   detail=f"mean answer {len_b:.0f} -> {len_a:.0f} tokens"))
        elif g.kind == "non_termination":
            rise = lim_a - lim_b
            out.append(GuardResult(guard=g, value=round(rise, 3) or 0.0,
                                   passed=rise <= g.limit + 1e-9,
                                   detail=f"{percent(lim_b)} -> {percent(lim_a)} of "
                                          f"answers at the {limit_tokens}-token limit"))
    return out


def recommend(results: Sequence[GuardResult], ds: Sequence[SubsetDelta], min_gain: float
              ) -> tuple[Choice, str]:
    flagged = [r for r in results if not r.passed]
    if flagged:
        return "revert", "guards tripped: " + "; ".join(
            f"{r.guard.name} ({r.detail})" for r in flagged)
    tgt = next((d for d in ds if d.target), None)
    if tgt is None:
        return "revert", "the target subset was not measured"
    if tgt.delta > min_gain:
        return "keep", (f"target {tgt.subset} "
                        f"{points_interval(tgt.delta, tgt.ci_low, tgt.ci_high)} points, "
                        "no guard tripped")
    return "revert", (f"target {tgt.subset} {points(tgt.delta)} points: not above the "
                      f"least gain ({points(min_gain)})")
