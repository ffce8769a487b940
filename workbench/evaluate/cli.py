"""`workbench eval ...` commands besides `run` (which the registry adds)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.evaluate import lm_eval_export


def register(group: typer.Typer) -> None:
    @group.command("export-lm-eval")
    def export_lm_eval(
            source: Annotated[Path, typer.Argument(
                help="A run folder (its distilled benchmark) or a benchmark file (ours, or "
                     "MMLU/ARC-style JSONL or CSV).")],
            out: Annotated[Path, typer.Option("--out", "-o", help="The task folder to write "
                                                                "(made if missing).")],
            name: Annotated[str | None, typer.Option(
                help="Task name (default: the run's or the file's name).")] = None):
        """Write the benchmark as an lm-evaluation-harness task folder: `lm_eval
        --include_path OUT --tasks NAME` runs it as it is (NAME_letter: the letter after the
        options; NAME_cloze: the option texts), with the prompts `workbench eval` scores
        under eval.template=raw."""
        items, default = lm_eval_export.benchmark_of(source)
        done = lm_eval_export.export_lm_eval(items, out, name or default)
        extra = (f"; {done['skipped_multi_answer']} items with more than one answer left "
                 "out") if done["skipped_multi_answer"] else ""
        typer.echo(f"{done['items']} items -> {out} (tasks {', '.join(done['tasks'])}, group "
                   f"{done['group']}){extra}\nrun: lm_eval --model hf --model_args "
                   f"pretrained=MODEL --include_path {out} --tasks {done['group']}")
