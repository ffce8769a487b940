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
