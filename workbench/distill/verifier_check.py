"""The distillation verifier checked against a person: its accept/reject decisions, rated.

The verifier answers each multiple-choice item with the text it was written from; an item
whose answer is not the keyed one is rejected (`distill.verifier.on_disagree: reject`, the
default) or kept with the flag `verifier_disagrees` (`flag`). Its decision stands for "this
item is correct and answerable from the text", so that is what a person is asked, seeing
what the verifier saw (the section's text, the question, the options) and the keyed answer,
never the verifier's verdict (`workbench.evaluate.agreement` does the rest).

The decisions that count are the verifier's own: every multiple-choice sample it checked and
kept (`mcQTSA.jsonl`, a verifier in its provenance: yes; flagged `verifier_disagrees`: no)
and the items it rejected. Format rejections, gate removals and answerer disagreements are
decided before the verifier by other checks (the parsers' and the gates' rules, which a
reader checks in report.md and gates.jsonl); open-ended (nd) samples are never verified.

A run keeps what a person needs to see of each item the verifier rejected in
`verifier.jsonl` (the text it read, question, options, keyed and verifier letters), so its
"no"s are rated beside its "yes"s and the check gives kappa. A run made before that file
existed keeps no options of its rejections: only its kept samples can be shown, and their
ratings give the precision of the verifier's yeses with a Wilson interval.
Ratings live in `<run>/distill/verifier_ratings.jsonl`, append-only (the last one of an item
counts); a sample's id hashes its task and question, so a re-distillation that changes an
item leaves its old ratings uncounted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, Field

from workbench.distill.api import load_samples, read_report
from workbench.distill.config import DistillConfig
from workbench.distill.parse import format_options
from workbench.distill.spec import PIPELINE as DISTILL
from workbench.distill.write import Stats, make_spans
from workbench.errors import WorkbenchError
from workbench.evaluate.agreement import (
    Check,
    Decision,
    Decisions,
    Reading,
    Shown,
    agreement_lines,
    reading,
)
from workbench.io import read_jsonl
from workbench.records import Section, read_records
from workbench.runs import RunLayout, outputs_at
from workbench.text import percent_interval

RATINGS = DISTILL.artifact("verifier_ratings").path  # declared beside the verifier rows
QUESTION = "Is this sample correct and answerable from the text?"
DEFAULT_SAMPLE = 30
WHAT = "the verifier"


class VerifierDecisions(Decisions):
    """The verifier's decisions in one distillation run that a person can be shown."""

    RATINGS: ClassVar[str] = RATINGS
    SAMPLE: ClassVar[int] = DEFAULT_SAMPLE
    folder: Path = Field(description="The run's distill folder.")
    verifier: str = Field(description="The verifier's model identity and method.")
    on_disagree: str
    checked: int = Field(description="Items the verifier checked (the report's count).")
    not_kept: int = Field(description="Its rejections, which the run keeps too little of to "
                                      "show a person.")

    def whose(self) -> str:
        return f"an item the verifier decided in {self.folder}"


class VerifierCheck(BaseModel):
    """Where the check of one run stands: its decisions, the sample and what they say."""

    decisions: VerifierDecisions
    check: Check
    reading: Reading


def distill_folder(run: str | Path) -> Path:
    """The distill folder of a run folder (or the distill folder itself); one line naming
    the path when it is neither."""
    run = Path(run)
    if not run.is_dir():
        why = "not a folder" if run.exists() else "no such folder"
        raise WorkbenchError(f"{run}: not a run folder ({why})")
    for folder in (RunLayout.at(run).folder("distill"), run):
        if outputs_at("distill", folder).path("report").is_file():
            return folder
    raise WorkbenchError(f"{run}: no distillation in it (no distill/report.json); run "
                         "`workbench distill run CONFIG` first")


