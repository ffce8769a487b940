"""The compare experiment's report: report.json's types and report.md.

One distillation gives up to two benchmarks, named for what they measure (RF-Agent's two
protocols):

- `unseen`: items from sections held out of the training data: does what training and
  retrieval bring carry over to texts the model was not trained on;
- `seen`: held-out questions about sentences the training data teaches (no held-out question,
  nor a near-duplicate of one, is trained on): did training teach the facts.

Every condition of each benchmark is a row with its interval; beside them, the knowledge-free
shortcut rules (a benchmark a rule solves as well as the base model is flagged), the oracle
bound (the item's own passage) and how far each retriever is from it, and the paired tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from workbench.errors import DataError
from workbench.evaluate.report import SCORING_LABELS, comparisons_markdown
from workbench.evaluate.shortcuts import ShortcutRow
from workbench.evaluate.stats import SIGNIFICANCE, mcnemar_items_for_power
from workbench.evaluate.summary import Accuracy, PairedComparison
from workbench.records import StrictModel
from workbench.runs import locate
from workbench.text import accuracy, markdown_table, number, percent, points

REPORT_SCHEMA = 3  # 3: rows carry their benchmark; benchmarks (seen/unseen), shortcuts, oracle
RAG = ("semantic", "keyword", "hybrid")
ROW_NAMES = {"none": "", "oracle": " + oracle context", "semantic": " + semantic RAG",
             "keyword": " + keyword RAG", "hybrid": " + hybrid RAG"}
MEASURES = {
    "unseen": "Items about sections held out of the training data: whether what training and "
              "retrieval bring carries over to texts the model was not trained on.",
    "seen": "Held-out questions about sentences the training data teaches, none of them (nor a "
            "near-duplicate) trained on (RF-Agent's item-level protocol): whether training "
            "taught the facts.",
}
RETRIEVAL_LABELS = {"hit@1": "Hit@1", "hit@3": "Hit@3", "hit@10": "Hit@10", "mrr": "MRR",
                    "ndcg@10": "nDCG@10"}
ORACLE = ("oracle: each item's own source passage as context, the bound a retriever cannot "
          "pass (a retriever that always found the right passage would give it).")
CONTEXTS = {"none": "none: the question alone",
            "oracle": "the item's own passage: the words around its sentence",
            "semantic": "the top chunks by embedding similarity",
            "keyword": "the top chunks by BM25",
            "hybrid": "the top chunks by both, fused"}
POWER = 0.8


class CompareRow(StrictModel):
    model: str  # "Base" or "SFT"
    condition: str
    name: str
    benchmark: str = Field("unseen", description="unseen or seen (see MEASURES).")
    n: int
    scorings: dict[str, Accuracy] = Field(description="Accuracy with 95% interval per scoring"
                                                      " (letter, cloze, cloze_norm, generate).")
    degenerate: dict[str, str] = Field(default_factory=dict,
                                       description="Scorings flagged degenerate, and why.")
    predictions: dict[str, dict[str, int]] = Field(default_factory=dict)
    headline: str | None = None
    seconds_per_item: float = 0.0
    context_words: float | None = Field(None, description="Mean words of context given with "
                                                          "an item (None: none given).")

    @property
    def headline_accuracy(self) -> Accuracy | None:
        return self.scorings.get(self.headline) if self.headline else None


class BenchmarkInfo(StrictModel):
    """One benchmark of the run: what it measures, its shortcut floor and its paired tests."""

    items: int
    measures: str
    shortcuts: list[ShortcutRow] = Field(default_factory=list)
    shortcut_flag: str | None = Field(None, description="Set when a knowledge-free rule "
                                                        "scores at least the base model's "
                                                        "accuracy without context.")
    comparisons: list[PairedComparison] = Field(default_factory=list)
    retrieval: dict[str, dict[str, float]] = Field(default_factory=dict)


class CompareReport(StrictModel):
    """report.json of a compare run."""

    schema_version: int = REPORT_SCHEMA
    name: str
    seed: int
    model: str
    domain: str
    chance: float
    headline_rule: str
    degenerate_rule: str
    comparison_rule: str
    rows: list[CompareRow]
    benchmarks: dict[str, BenchmarkInfo] = Field(default_factory=dict)
    best_rag: str | None = None
    hit_vs_miss: dict[str, dict[str, Accuracy]] = Field(default_factory=dict)
    distill: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0

    def _first(self) -> BenchmarkInfo | None:
        return next(iter(self.benchmarks.values()), None)

    @property
    def comparisons(self) -> list[PairedComparison]:
        """The first benchmark's (unseen's when there is one) paired comparisons."""
        b = self._first()
        return b.comparisons if b else []

    @property
    def retrieval(self) -> dict[str, dict[str, float]]:
        b = self._first()
        return b.retrieval if b else {}

    def rows_of(self, benchmark: str) -> list[CompareRow]:
        return [r for r in self.rows if r.benchmark == benchmark]


def read_report(run) -> CompareReport:
    """The report of a compare run folder (or report.json path)."""
    p = locate("compare", "report", run) if Path(run).is_dir() else Path(run)
    if not p.exists():
        raise DataError("no report.json: run `workbench compare run` first", path=str(p),
                        code="not_found")
    try:
        return CompareReport.model_validate_json(p.read_bytes())
    except ValueError as e:
        raise DataError(f"not a compare report of this workbench version ({str(e)[:200]}); "
                        "re-run the experiment", path=str(p), code="old_schema") from None


acc_text = accuracy  # the name the compare pipeline imports


def report_markdown(r: CompareReport) -> str:
    lines = [f"# {r.name}: base vs RAG vs SFT", "",
             f"Model `{r.model}`, domain `{r.domain}`, seed {r.seed}, total {r.seconds} s "
             "(stages skipped on a re-run take ~0 s).", ""]
    for name, b in r.benchmarks.items():
        lines += _benchmark(r, name, b)
    return "\n".join([*lines, *_rules(r), *_prediction_table(r), *_hit_vs_miss(r),
                      *_retrieval(r), *_data(r), *_training(r), *_stage_times(r)]) + "\n"


def _benchmark(r: CompareReport, name: str, b: BenchmarkInfo) -> list[str]:
    rows = r.rows_of(name)
    return [f"## Benchmark `{name}` ({b.items} items): RF-Agent's table", "", b.measures, "",
            *_comparison_table(rows), *_reading(rows), *_context_table(rows),
            *_shortcuts(r, b), *_significance(r, b), ""]


def _comparison_table(rows: list[CompareRow]) -> list[str]:
    """RF-Agent's table: every configuration under every scoring."""
    scorings = [k for k in ("letter", "cloze_norm", "cloze", "generate")
                if any(k in row.scorings for row in rows)]
    table = []
    for row in rows:
        cells = []
        for k in scorings:
            cell = accuracy(row.scorings.get(k))
            if k in row.degenerate:
                cell = f"⚠ {cell}"
            cells.append(f"**{cell}**" if k == row.headline else cell)
        table.append([row.name, row.n, *cells, number(row.seconds_per_item)])
    unscored = "" if "letter" in scorings else \
        " The letter formulation is not scored here (`compare.letter_benchmarks`, " \
        "`eval.letter_conditions`): the headline is the cloze one."
    return ["Accuracy with its 95% Wilson interval; **bold** is each model's headline "
            "scoring, ⚠ marks a degenerate scoring (never headlined)." + unscored, "",
            markdown_table(["configuration", "items", *(SCORING_LABELS[k] for k in scorings),
                            "s/item"], table)]


