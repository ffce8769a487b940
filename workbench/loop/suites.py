"""The suites a round is judged on, and one evaluation of a model on all of them.

- dev: MC items whose failures the round mines (its reasoning corrections train on them);
- test: MC items of the same subsets about other terms, never trained on: the guards and
  deltas use them;
- retention: MC items of another domain that must not get worse;
- open_dev / open: open questions with rubrics (HealthBench's score) about dev terms (mined)
  and about test terms (judged only: rubric score, answer length, termination).

Every row is an `EvalResult` whose condition is the suite and `extra.subset` the subset, so
the per-subset figures and paired deltas come from plain files.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import workbench
from workbench.corpus import load_sections
from workbench.errors import DataError, WorkbenchError
from workbench.evaluate.benchmark import load_benchmark
from workbench.evaluate.mc import evaluate_mc
from workbench.io import describe_validation_error, read_jsonl, sha256_file
from workbench.loop.rubric import OpenQuestion, judge_all, rubric_score
from workbench.models.base import ChatModel, GenerationParams
from workbench.records import EvalResult, MCItem, Provenance, Section

OPEN_SYSTEM = "Answer the medical question accurately and briefly."


def subset_of(item: MCItem) -> str:
    return (item.provenance.doc_id if item.provenance and item.provenance.doc_id else "all")


@dataclass
class Suites:
    dev: list[MCItem]
    test: list[MCItem]
    retention: list[MCItem]
    open: list[OpenQuestion]
    open_dev: list[OpenQuestion]
    sections: list[Section]
    retention_data: Path | None
    digest: str  # hash of every file and the sampling settings
    guarded: frozenset[str] = frozenset()  # term ids of every test item and judged question

    @property
    def subsets(self) -> list[str]:
        return sorted({subset_of(i) for i in self.test})

    def items(self, suite: str) -> list[MCItem]:
        return {"dev": self.dev, "test": self.test, "retention": self.retention}[suite]

    def opens(self, suite: str) -> list[OpenQuestion]:
        return {"open": self.open, "open_dev": self.open_dev}[suite]

    def judged_questions(self) -> list[str]:
        """Every question a candidate is judged on: none may reach its training data."""
        return [it.question for it in self.test + self.retention] + [
            q.question for q in self.open]

    def training_sections(self) -> list[Section]:
        """The sections synthesis may draw on: all but the guarded (test) terms'."""
        return [s for s in self.sections if _term_of(s) not in self.guarded]

    def section(self, section_id: str | None) -> Section | None:
        if section_id is None:
            return None
        if not hasattr(self, "_by_term"):
            self._by_term = {_term_of(s): s for s in self.sections}
        return self._by_term.get(section_id)

    def section_by_id(self, section_id: str) -> Section | None:
        if not hasattr(self, "_by_id"):
            self._by_id = {s.id: s for s in self.sections}
        return self._by_id.get(section_id)


def _term_of(s: Section) -> str | None:
    """The HPO-style id a section states ("HPO ID: HP:0001627."), else its own id."""
    import re

    m = re.search(r"\bID: ([A-Za-z]+:\d+)", s.text)
    return m.group(1) if m else s.id


def _balanced(items: list[MCItem], per_subset: int | None, seed: int) -> list[MCItem]:
    if per_subset is None:
        return items
    groups: dict[str, list[MCItem]] = defaultdict(list)
    for it in items:
        groups[subset_of(it)].append(it)
    out = []
    for name in sorted(groups):
        g = sorted(groups[name], key=lambda it: hashlib.sha256(
            f"{seed}:{it.id}".encode()).hexdigest())
        out += sorted(g[:per_subset], key=lambda it: it.id)
    return out


def _mc(path: Path, subset: str | None = None) -> list[MCItem]:
    items = read_jsonl(path, MCItem.model_validate)
    if subset is not None:  # a retention suite is one subset, whatever its provenance says
        items = [it.model_copy(update={"provenance": (it.provenance or Provenance(
            section_id=it.id, span_hash="")).model_copy(update={"doc_id": subset})})
                 for it in items]
    return items


def shipped(path: str | Path) -> Path:
    """A relative path as given when it exists from the working folder, else inside the
    source checkout the workbench runs from (where `datasets/` ships), so a job started
    from the app (whose working folder is its workspace) finds the bundled data."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p

    alt = Path(workbench.__file__).resolve().parents[1] / p
    return alt if alt.exists() else p


MC_SUFFIXES = (".jsonl", ".csv", ".tsv", ".json")


def _find(data: Path, stem: str, suffixes=MC_SUFFIXES) -> Path | None:
    return next((data / f"{stem}{x}" for x in suffixes if (data / f"{stem}{x}").is_file()),
                None)


def _items(path: Path) -> list[MCItem]:
    """MC items in any layout `workbench eval` reads (ours, MMLU/ARC JSONL or CSV); a
    `subset` (or `subject`) field names each item's subset."""
    return load_benchmark(path)