def verifier_decisions(run: str | Path) -> VerifierDecisions:
    """Every decision of the verifier in the run that a person can be shown."""
    folder = distill_folder(run)
    report, _ = read_report(folder)
    v = report.verifier
    if not v.checked:
        raise WorkbenchError(f"{folder}: the verifier made no decisions in this run (it was "
                             "off, or no multiple-choice item reached it)")
    samples = [s for s in load_samples(folder, reviewed=False)
               if s.kind == "mc" and s.provenance.models.get("verifier")]
    sections = {s.id: s for s in read_records(outputs_at("distill", folder).path("sections"),
                                              Section)}
    spans = _span_texts(folder, [sections[i] for i in
                                 sorted({s.provenance.section_id for s in samples})
                                 if i in sections])
    items = []
    for s in samples:
        assert s.options is not None  # an MC sample has its four (QTSASample checks)
        p = s.provenance
        sec = sections.get(p.section_id)
        text = spans.get((p.section_id, p.span_hash)) or (
            sec.text.strip() if sec else "(the section is not in this run's sections.jsonl)")
        keyed = "; ".join(f"{x}) {s.options['ABCD'.index(x)]}" for x in s.answer)
        items.append(Decision(
            key=s.id, machine="verifier_disagrees" not in s.flags,
            decider=f"{p.models['verifier']} ({v.method})",
            shown=[Shown(label="section", text=(sec.title if sec else "") or p.section_id),
                   Shown(label="text", text=text), Shown(label="question", text=s.question),
                   Shown(label="options", text=format_options(s.options)),
                   Shown(label="keyed answer", text=keyed)]))
    rejected = _rejected(folder)
    items += rejected
    not_kept = report.rejects.get("verifier_disagrees", 0) - len(rejected)
    if not items:
        raise WorkbenchError(
            f"{folder}: none of the verifier's {v.checked} decisions can be shown: it "
            f"rejected {not_kept} items, whose options the run does not keep, and no sample "
            "it checked was kept")
    verifier = next((i.decider for i in items), v.method)
    return VerifierDecisions(folder=folder, items=items, verifier=verifier,
                             on_disagree=v.on_disagree, checked=v.checked, not_kept=not_kept,
                             seed=report.seed)


def _rejected(folder: Path) -> list[Decision]:
    """The items the verifier rejected, from `verifier.jsonl` (runs made before it was
    written have none: their check rates the kept samples only)."""
    import hashlib

    path = outputs_at("distill", folder).path("verifier")
    if not path.is_file():
        return []
    out = []
    for row in read_jsonl(path):
        gold = row.get("gold") or ""
        opts = row.get("options") or []
        keyed = "; ".join(f"{x}) {opts['ABCD'.index(x)]}" for x in gold if x in "ABCD"
                          and "ABCD".index(x) < len(opts))
        h = hashlib.sha256(f"{row['task']}\n{row['question']}".encode()).hexdigest()[:12]
        out.append(Decision(
            key=f"rejected-{h}", machine=False, decider=row.get("decider", ""),
            shown=[Shown(label="section", text=row.get("section") or row["section_id"]),
                   Shown(label="text", text=row["text"]),
                   Shown(label="question", text=row["question"]),
                   Shown(label="options", text=format_options(opts)),
                   Shown(label="keyed answer", text=keyed)]))
    return out


def _span_texts(folder: Path, sections: list) -> dict[tuple[str, str], str]:
    """(section id, span hash) -> the text the verifier read: the section, or the part of a
    long one, cut again as the run cut it (its settings are in manifest.json)."""
    try:
        manifest = json.loads(outputs_at("distill", folder).path("manifest").read_text(
            encoding="utf-8"))
        cfg = DistillConfig.model_validate(manifest["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # the whole section's text is shown instead
    return {(sp.section.id, sp.hash): sp.text for sp in make_spans(sections, cfg, Stats())}


def verifier_check(run: str | Path, *, n: int = DEFAULT_SAMPLE) -> VerifierCheck:
    """The run's verifier decisions, the sample of `n` to rate, and the reading so far."""
    d = verifier_decisions(run)
    c = d.check(n)
    return VerifierCheck(decisions=d, check=c, reading=reading(c, what=WHAT))


def summary_lines(vc: VerifierCheck) -> list[str]:
    """The check for a terminal: who decided, how many rated, kappa or precision with its
    95% interval, the confusion table and the reading."""
    d, c = vc.decisions, vc.check
    yes = sum(i.machine for i in d.items)
    done, size = c.progress
    lines = [(f"verifier {d.verifier}: {done} of {size} sampled decisions rated by a person "
              f"({c.n_rated} rated in all; the run keeps {len(d.items)} of its decisions: "
              f"{yes} yes, {len(d.items) - yes} no)")]
    if c.mode == "precision":
        why = (f"the run keeps no options of the {d.not_kept} items it rejected"
               if d.not_kept else "it disagreed with none")
        lines.append(f"only its yeses can be rated ({why}): their precision, not kappa; a "
                     "run made with distill.verifier.on_disagree=flag keeps what it disagrees "
                     "with (flagged) and gives kappa")
        p = c.precision
        if p is not None:
            lines.append(f"precision {percent_interval(p.share, p.ci_low, p.ci_high)} (95% "
                         f"Wilson): {p.agreed} of {p.n} accepted samples correct for the "
                         "person")
    elif (a := c.agreement) is not None:
        lines += agreement_lines(a, machine=("verifier yes", "verifier no"),
                                 person=("person yes", "person no"))
    r = vc.reading
    unrated = sum(i.key not in c.rated for i in c.sample)
    tail = (f" (the sample has {unrated} unrated left: raise --sample)"
            if r.more > unrated else "")
    lines.append(f"reading: {r.text}{tail}")
    return lines