def _reading(rows: list[CompareRow]) -> list[str]:
    """(none, oracle) first, then how far each retriever is from the oracle."""
    base = {r.condition: r.headline_accuracy for r in rows if r.model == "Base"}
    none, oracle = base.get("none"), base.get("oracle")
    if none is None or oracle is None:
        return []
    gaps = [f"{c} {percent(a.value)} ({points(a.value - oracle.value)} points from the "
            "oracle)" for c in RAG if (a := base.get(c)) is not None]
    return ["", f"Base model without context {accuracy(none)}; with the item's own passage "
            f"(the oracle bound) {accuracy(oracle)}" + ("; retrievers: " + ", ".join(gaps)
                                                        if gaps else "") + ". " + ORACLE]


def _context_table(rows: list[CompareRow]) -> list[str]:
    """The context each condition gave the base model (source and mean size in words) beside
    its accuracy and its distance from the oracle: what the run measured about context."""
    base = [row for row in rows if row.model == "Base"]
    if not any(row.context_words for row in base):
        return []
    oracle = next((row.headline_accuracy for row in base if row.condition == "oracle"), None)
    table = []
    for row in base:
        acc = row.headline_accuracy
        gap = points(acc.value - oracle.value) if acc and oracle and row.condition != "oracle" \
            else "-"
        table.append([row.name, CONTEXTS.get(row.condition, row.condition),
                      number(row.context_words or 0.0, 0), accuracy(acc), gap])
    return ["", "The context each condition gives, placed before the question (\"Reference "
            "passages: ... Question: ...\"), and what it bought. Other sizes, placements and "
            "retrieval depths on the same items: `python benchmarks/bench_context.py <run>` "
            "(BENCHMARKS.md, \"The main job's protocol\").", "",
            markdown_table(["configuration", "context", "words (mean)", "accuracy",
                            "points from the oracle"], table)]


