"""`workbench agent run|eval PACK CONFIG`: run a domain agent on a few inputs and watch its
steps, or evaluate it against its baselines (a registered job: `workbench jobs start agent`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.cli_options import ConfigArg, SetOpt, load

PackArg = Annotated[str, typer.Argument(help="The agent pack: kgv, rf or litsearch.")]
def _cfg(pack: str, config, set_):
    return load(config, None, set_, f"agent.pack={pack}")


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
                help="Also write the trajectories to this JSONL file.")] = None):
        """Run the agent on a few inputs and print every step (calls, observations, the
        verdict)."""
        from workbench.domain_agents.api import run_inputs
        from workbench.io import write_jsonl
        from workbench.progress import quiet_libraries

        quiet_libraries()
        if not inputs:
            raise typer.BadParameter("give at least one --input", param_hint="--input")
        trajs = run_inputs(_cfg(pack, config, set_), list(inputs),
                           log=lambda m: typer.echo(m, err=True))
        for t in trajs:
            typer.echo(_show(t))
        if out:
            write_jsonl(out, trajs)
            typer.echo(f"wrote {out}")

    @group.command("eval")
    def eval_(pack: PackArg, config: ConfigArg = None, set_: SetOpt = None,
              fresh: Annotated[bool, typer.Option(help="Ignore finished stages.")] = False):
        """Evaluate the pack's agent against its baselines (closed book, single-turn RAG),
        distil teacher trajectories into a LoRA student and report all side by side with
        intervals. Resumable: finished stages and claims are kept."""
        from workbench.jobs import run_in_process
        from workbench.progress import quiet_libraries

        quiet_libraries()
        result = run_in_process("agent", _cfg(pack, config, set_),
                                log=lambda m: typer.echo(m, err=True), fresh=fresh)
        typer.echo(result.message)
