"""The evaluation summary as typed records (`summary.json`), and how it is computed from the
per-item results: accuracies with 95% intervals, prediction distributions, the degenerate
flag, the headline formulation and its rule, and paired comparisons of conditions (or of two
models) on the same items."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any, Final, Literal

from pydantic import Field

from workbench.evaluate.stats import (
    DEGENERATE_MARGIN,
    DEGENERATE_MIN_ITEMS,
    DEGENERATE_SHARE,
    SIGNIFICANCE,
    cluster_bootstrap_difference,
    clustered_sign_flip_p,
    clustered_wilson_interval,
    degenerate_reason,
    discordant_pairs,
    holm,
    is_clustered,
    mcnemar_exact,
    paired_bootstrap_difference,
    prediction_counts,
    wilson_interval,
)
from workbench.records import LETTERS, EvalResult, StrictModel
from workbench.text import percent, points

SCHEMA_VERSION: Final = 1
# OLMES (arXiv 2406.08446) scores each model in both formulations and reports the better one;
# its cloze scores are normalised by length in characters for most tasks, as here.
HEADLINE_CANDIDATES = ("letter", "cloze_norm")
HEADLINE_RULE = (
    "Per model, the better (mean accuracy over its conditions) of the letter "
    "formulation (MCF: options listed, letters scored) and the cloze formulation (CF: question "
    "only, option texts scored, normalised by length in characters as lm-eval's acc_norm), "
    "leaving out a formulation that is degenerate under any condition (OLMES, arXiv "
    "2406.08446). Generation is the headline only when no log-likelihood formulation ran.")
DEGENERATE_RULE = (
    f"Degenerate: one letter is at least {percent(DEGENERATE_SHARE)} of the predictions and "
    f"more than {points(DEGENERATE_MARGIN, signed=False)} points above its share of the gold answers (judged "
    f"from {DEGENERATE_MIN_ITEMS} items up); such a scoring measures a letter preference, not "
    "the items, and is never the headline.")
COMPARISON_RULE = (
    "Pairs on the same items, each side in its headline formulation: exact McNemar p-value "
    "(two-sided binomial test on the items only one side gets right), paired bootstrap 95% "
    "interval of the accuracy difference (b - a), Holm-adjusted over the comparisons listed "
    f"together; significant means Holm p < {SIGNIFICANCE:g}. Where items share a cluster "
    "(several items asked for one sentence of the text), an exact sign-flip test over "
    "clusters (McNemar's idea applied to clusters, Durkalski et al. 2003) and a bootstrap "
    "over clusters replace them, and accuracies get the Wilson interval at the effective "
    "sample size (Kish's design effect).")
_MISS = re.compile(r"^(?P<base>.+)_ranks\d+-\d+$")


class Accuracy(StrictModel):
    """A proportion of items with its Wilson 95% interval."""

    correct: int
    n: int
    value: float
    ci_low: float
    ci_high: float
    clusters: int | None = Field(None, description="Independent clusters the items form "
                                                   "(None: every item is independent).")

    @classmethod
    def of(cls, correct: Sequence[bool], clusters: Sequence[str] | None = None) -> Accuracy:
        k, n = sum(bool(c) for c in correct), len(correct)
        if clusters is not None and is_clustered(clusters):
            lo, hi = clustered_wilson_interval(correct, clusters)
            return cls(correct=k, n=n, value=k / n, ci_low=lo, ci_high=hi,
                       clusters=len(set(clusters)))
        lo, hi = wilson_interval(k, n)
        return cls(correct=k, n=n, value=k / n if n else 0.0, ci_low=lo, ci_high=hi)


class FormulationSummary(StrictModel):
    accuracy: Accuracy
    predictions: dict[str, int] = Field(description="How often each letter was predicted.")
    degenerate: bool = False
    degenerate_reason: str | None = None


class GenerationSummary(FormulationSummary):
    unparsed: float = Field(description="Share of items whose answer had no option letter.")


class ConditionSummary(StrictModel):
    n: int
    gold: dict[str, int] = Field(description="How often each letter is the right answer.")
    formulations: dict[str, FormulationSummary] = Field(default_factory=dict)
    generation: GenerationSummary | None = None
    circular: Accuracy | None = None
    agreement_letter_generation: float | None = None
    seconds_per_item: float = 0.0
    seconds_per_item_by_pass: dict[str, float] = Field(default_factory=dict)
    context_words: float | None = Field(None, description="Mean words of context given with "
                                                          "an item (None: no context).")

    def scoring(self, name: str) -> FormulationSummary | None:
        return self.generation if name == "generate" else self.formulations.get(name)


class Headline(StrictModel):
    formulation: str | None = Field(description="None when every candidate is degenerate.")
    rule: str = HEADLINE_RULE
    mean_accuracy: dict[str, float] = Field(default_factory=dict)
    excluded: dict[str, str] = Field(default_factory=dict)


class PairedComparison(StrictModel):
    a: str
    b: str
    formulation_a: str
    formulation_b: str
    n: int
    accuracy_a: float
    accuracy_b: float
    difference: float = Field(description="accuracy_b - accuracy_a")
    difference_ci_low: float
    difference_ci_high: float
    only_a: int = Field(description="Items only a gets right.")
    only_b: int = Field(description="Items only b gets right.")
    p_value: float = Field(description="Exact McNemar, two-sided (an exact sign-flip test over "
                                       "clusters when the items form clusters).")
    clusters: int | None = Field(None, description="Independent clusters the items form "
                                                   "(None: every item is independent).")
    p_holm: float
    significant: bool


class OpenSummary(StrictModel):
    n: int
    accuracy: Accuracy
    token_f1: float
    judge: str


class EvalSummary(StrictModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    model_identity: str
    items: int
    chance: float = Field(description="Mean of 1 / number of options.")
    conditions: dict[str, ConditionSummary]
    headline: Headline
    degenerate_rule: str = DEGENERATE_RULE
    comparisons: list[PairedComparison] = Field(default_factory=list)
    comparison_rule: str = COMPARISON_RULE
    retrieval: dict[str, dict[str, float]] = Field(default_factory=dict)
    open: OpenSummary | None = None

    @property
    def headline_accuracy(self) -> dict[str, Accuracy]:
        """Each condition's accuracy in the headline formulation."""
        f = self.headline.formulation
        return {c: scored.accuracy for c, s in self.conditions.items()
                if f and (scored := s.scoring(f)) is not None}


