"""The KGV agent's verdicts checked against a person.

Each verdict of a KGV evaluation (one condition's trajectories: the agent by default, or
closed_book, rag, agent_sft) is a yes/no decision: SUPPORTED is yes, REFUTED no. A person
sees what the verdict rests on, the claim as the agent read it and the passages it cited
(with their source; none for a verdict given without searching), never the agent's verdict
nor the claim's gold label, and says whether the claim is true; Cohen's kappa with its
bootstrap interval, the confusion table and the reading (`workbench.evaluate.agreement`) say
how far the verdicts can be trusted. Runs that ended without a verdict are no decision.

Ratings live in `<run>/agent/verdict_ratings.jsonl`, append-only (the last one of an item
counts). An item's key is its condition, claim id and a hash of what the person is shown, so
a re-run whose verdict cites other passages leaves the old rating uncounted.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, Field

from workbench.agent_packs.spec import PIPELINE
from workbench.agents.steps import AgentTrajectory
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
from workbench.runs import RunLayout
from workbench.text import percent_interval

RATINGS = PIPELINE.artifact("verdict_ratings").path  # verdict_ratings.jsonl
QUESTION = "Is the claim true?"
DEFAULT_SAMPLE = 30
WHAT = "the agent"
CONDITIONS = ("agent", "rag", "closed_book", "agent_sft")
NO_EVIDENCE = "(none: the verdict was given without citing a passage)"


class VerdictDecisions(Decisions):
    """One condition's verdicts in a KGV evaluation that a person can be shown."""

    RATINGS: ClassVar[str] = RATINGS
    SAMPLE: ClassVar[int] = DEFAULT_SAMPLE
    folder: Path = Field(description="The run's agent folder.")
    condition: str
    decider: str = Field(description="The model and policy that gave the verdicts.")
    runs: int = Field(description="Trajectories of the condition.")
    no_verdict: int = Field(description="Runs that ended without a verdict (no decision).")
    evidence: str = Field("", description="What the agent searched, when the run says.")

    def whose(self) -> str:
        return f"a verdict of {self.condition} in {self.folder}"


class VerdictCheck(BaseModel):
    """Where the check of one condition stands: its decisions, the sample, the reading."""

    decisions: VerdictDecisions
    check: Check
    reading: Reading


def run_root(run: str | Path) -> Path:
    """The run folder of a KGV evaluation (given as the run folder or its agent/); one line
    naming the path when it is neither."""
    run = Path(run)
    if not run.is_dir():
        why = "not a folder" if run.exists() else "no such folder"
        raise WorkbenchError(f"{run}: not a run folder ({why})")
    if (run / "agent" / "trajectories").is_dir():
        return run
    if run.name == "agent" and (run / "trajectories").is_dir():
        return run.parent
    raise WorkbenchError(f"{run}: no KGV evaluation in it (no agent/trajectories/); run "
                         "`workbench agent eval kgv CONFIG` first")


def conditions_in(run: str | Path) -> list[str]:
    """The conditions whose verdicts the run holds, in CONDITIONS' order."""
    lay = RunLayout.at(run_root(run))
    return [c for c in CONDITIONS if lay.has("agent", c)]


def verdict_decisions(run: str | Path, condition: str = "agent") -> VerdictDecisions:
    """Every verdict of `condition` in the run, as a decision a person can be shown."""
    if condition not in CONDITIONS:
        raise WorkbenchError(f"condition {condition!r}: one of {', '.join(CONDITIONS)}")
    root = run_root(run)
    lay = RunLayout.at(root)
    if not lay.has("agent", condition):
        here = ", ".join(conditions_in(root)) or "none"
        raise WorkbenchError(f"{root}: no {condition} verdicts in it (conditions here: "
                             f"{here})")
    path = lay.artifact("agent", condition)
    trajs = read_jsonl(path, AgentTrajectory.model_validate)
    items, sources = [], set()
    for t in trajs:
        label = (t.final or {}).get("label")
        if label not in ("SUPPORTED", "REFUTED"):
            continue
        items.append(_decision(t, condition, label == "SUPPORTED"))
        sources.add(str(t.metadata.get("evidence_source") or ""))
    if not items:
        raise WorkbenchError(f"{path}: none of its {len(trajs)} runs gave a verdict; nothing "
                             "to check")
    return VerdictDecisions(folder=lay.folder("agent"), condition=condition, items=items,
                            decider=items[0].decider, runs=len(trajs),
                            no_verdict=len(trajs) - len(items),
                            evidence="; ".join(sorted(s for s in sources if s)))


