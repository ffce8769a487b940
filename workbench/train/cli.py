"""`workbench train ...` commands besides `run` (which the registry adds)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def register(group: typer.Typer) -> None:
    @group.command("preview")
    def preview(config: Annotated[Optional[Path], typer.Argument(
                    help="Experiment YAML config.", show_default=False)] = None,
                set_: Annotated[Optional[list[str]], typer.Option(
                    "--set", "-s", help="Override a config key (repeatable).")] = None,
                index: Annotated[int, typer.Option(help="Which example.")] = 0):
        """Print one training example as the model sees it, trained spans in [[ ]]."""
        from transformers import AutoTokenizer

        from workbench.config import load_config
        from workbench.errors import WorkbenchError
        from workbench.models.local import model_folder
        from workbench.models.resolve import resolve_chat_model
        from workbench.train.data import preview as render
        from workbench.train.data import load_examples
        from workbench.train.spec import training_data

        cfg = load_config(config, set_)
        tok = AutoTokenizer.from_pretrained(model_folder(resolve_chat_model(
            cfg.models.chat.spec)))
        if cfg.train.chat_template:
            tok.chat_template = cfg.train.chat_template
        tc = cfg.train.model_copy(update={"data": training_data(cfg, cfg.layout)})
        _, examples = load_examples(tc)
        if not 0 <= index < len(examples):
            raise WorkbenchError(f"--index {index}: the data has {len(examples)} examples")
        typer.echo(render(tok, examples[index]))

    @group.command("merge")
    def merge(adapter: Annotated[Path, typer.Argument(help="Adapter folder.")],
              out: Annotated[Path, typer.Option("--out", "-o", help="Merged model folder.")],
              base: Annotated[str, typer.Option(help="Base model spec.")] = "default",
              domain: Annotated[str, typer.Option(
                  help="Domain pack whose train.parity_prompts check the merge.")] = "generic"):
        """Merge an adapter into its base model; refuses unless logits match within 1e-4 on
        the domain pack's parity prompts."""
        from workbench.domains import load_pack
        from workbench.progress import quiet_libraries
        from workbench.train.merge import merge_adapter

        quiet_libraries()
        rep = merge_adapter(base, adapter, out, prompts=load_pack(domain).train.parity_prompts)
        typer.echo(f"merged into {out}; max |logit diff| {rep['max_abs_logit_diff']:.2e}")