def load_suites(settings, *, seed: int = 0) -> Suites:
    """The suites a `loop.suites` section names. The folder holds MC items as dev.* and
    test.* (dev: mined and trained on; test: judged only), or as one items.* split in half
    per subset by a seeded draw; optionally open questions (open.jsonl or open.csv); and the
    corpus/ synthesis draws on (any format the corpus reader takes)."""
    data = shipped(settings.data)
    dev_f, test_f, items_f = _find(data, "dev"), _find(data, "test"), _find(data, "items")
    open_f = _find(data, "open", (".jsonl", ".csv"))
    corpus = data / "corpus"
    if not ((dev_f and test_f) or items_f) or not corpus.is_dir():
        raise WorkbenchError(
            f"loop.suites.data: {data} needs MC items (dev.jsonl and test.jsonl, or one "
            "items.jsonl / items.csv split for you; MMLU/ARC layouts as they come, a subset "
            "column naming each item's subset) and a corpus/ folder; open.jsonl or open.csv "
            "(questions with rubrics) is optional. See docs/your-data.md.")
    per = settings.max_items_per_subset
    if dev_f and test_f:
        dev_all, all_test = _items(dev_f), _items(test_f)
    else:
        assert items_f is not None  # checked above: dev and test, or items
        every = _items(items_f)
        by_subset: dict[str, list[str]] = defaultdict(list)
        for it in every:
            by_subset[subset_of(it)].append(it.id)
        test_ids: set[str] = set()
        for name in sorted(by_subset):
            _, rest = seeded_split(by_subset[name], 0.5, seed)
            test_ids |= set(rest)
        dev_all = [it for it in every if it.id not in test_ids]
        all_test = [it for it in every if it.id in test_ids]
    dev = _balanced(dev_all, per, seed)
    test = _balanced(all_test, per, seed)
    overlap = {it.id for it in dev} & {it.id for it in test}
    if overlap:
        raise WorkbenchError(f"{data}: dev and test share items ({sorted(overlap)[:3]}); the "
                             "guards need a test suite nothing trains on")
    retention = _mc(shipped(settings.retention), "retention") if settings.retention else []
    every_open = read_open(open_f) if open_f else []

    def capped(split: str) -> list[OpenQuestion]:
        qs = [q for q in every_open if q.split == split]
        if settings.open_items is not None:
            qs = sorted(qs, key=lambda q: hashlib.sha256(f"{seed}:{q.id}".encode())
                        .hexdigest())[:settings.open_items]
        return sorted(qs, key=lambda q: q.id)

    opens, open_dev = capped("test"), capped("dev")
    guarded = frozenset({it.provenance.section_id for it in all_test if it.provenance}
                        | {q.term for q in every_open if q.split == "test" and q.term})
    sections, _ = load_sections(corpus)
    rdata = shipped(settings.retention_data) if settings.retention_data else None
    if rdata is not None and not rdata.exists():
        raise WorkbenchError(f"loop.suites.retention_data: {rdata} does not exist")
    files = [f for f in (dev_f, test_f, items_f, open_f) if f] + sorted(
        f for f in corpus.rglob("*") if f.is_file())
    if settings.retention:
        files.append(shipped(settings.retention))
    if rdata:
        files.append(rdata)
    h = hashlib.sha256(settings.model_dump_json().encode() + str(seed).encode())
    for f in files:
        h.update(sha256_file(f).encode())
    return Suites(dev=dev, test=test, retention=retention, open=opens, open_dev=open_dev,
                  sections=sections,
                  retention_data=rdata, digest=h.hexdigest()[:16], guarded=guarded)