def _letters(results: Sequence[EvalResult]) -> str:
    n = max((r.extra.get("n_options", 0) for r in results), default=0)
    return LETTERS[:n or 4]


def _cluster_keys(results: Sequence[EvalResult]) -> list[str]:
    """Each item's cluster (`extra["cluster"]`, set from the item's source sentence), else its
    own id: items of one cluster are not independent."""
    return [str(r.extra.get("cluster") or f"item:{r.example_id}") for r in results]


def _clusters_of(results: Sequence[EvalResult]) -> dict[str, str]:
    """item id -> cluster, for the items that have one (no fill-ins: a run without clusters
    merged with one that has them must not hide them)."""
    return {r.example_id: str(c) for r in results if (c := r.extra.get("cluster"))}


def _formulation(preds: Sequence[str | None], golds: Sequence[str], letters: str,
                 cls=FormulationSummary, clusters: Sequence[str] | None = None,
                 **extra) -> FormulationSummary:
    reason = degenerate_reason(preds, golds)
    return cls(accuracy=Accuracy.of([p == g for p, g in zip(preds, golds, strict=True)],
                                    clusters),
               predictions=prediction_counts(preds, letters), degenerate=reason is not None,
               degenerate_reason=reason, **extra)


def summarize(results: Sequence[EvalResult]) -> ConditionSummary:
    """The summary of one condition's multiple-choice results."""
    if not results:
        return ConditionSummary(n=0, gold={})
    letters = _letters(results)
    golds = [r.gold or "" for r in results]
    preds = [r.extra.get("predictions", {}) for r in results]
    names = [k for k in ("letter", "cloze", "cloze_norm") if all(k in p for p in preds)]
    keys = _cluster_keys(results)
    forms = {k: _formulation([p[k] for p in preds], golds, letters, clusters=keys)
             for k in names}
    gen = None
    if all("generate" in p for p in preds):
        g = [p["generate"] for p in preds]
        gen = _formulation(g, golds, letters, GenerationSummary, clusters=keys,
                           unparsed=sum(x is None for x in g) / len(g))
    circ = None
    if all("circular" in r.scores for r in results):
        circ = Accuracy.of([r.scores["circular"] == 1.0 for r in results], keys)
    agree = None
    if "letter" in forms and gen is not None:
        agree = sum(p["letter"] == p["generate"] for p in preds) / len(preds)
    return ConditionSummary(
        n=len(results), gold=prediction_counts(golds, letters), formulations=forms,
        generation=gen, circular=circ, agreement_letter_generation=agree,
        seconds_per_item=sum(r.latency_s or 0.0 for r in results) / len(results),
        seconds_per_item_by_pass=dict(results[0].extra.get("seconds", {})),
        context_words=(sum(r.extra.get("context_words", 0) for r in results) / len(results)
                       if any("context_words" in r.extra for r in results) else None))


