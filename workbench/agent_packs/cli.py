"""`workbench agent run|eval PACK CONFIG`: run a domain agent on a few inputs and watch its
steps, or evaluate it against its baselines (a registered job: `workbench jobs start agent`);
`workbench agent verdict-check RUN`: a person checks a KGV evaluation's verdicts;
`workbench agent generate-design OUT`: more RF design items from the calculators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from workbench.agent_packs.api import run_inputs
from workbench.agent_packs.rf.generate import write_generated
from workbench.cli_options import ConfigArg, SetOpt, load
from workbench.io import write_jsonl
from workbench.jobs import run_in_process
from workbench.progress import quiet_libraries

PackArg = Annotated[str, typer.Argument(help="The agent pack: kgv, rf or litsearch.")]
IndexOpt = Annotated[Path | None, typer.Option(
    "--index", help="kgv: search this index made by `workbench rag build` instead of the "
                    "data folder's documents or graph facts (agent.index; agent.retriever "
                    "picks keyword, semantic or hybrid).")]


def _cfg(pack: str, config, set_, index: Path | None = None):
    extra = [f"agent.index={json.dumps(str(index))}"] if index is not None else []
    return load(config, None, set_, f"agent.pack={pack}", *extra)


def _show(t) -> str:
    lines = [f"## {t.task_id}: {t.messages[1].content}"]
    form = t.metadata.get("form")
    if form:  # how a KGV claim was read
        lines.append("  read as: " + {"triple": "a triple", "wording": "a sentence in one of "
                                      "the wordings, checked as its triple",
                                      "sentence": "a sentence verified as a whole (search "
                                      "on the sentence, verdict citing the entries read)"}
                     .get(form, form))
    for s in t.steps:
        if s.kind == "tool_call":
            lines.append(f"  {s.turn}. call {s.tool}({s.arguments})"
                         + (f"  ERROR {s.error}" if s.error else ""))
        elif s.kind == "observation":
            lines += [f"     | {x}" for x in s.content.splitlines()[:5]]
        elif s.kind == "final":
            lines.append(f"  {s.turn}. answer {s.arguments}")
        elif s.kind == "plan":
            lines.append(f"  {s.turn}. plan: {' '.join(s.content.split())[:200]}")
        elif s.kind == "error":
            lines.append(f"  {s.turn}. ERROR {s.error}")
    gold = t.metadata.get("claim", {}).get("label")
    verdict = (t.final or {}).get("label", t.final)
    lines.append(f"  -> {verdict} (stop: {t.stop}"
                 + (f"; gold: {gold if not t.task_id.startswith('input-') else 'unknown'}"
                    if gold else "") + f"; {t.tool_calls} tool calls, {t.seconds:.1f} s)")
    for p in t.metadata.get("cited") or ():  # a KGV verdict's evidence, with its source
        lines.append(f"     cites [{p['id']}] {p['source'] or p['doc']}: "
                     f"{' '.join(p['text'].split())[:120]}")
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    @group.command("run")
    def run(pack: PackArg, config: ConfigArg = None, set_: SetOpt = None,
            inputs: Annotated[list[str] | None, typer.Option(
                "--input", "-i", help="kgv: a claim id (kgv-0002), 'subject | predicate | "
                                      "object' or 'Oak is a kind of tree.'; rf: an item id "
                                      "(rfd-000) or a question; "
                                      "litsearch: an intent id (ls-001). Repeatable.")] = None,
            out: Annotated[Path | None, typer.Option(
                help="Also write the trajectories to this JSONL file.")] = None,
            index: IndexOpt = None):
        """Run the agent on a few inputs and print every step (calls, observations, the
        verdict and, for kgv, the passages it cites and the evidence searched)."""
        quiet_libraries()
        if not inputs:
            raise typer.BadParameter("give at least one --input", param_hint="--input")
        trajs = run_inputs(_cfg(pack, config, set_, index), list(inputs),
                           log=lambda m: typer.echo(m, err=True))
        source = next((t.metadata["evidence_source"] for t in trajs
                       if t.metadata.get("evidence_source")), None)
        if source:
            typer.echo(f"evidence: {source}")
        for t in trajs:
            typer.echo(_show(t))
        if out:
            write_jsonl(out, trajs)
            typer.echo(f"wrote {out}")

    @group.command("eval")
    def eval_(pack: PackArg, config: ConfigArg = None, set_: SetOpt = None,
              fresh: Annotated[bool, typer.Option(help="Ignore finished stages.")] = False,
              index: IndexOpt = None):
        """Evaluate the pack's agent against its baselines (closed book, single-turn RAG),
        distil teacher trajectories into a LoRA student and report all side by side with
        intervals. Resumable: finished stages and claims are kept."""
        quiet_libraries()
        result = run_in_process("agent", _cfg(pack, config, set_, index),
                                log=lambda m: typer.echo(m, err=True), fresh=fresh)
        typer.echo(result.message)

    _register_verdict_check(group)
    _register_generate_design(group)


def _register_generate_design(group: typer.Typer) -> None:
    @group.command("generate-design")
    def generate_design(
            out: Annotated[Path, typer.Argument(help="Folder to write design.jsonl into (a new "
                                                     "one, or one this command made).")],
            per_family: Annotated[int, typer.Option(
                "--per-family", help="Items of each of the 8 families (at most 79: the "
                                     "distinct quarter-wave items).")] = 25,
            seed: Annotated[int, typer.Option(help="The draw; the same seed gives the same "
                                                   "items.")] = 0):
        """rf: write seeded design items generated from the calculators (ids
        rfg-sSEED-FAMILY-NNN, none repeating a shipped item), for `agent.data` of the rf
        pack: `workbench agent eval rf CONFIG -s agent.data=OUT`."""
        info = write_generated(out, per_family, seed)
        typer.echo(f"wrote {info['file']}: {info['items']} items ({per_family} per family, "
                   f"seed {seed}); evaluate with: workbench agent eval rf CONFIG "
                   f"-s agent.data={out}")


def _register_verdict_check(group: typer.Typer) -> None:
    @group.command("verdict-check")
    def verdict_check_cmd(
            run: Annotated[Path, typer.Argument(help="Run folder of a KGV evaluation (or its "
                                                     "agent/).")],
            condition: Annotated[str, typer.Option(
                help="Whose verdicts: agent, rag, closed_book or agent_sft.")] = "agent",
            rate: Annotated[bool, typer.Option(
                help="Rate the next sampled verdicts here (y: the claim is true, n: it is "
                     "false, s: skip, q: stop).")] = False,
            by: Annotated[str, typer.Option("--by", help="Who rates (recorded).")] = "",
            sample: Annotated[int, typer.Option(
                "--sample", min=2, max=1000, help="Verdicts to sample (half SUPPORTED where "
                                                  "there are enough).")] = 30):
        """The KGV agent's verdicts checked against a person: Cohen's kappa with its 95%
        interval and the confusion table on a sample of its SUPPORTED/REFUTED verdicts, and
        whether they can be trusted. With --rate, show the next unrated claims with the
        passages the verdict cites (the agent's verdict hidden) and keep your verdicts in
        RUN/agent/verdict_ratings.jsonl."""
        from workbench.agent_packs.kgv.verdict_check import (
            QUESTION,
            WHAT,
            VerdictCheck,
            summary_lines,
            verdict_decisions,
        )
        from workbench.evaluate.agreement import ask_in_terminal, reading

        if rate and not by.strip():
            raise typer.BadParameter("--rate needs --by NAME (recorded)", param_hint="--by")
        d = verdict_decisions(run, condition)
        check = d.check(sample)

        def show(item, c) -> None:
            done, size = c.progress
            typer.echo(f"\n[{done + 1}/{size}]")
            for f in item.shown:
                typer.echo(f"{f.label}:\n{f.text}\n" if "\n" in f.text
                           or f.label.startswith("evidence") else f"{f.label}: {f.text}\n")

        if rate:
            check = ask_in_terminal(
                check, lambda key, verdict: (d.rate(key, verdict, by=by), d.check(sample))[1],
                question=QUESTION, show=show, prompt=typer.prompt, stop_on=(typer.Abort,))
            typer.echo("")
        vc = VerdictCheck(decisions=d, check=check, reading=reading(check, what=WHAT))
        for line in summary_lines(vc):
            typer.echo(line)