def read_open(path: Path) -> list[OpenQuestion]:
    """Open questions: `OpenQuestion` JSONL, or a CSV with columns question, subset, split
    (dev/test, default test), reference, and either rubric (a JSON list of {criterion,
    points, keywords}) or keywords ("distend; collaps": one +2 item per keyword group)."""
    import csv
    import io
    import json

    if path.suffix.lower() == ".jsonl":
        return read_jsonl(path, OpenQuestion.model_validate)

    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte {e.start})", path=str(path),
                        code="bad_encoding") from None
    reader = csv.reader(io.StringIO(text))
    header = [h.strip().lower() for h in next(reader, [])]
    out = []
    for cells in reader:
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        if len(cells) > len(header):
            raise DataError(f"{len(cells)} cells for {len(header)} columns (quote a cell "
                            "that holds a comma)", path=str(path), line=line,
                            code="bad_record")
        row = {h: c.strip() for h, c in zip(header, cells, strict=False)}
        try:
            if row.get("rubric"):
                rubric = json.loads(row["rubric"])
            elif row.get("keywords"):
                rubric = [{"criterion": f"Mentions {k.strip()!r}", "points": 2,
                           "keywords": [w.strip() for w in k.split("/") if w.strip()]}
                          for k in row["keywords"].split(";") if k.strip()]
            else:
                raise DataError("no rubric or keywords column value", path=str(path),
                                line=line, code="bad_record")
            out.append(OpenQuestion.model_validate({
                "id": row.get("id") or f"{path.stem}-{line}", "question": row.get("question"),
                "subset": row.get("subset") or "all", "term": row.get("term") or None,
                "reference": row.get("reference", ""), "split": row.get("split") or "test",
                "rubric": rubric}))
        except DataError:
            raise
        except json.JSONDecodeError as e:
            raise DataError(f"rubric is not JSON ({e.msg})", path=str(path), line=line,
                            code="bad_record") from None
        except ValueError as e:
            raise DataError(f"not an open question ({describe_validation_error(e)})",
                            path=str(path), line=line, code="bad_record") from None
    return out


# ------------------------------------------------------------------------------ evaluation

def evaluate_suites(model: ChatModel, suites: Suites, settings, *, judge, suites_run:
                    Sequence[str] = ("dev", "test", "retention", "open"), name: str,
                    log=print) -> list[EvalResult]:
    """Every suite's rows; MC by log-likelihood in `settings.scoring`, open questions
    generated greedily and judged item by item."""
    out: list[EvalResult] = []
    formulation = "letter" if settings.scoring == "letter" else "cloze"
    for suite in ("dev", "test", "retention"):
        items = suites.items(suite) if suite in suites_run else []
        if not items:
            continue
        log(f"   {suite}: {len(items)} items")
        rows = evaluate_mc(model, items, condition=suite, methods=("loglik",),
                           formulations=(formulation,), model_name=name)
        for it, r in zip(items, rows, strict=True):
            pred = r.extra["predictions"][settings.scoring]
            r.prediction, r.correct = pred, pred == it.answer
            r.extra = {"subset": subset_of(it), "logprobs": r.extra.get("logprobs", {})}
            out.append(r)
    for suite in ("open_dev", "open"):
        if suite in suites_run and suites.opens(suite):
            log(f"   {suite}: {len(suites.opens(suite))} questions")
            rows = evaluate_open_rubric(model, suites.opens(suite), settings, judge=judge,
                                        name=name)
            for r in rows:
                r.condition = suite
            out += rows
    return out


def evaluate_open_rubric(model: ChatModel, questions: Sequence[OpenQuestion], settings, *,
                         judge, name: str) -> list[EvalResult]:
    convs = [[{"role": "system", "content": OPEN_SYSTEM},
              {"role": "user", "content": q.question}] for q in questions]
    gens = model.generate(convs, GenerationParams(max_tokens=settings.open_max_tokens))
    verdicts = judge_all(judge, [(q.question, g.text, q.rubric)
                                 for q, g in zip(questions, gens, strict=True)])
    out = []
    for q, g, met in zip(questions, gens, verdicts, strict=True):
        score = rubric_score(q.rubric, met)
        out.append(EvalResult(
            example_id=q.id, condition="open", model=name, prediction=g.text[:600],
            gold=q.reference[:300], correct=score >= 0.5, score=score, error=g.error,
            extra={"subset": q.subset, "met": met, "judge": judge.name,
                   "tokens": g.completion_tokens, "finish": g.finish_reason,
                   "unsafe": any(m and i.kind == "safety"
                                 for i, m in zip(q.rubric, met, strict=True))}))
    return out


def per_subset(rows: Sequence[EvalResult]) -> dict[tuple[str, str], dict[str, float]]:
    """(suite, subset) -> {example id: 1/0 (MC) or the rubric score (open)}. The open
    questions count as one subset ("all"): a few a subset tell nothing apart."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        is_open = r.condition in ("open", "open_dev")
        value = r.score if is_open else float(bool(r.correct))
        subset = "all" if is_open else r.extra.get("subset", "all")
        out[(r.condition, subset)][r.example_id] = float(value or 0.0)
    return dict(out)


def seeded_split(ids: Sequence[str], share: float, seed: int) -> tuple[list[str], list[str]]:
    """(first, rest): a seeded share of `ids` (at least one in each when there are two)."""
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    k = max(1, min(len(order) - 1, round(share * len(order)))) if len(order) > 1 else len(order)
    return sorted(order[:k]), sorted(order[k:])