def _shortcuts(r: CompareReport, b: BenchmarkInfo) -> list[str]:
    if not b.shortcuts:
        return []
    lines = ["", "Knowledge-free rules (the floor a model must clear before its accuracy says "
             "anything about knowledge):", "",
             markdown_table(["rule", "accuracy", *"ABCD"],
                            [[s.description, accuracy(s.accuracy),
                              *(s.predictions.get(x, 0) for x in "ABCD")]
                             for s in b.shortcuts])]
    if b.shortcut_flag:
        lines += ["", f"⚠ **{b.shortcut_flag}**"]
    return lines


def _significance(r: CompareReport, b: BenchmarkInfo) -> list[str]:
    if not b.comparisons:
        return []
    sig = [c for c in b.comparisons if c.significant]
    return ["", "Which differences are real (paired, same items):", "",
            comparisons_markdown(b.comparisons), "",
            f"{len(sig)} of {len(b.comparisons)} differences are significant at 5% after "
            "Holm's correction" + (": " + "; ".join(
                f"{c.b} vs {c.a} ({points(c.difference)} points)" for c in sig)
                if sig else "."), *_power(b.comparisons)]


def _power(comparisons: list[PairedComparison]) -> list[str]:
    """For each difference seen but not significant: the items a run would need to find it
    (80% power at 5%, before Holm's correction), at the size observed here."""
    needs = [(c, k) for c in comparisons if not c.significant and (k := mcnemar_items_for_power(
        c.only_a, c.only_b, c.n, clusters=c.clusters, alpha=SIGNIFICANCE, power=POWER))]
    if not needs:
        return []
    return ["", f"Not significant here, and the items that would show it if the difference "
            f"observed is the true one ({percent(POWER)} power at {percent(SIGNIFICANCE)}, "
            "before Holm's correction; Connor 1987): " + "; ".join(
                f"{c.b} vs {c.a} {points(c.difference)} points ({c.only_a} / {c.only_b} "
                f"items only one side gets right): about {k} items" for c, k in needs) + "."]


def _rules(r: CompareReport) -> list[str]:
    """How the intervals treat clustered items, chance, the headline and degenerate rules,
    and the scorings flagged degenerate."""
    lines = ["## How to read the tables", ""]
    clustered = [(row.n, row.headline_accuracy.clusters) for row in r.rows
                 if row.headline_accuracy and row.headline_accuracy.clusters]
    if clustered:
        n, k = clustered[0]
        lines += [f"The {n} items form {k} independent clusters: items asked for one "
                  "sentence of the held-out text share their correct option. "
                  "Each interval is the Wilson interval at the effective sample size (Kish's "
                  "design effect over clusters); comparisons marked with clusters use an exact "
                  "sign-flip test over clusters and a bootstrap over clusters.", ""]
    lines += [f"Chance is {percent(r.chance)}. ![comparison](comparison.png)", "",
              f"**Headline rule.** {r.headline_rule}", "",
              f"**Degenerate rule.** {r.degenerate_rule}", "",
              f"**Comparisons.** {r.comparison_rule}", ""]
    flagged = [(row.name, row.benchmark, k, why) for row in r.rows
               for k, why in row.degenerate.items()]
    if flagged:
        lines += ["Flagged: " + "; ".join(f"{n} ({b}) / {SCORING_LABELS[k]}: {why}"
                                          for n, b, k, why in flagged), ""]
    return lines