def _decision(t, condition: str, supported: bool) -> Decision:
    """A verdict as the person sees it: the claim and the cited passages, never the verdict
    (nor the gold label)."""
    claim = str(t.metadata.get("verbal") or t.messages[1].content)
    cited = _cited(t)
    evidence = "\n\n".join(f"[{p['id']}] {p['source'] or p['doc']}\n{p['text'].strip()}"
                           for p in cited) or NO_EVIDENCE
    digest = hashlib.sha256(f"{claim}\x1f{evidence}".encode()).hexdigest()[:12]
    return Decision(key=f"{condition}:{t.task_id}:{digest}", machine=supported,
                    decider=f"{t.model} ({t.policy} policy)",
                    shown=[Shown(label="claim", text=claim),
                           Shown(label="evidence cited", text=evidence)])


_HIT = re.compile(r"^\[(\S+)\] (?:\(([^)]*)\) )?(.*)$")


def _cited(t) -> list[dict[str, str]]:
    """The passages the verdict cites, with their source: as the run recorded them, or (a
    run made before they were recorded) the snippets its searches showed."""
    rec = t.metadata.get("cited")
    if isinstance(rec, list):
        return [{"id": str(p.get("id", "")), "doc": str(p.get("doc", "")),
                 "source": str(p.get("source", "")), "text": str(p.get("text", ""))}
                for p in rec if isinstance(p, dict)]
    seen: dict[str, dict[str, str]] = {}
    for s in t.steps:
        if s.kind == "observation" and s.tool == "search" and not s.error:
            for line in s.content.splitlines():
                if (m := _HIT.match(line)) and m.group(1) not in seen:
                    seen[m.group(1)] = {"id": m.group(1), "doc": m.group(1),
                                        "source": m.group(2) or "", "text": m.group(3)}
    ids = (t.final or {}).get("evidence") or []
    return [seen[i] for i in ids if isinstance(i, str) and i in seen]


def verdict_check(run: str | Path, *, condition: str = "agent", n: int = DEFAULT_SAMPLE
                  ) -> VerdictCheck:
    """The condition's verdicts, the sample of `n` to rate, and the reading so far."""
    d = verdict_decisions(run, condition)
    c = d.check(n)
    return VerdictCheck(decisions=d, check=c, reading=reading(c, what=WHAT))


def summary_lines(vc: VerdictCheck) -> list[str]:
    """The check for a terminal: whose verdicts, how many rated, kappa with its 95% interval,
    the confusion table and the reading."""
    d, c = vc.decisions, vc.check
    yes = sum(i.machine for i in d.items)
    done, size = c.progress
    lines = [(f"{d.condition} verdicts of {d.decider}: {done} of {size} sampled verdicts "
              f"rated by a person ({c.n_rated} rated in all; {len(d.items)} verdicts: {yes} "
              f"SUPPORTED, {len(d.items) - yes} REFUTED"
              + (f"; {d.no_verdict} runs gave none" if d.no_verdict else "") + ")")]
    if d.evidence:
        lines.append(f"evidence searched: {d.evidence}")
    if c.mode == "precision":  # every verdict SUPPORTED: kappa has nothing to compare
        lines.append("every verdict is SUPPORTED: the precision of its verdicts, not kappa")
        if (p := c.precision) is not None:
            lines.append(f"precision {percent_interval(p.share, p.ci_low, p.ci_high)} (95% "
                         f"Wilson): {p.agreed} of {p.n} SUPPORTED claims true for the person")
    elif (a := c.agreement) is not None:
        lines += agreement_lines(a, machine=("agent SUPPORTED", "agent REFUTED"),
                                 person=("person true", "person false"))
    r = vc.reading
    unrated = sum(i.key not in c.rated for i in c.sample)
    tail = (f" (the sample has {unrated} unrated left: raise --sample)"
            if r.more > unrated else "")
    lines.append(f"reading: {r.text}{tail}")
    return lines