def choose_headline(conditions: Mapping[str, ConditionSummary]) -> Headline:
    """Apply HEADLINE_RULE to one model's conditions."""
    conds = list(conditions.values())
    candidates = [f for f in HEADLINE_CANDIDATES
                  if conds and all(c.scoring(f) is not None for c in conds)]
    if not candidates and conds and all(c.generation is not None for c in conds):
        candidates = ["generate"]
    means: dict[str, float] = {}
    excluded: dict[str, str] = {}
    for f in candidates:  # each scored under every condition
        scored = {name: s for name, c in conditions.items() if (s := c.scoring(f)) is not None}
        means[f] = sum(s.accuracy.value for s in scored.values()) / len(conds)
        bad = [(name, s.degenerate_reason) for name, s in scored.items() if s.degenerate]
        if bad:
            excluded[f] = f"degenerate under {', '.join(n for n, _ in bad)}: {bad[0][1]}"
    for f in HEADLINE_CANDIDATES:  # scored under some conditions only: never a headline
        some = {name: s for name, c in conditions.items() if (s := c.scoring(f)) is not None}
        if some and f not in candidates:
            bad = [(name, s.degenerate_reason) for name, s in some.items() if s.degenerate]
            excluded[f] = f"scored under {', '.join(some)} only" + (
                f"; degenerate under {', '.join(n for n, _ in bad)}: {bad[0][1]}" if bad
                else "")
    ok = [f for f in candidates if f not in excluded]
    best = max(ok, key=lambda f: means[f]) if ok else None  # ties: the first candidate
    return Headline(formulation=best, mean_accuracy=means, excluded=excluded)


def _correct(results: Sequence[EvalResult], formulation: str) -> dict[str, bool]:
    return {r.example_id: r.scores[formulation] == 1.0 for r in results
            if formulation in r.scores}


def paired_comparisons(pairs: Sequence[tuple[str, str, Mapping[str, bool], Mapping[str, bool],
                                             str, str]], *, seed: int = 0,
                       clusters: Mapping[str, str] | None = None) -> list[PairedComparison]:
    """One PairedComparison per (a, b, correct_a, correct_b, formulation_a, formulation_b),
    where correct_* map item id -> right or wrong; only the items both sides have count, and
    the p-values are Holm-adjusted together. `clusters` maps item id -> cluster where items
    are not independent (clustered McNemar and a bootstrap over clusters then)."""
    rows: list[dict[str, Any]] = []
    for a, b, ca, cb, fa, fb in pairs:
        ids = [i for i in ca if i in cb]
        if not ids:
            continue
        xa, xb = [ca[i] for i in ids], [cb[i] for i in ids]
        only_a, only_b = discordant_pairs(xa, xb)
        keys = [(clusters or {}).get(i, f"item:{i}") for i in ids]
        if is_clustered(keys):
            diff, (lo, hi) = cluster_bootstrap_difference(xa, xb, keys, seed=seed)
            p, k = clustered_sign_flip_p(xa, xb, keys), len(set(keys))
        else:
            diff, (lo, hi) = paired_bootstrap_difference(xa, xb, seed=seed)
            p, k = mcnemar_exact(xa, xb), None
        rows.append({"a": a, "b": b, "formulation_a": fa, "formulation_b": fb, "n": len(ids),
                     "accuracy_a": sum(xa) / len(ids), "accuracy_b": sum(xb) / len(ids),
                     "difference": diff, "difference_ci_low": lo, "difference_ci_high": hi,
                     "only_a": only_a, "only_b": only_b, "p_value": p, "clusters": k})
    adjusted = holm([r["p_value"] for r in rows])
    return [PairedComparison(**r, p_holm=p, significant=p < SIGNIFICANCE)
            for r, p in zip(rows, adjusted, strict=True)]