def _prediction_table(r: CompareReport) -> list[str]:
    table = [[row.benchmark, row.name, SCORING_LABELS.get(k, k),
              *(dist.get(x, 0) for x in "ABCD")]
             for row in r.rows for k, dist in row.predictions.items()]
    return ["## Prediction distributions (how often each letter was predicted)", "",
            markdown_table(["benchmark", "configuration", "scoring", *"ABCD"], table)]


def _hit_vs_miss(r: CompareReport) -> list[str]:
    if not r.hit_vs_miss:
        return []
    return ["", "## Does retrieval quality matter? (contexts from the top ranks vs the "
            "ranks just below, letter scoring)", "",
            markdown_table(["retriever", "top ranks", "ranks below"],
                           [[k, accuracy(v["top"]), accuracy(v["below"])]
                            for k, v in r.hit_vs_miss.items()])]


def _retrieval(r: CompareReport) -> list[str]:
    if not r.retrieval:
        return []
    return ["", "## Retrieval (each benchmark question's source section is its relevant "
            "document)", "",
            markdown_table(["retriever", *RETRIEVAL_LABELS.values()],
                           [[k, *(number(m.get(c)) for c in RETRIEVAL_LABELS)]
                            for k, m in r.retrieval.items()])]


def _data(r: CompareReport) -> list[str]:
    if not r.distill.get("accepted"):
        return []
    a, st = r.distill["accepted"], r.distill.get("stages", {})
    return ["", "## Data", "", f"- distilled samples: {a['total']} ({a['mc']} multiple-"
            f"choice, {a['nd']} open), {a['train']} for training, "
            f"{a['benchmark_items']} benchmark items from held-out sections, "
            f"{a.get('seen_items', 0)} held-out items about trained sentences",
            *(["- held-out items are asked as \"Which statement about <section> is "
               "correct?\" over the text's sentence and three copies with a number, an "
               "opposite or a term changed (distill.benchmark_items: statement, no model "
               f"call); {st['seen_distractors_also_trained']} of the seen items' wrong options "
               "also stood in a training item"] if "statement_unseen" in st else []),
            "- details: [distill/report.md](distill/report.md)"]


def _training(r: CompareReport) -> list[str]:
    t = r.train
    if not t:
        return []
    fin = t.get("final", {})
    return ["", "## Training", "", f"- {t.get('steps')} steps on "
            f"{t.get('train_examples')} examples, {t.get('device')} {t.get('dtype')}, "
            f"{number(t.get('tokens_per_s'))} tokens/s, padding share "
            f"{percent(t.get('padding_share'))}",
            f"- final loss {number(fin.get('loss'))}, eval loss "
            f"{number(fin.get('eval_loss'))}, held-out accuracy at the last "
            f"step (train.domain_eval's items, cloze_norm): unseen "
            f"{percent(fin.get('domain_accuracy'))}"
            + (f", seen {percent(fin.get('domain_accuracy_seen'))}"
               if "domain_accuracy_seen" in fin else ""),
            *([f"- the adapter evaluated is step {t['adapter_step']}'s, the best mean "
               f"held-out accuracy by step ({percent(t.get('domain_accuracy_best'))}; "
               "train.domain_eval.keep_best, on items after the ones scored above)"]
              if t.get("adapter_step") not in (None, t.get("steps")) else []),
            "- curves: ![training](adapter/training_curves.png)"]


def _stage_times(r: CompareReport) -> list[str]:
    return ["", "## Stage times (s)", "",
            markdown_table(["stage", "seconds"], r.stage_seconds.items())]
