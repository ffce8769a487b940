"""`workbench distill ...` commands besides `run` (which the registry adds)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(group: typer.Typer) -> None:
    @group.command("export")
    def export(run: Annotated[Path, typer.Argument(help="Run folder (or its distill/).")],
               out: Annotated[Path, typer.Option("--out", "-o", help="JSONL to write.")],
               fmt: Annotated[str, typer.Option("--format", "-f", help="messages, sharegpt "
                                                                       "or alpaca.")]
               = "messages",
               style: Annotated[str, typer.Option(help="instruct (one turn) or thinking "
                                                       "(reasoning channel).")] = "instruct",
               kinds: Annotated[str, typer.Option(help="mc, nd or mc,nd (mixed).")]
               = "mc,nd"):
        """Export training-split samples as an SFT dataset (benchmark sections never
        included)."""
        from workbench.distill.api import export_run

        n = export_run(run, out, fmt=fmt, style=style,
                       kinds=tuple(k.strip() for k in kinds.split(",")))
        typer.echo(f"wrote {n} examples to {out} ({fmt}, {style})")

    @group.command("report")
    def report(run: Annotated[Path, typer.Argument(help="Run folder (or its distill/).")],
               json_out: Annotated[bool, typer.Option("--json")] = False):
        """Print a distillation run's report."""
        from workbench.distill.api import read_report

        data, md = read_report(run)
        typer.echo(data.model_dump_json(indent=2) if json_out else md)

    @group.command("verifier-check")
    def verifier_check_cmd(
            run: Annotated[Path, typer.Argument(help="Run folder (or its distill/).")],
            rate: Annotated[bool, typer.Option(
                help="Rate the next sampled items here (y: the sample is correct and "
                     "answerable from the text, n: it is not, s: skip, q: stop).")] = False,
            by: Annotated[str, typer.Option("--by", help="Who rates (recorded).")] = "",
            sample: Annotated[int, typer.Option(
                "--sample", min=2, max=1000, help="Decisions to sample (half the verifier "
                                                  "agreed with where there are enough).")]
            = 30):
        """The distillation verifier checked against a person: Cohen's kappa with its 95%
        interval and the confusion table on a sample of the verifier's decisions (the
        precision of its accepted samples when the run keeps none it rejected), and whether
        it can be trusted. With --rate, show the next unrated items (the verifier's verdict
        hidden) and keep your verdicts in RUN/distill/verifier_ratings.jsonl."""
        from workbench.distill.verifier_check import (
            QUESTION,
            WHAT,
            VerifierCheck,
            summary_lines,
            verifier_decisions,
        )
        from workbench.evaluate.agreement import ask_in_terminal, reading

        if rate and not by.strip():
            raise typer.BadParameter("--rate needs --by NAME (recorded)", param_hint="--by")
        d = verifier_decisions(run)
        check = d.check(sample)

        def show(item, c) -> None:
            done, size = c.progress
            typer.echo(f"\n[{done + 1}/{size}]")
            for f in item.shown:
                typer.echo(f"{f.label}:\n{f.text}\n" if "\n" in f.text or f.label == "text"
                           else f"{f.label}: {f.text}\n")

        if rate:
            check = ask_in_terminal(
                check, lambda key, verdict: (d.rate(key, verdict, by=by), d.check(sample))[1],
                question=QUESTION, show=show, prompt=typer.prompt, stop_on=(typer.Abort,))
            typer.echo("")
        vc = VerifierCheck(decisions=d, check=check, reading=reading(check, what=WHAT))
        for line in summary_lines(vc):
            typer.echo(line)