def compare_conditions(results: Sequence[EvalResult], formulation: str, *, seed: int = 0
                       ) -> list[PairedComparison]:
    """Every pair of retrieval conditions (none, semantic, ...), and each ranks-k+1..2k check
    against its own condition, on the same items in one formulation."""
    by_cond: dict[str, list[EvalResult]] = {}
    for r in results:
        if r.condition != "open":
            by_cond.setdefault(r.condition, []).append(r)
    main = [c for c in by_cond if not _MISS.match(c)]
    pairs = [(a, b) for a, b in combinations(main, 2)]
    pairs += [(m.group("base"), c) for c in by_cond if (m := _MISS.match(c))
              and m.group("base") in by_cond]
    return paired_comparisons([(a, b, _correct(by_cond[a], formulation),
                                _correct(by_cond[b], formulation), formulation, formulation)
                               for a, b in pairs], seed=seed,
                              clusters=_clusters_of([r for r in results
                                                     if r.condition != "open"]))


def summarize_eval(results: Sequence[EvalResult], *, model: str, model_identity: str,
                   chance: float, seed: int = 0,
                   retrieval: Mapping[str, Mapping[str, float]] | None = None
                   ) -> EvalSummary:
    """The whole summary from per-item results (multiple-choice conditions, and open answers
    under the condition "open")."""
    by_cond: dict[str, list[EvalResult]] = {}
    for r in results:
        by_cond.setdefault(r.condition, []).append(r)
    open_rows = by_cond.pop("open", [])
    conditions = {c: summarize(rows) for c, rows in by_cond.items()}
    headline = choose_headline(conditions)
    comparisons = compare_conditions(results, headline.formulation, seed=seed) \
        if headline.formulation else []
    open_summary = None
    if open_rows:
        open_summary = OpenSummary(
            n=len(open_rows), accuracy=Accuracy.of([bool(r.correct) for r in open_rows]),
            token_f1=sum(r.score or 0.0 for r in open_rows) / len(open_rows),
            judge=str(open_rows[0].extra.get("judge", "")))
    return EvalSummary(model=model, model_identity=model_identity,
                       items=max((s.n for s in conditions.values()), default=0),
                       chance=chance, conditions=conditions, headline=headline,
                       comparisons=comparisons,
                       retrieval={k: dict(v) for k, v in (retrieval or {}).items()},
                       open=open_summary)


def compare_runs(summary_a: EvalSummary, results_a: Sequence[EvalResult],
                 summary_b: EvalSummary, results_b: Sequence[EvalResult], *,
                 conditions: Sequence[str] | None = None, seed: int = 0
                 ) -> list[PairedComparison]:
    """Two models (e.g. base vs SFT) on the same items, condition by condition, each in its
    own headline formulation (OLMES: each model is scored in its better formulation); items
    only one run has are left out. Empty when either model has no headline."""
    fa, fb = summary_a.headline.formulation, summary_b.headline.formulation
    if fa is None or fb is None:
        return []
    wanted = conditions or [c for c in summary_a.conditions if c in summary_b.conditions]
    pairs = []
    for c in wanted:
        ra = [r for r in results_a if r.condition == c]
        rb = [r for r in results_b if r.condition == c]
        pairs.append((f"{summary_a.model} / {c}", f"{summary_b.model} / {c}",
                      _correct(ra, fa), _correct(rb, fb), fa, fb))
    return paired_comparisons(pairs, seed=seed, clusters={**_clusters_of(results_b),
                                                          **_clusters_of(results_a)})
