"""`workbench train ...` commands besides `run` (which the registry adds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli_options import ConfigArg, SetOpt
from workbench.config import load_config
from workbench.domain_packs import load_pack
from workbench.errors import WorkbenchError
from workbench.formats import read_dataset
from workbench.io import atomic_write_text, check_replaceable
from workbench.models.local import model_folder
from workbench.models.resolve import resolve_chat_model
from workbench.progress import quiet_libraries
from workbench.train.api import training_data
from workbench.train.data import load_examples
from workbench.train.data import preview as render
from workbench.train.gguf_export import export_gguf, export_lora_gguf
from workbench.train.merge import merge_adapter
from workbench.train.preference import load_pairs, preview_pair
from workbench.train.steppairs import step_pairs


def register(group: typer.Typer) -> None:
    @group.command("preview")
    def preview(config: ConfigArg = None, set_: SetOpt = None,
                index: Annotated[int, typer.Option(help="Which example.")] = 0):
        """Print one training example as the model sees it, trained spans in [[ ]] (with
        train.method=dpo: one pair, its chosen and its rejected side)."""
        from transformers import AutoTokenizer

        cfg = load_config(config, set_)
        tok = AutoTokenizer.from_pretrained(model_folder(resolve_chat_model(
            cfg.models.chat.spec)))
        if cfg.train.chat_template:
            tok.chat_template = cfg.train.chat_template
        tc = cfg.train.model_copy(update={"data": training_data(cfg, cfg.layout)})
        if tc.method == "dpo":
            pairs = load_pairs(tc.data)
            if not 0 <= index < len(pairs):
                raise WorkbenchError(f"--index {index}: the data has {len(pairs)} pairs")
            typer.echo(preview_pair(tok, pairs[index]))
            return
        _, examples = load_examples(tc)
        if not 0 <= index < len(examples):
            raise WorkbenchError(f"--index {index}: the data has {len(examples)} examples")
        typer.echo(render(tok, examples[index]))

    @group.command("pairs")
    def pairs(trajectories: Annotated[Path, typer.Argument(
                  help="Agent trajectories: a messages/ShareGPT JSONL with tool calls (e.g. "
                       "trajsynth's sft.jsonl or a domain agent's SFT export).")],
              out: Annotated[Path, typer.Option("--out", "-o", help="Preference JSONL to "
                                                                     "write.")],
              per_step: Annotated[int, typer.Option(min=1, max=20, help="Pairs per expert "
                                                                        "step.")] = 1,
              final_tool: Annotated[list[str] | None, typer.Option(
                  help="Tools whose call is the answer (never offered as a wrong tool); "
                       "repeatable.")] = None,
              seed: Annotated[int, typer.Option(help="Seed of the perturbation choices.")] = 0):
        """Step-level preference pairs (Agentic-DPO): at every expert tool call, the expert's
        call against a wrong one that still fits the tool's schema (a step's own
        alternatives first, then another table, operator, argument value or tool). Train on
        them with `train run -s train.method=dpo -s train.data=OUT`."""
        check_replaceable(out)
        made, report = step_pairs(read_dataset(trajectories), per_step=per_step, seed=seed,
                                  final_tools=final_tool or ())
        atomic_write_text(out, "".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n"
                                       for p in made))
        kinds = ", ".join(f"{k} {v}" for k, v in report["by_kind"].items()) or "none"
        typer.echo(f"{report['pairs']} pairs from {report['steps']} expert steps of "
                   f"{report['examples']} trajectories ({kinds}); "
                   f"{report['steps_without_pair']} steps had no wrong call that fits the "
                   f"schema; written to {out}")

    @group.command("export-gguf")
    def export_gguf_cmd(
            adapter: Annotated[Path, typer.Argument(help="Adapter folder (e.g. "
                                                         "runs/NAME/adapter).")],
            out: Annotated[Path, typer.Option("--out", "-o", help="The .gguf file to write.")],
            base: Annotated[str | None, typer.Option(
                help="Base model spec, a GGUF (default: the adapter's manifest says which).")]
            = None,
            out_type: Annotated[str, typer.Option("--type", help="Weights: f16 (default), "
                                                                  "f32 or q8_0.")] = "f16",
            check: Annotated[bool, typer.Option(help="Load the file back through the "
                                                     "workbench's GGUF path and compare its "
                                                     "greedy answers with the merged "
                                                     "model's.")] = True,
            lora: Annotated[bool, typer.Option(
                "--lora", help="Write the adapter alone as a GGUF LoRA adapter (no merge): "
                               "llama.cpp's --lora, Ollama's ADAPTER, and what the workbench's "
                               "llama.cpp backend applies at run time.")] = False):
        """Merge an adapter into its base model and write one GGUF file that llama.cpp and
        Ollama load (`ollama create NAME -f Modelfile` with `FROM ./file.gguf`). The tokenizer,
        chat template and hyper-parameters come from the base model's own GGUF; the weights
        are the merged ones, in llama.cpp's layout. Then (unless --no-check) the file is
        loaded back and its greedy answers compared with the merged model's: f32 must give
        the same answers; f16 and q8_0 round the weights, so they must rank the merged
        answers' next tokens first at 95% of positions (exit 1 otherwise)."""
        quiet_libraries()
        if lora:
            rep = export_lora_gguf(adapter, out, base=base)
            typer.echo(f"{out}: GGUF LoRA adapter, {rep['tensors']} tensors, "
                       f"{rep['bytes'] / 1e6:.1f} MB, alpha {rep['alpha']:g} (base "
                       f"{rep['base']})")
            return
        rep = export_gguf(adapter, out, base=base, out_type=out_type, check=check,
                          log=lambda m: typer.echo(m, err=True))
        c = rep.get("check")
        typer.echo(f"{out}: {rep['bytes'] / 1e6:.0f} MB, {rep['tensors']} tensors ({out_type})"
                   + (f"; greedy answers {c['same_answers']}/{c['prompts']} the same as the "
                      f"merged model's; top-1 agreement {c['top1_agree']}/{c['top1_tokens']} "
                      "tokens" if c else ""))
        # f32 holds the merged weights exactly: any difference is a defect. f16 and q8_0
        # round them, which can move a greedy answer; most next-token choices must hold.
        if c and (c["same_answers"] < c["prompts"] if out_type == "f32"
                  else c["top1_agree"] < 0.95 * c["top1_tokens"]):
            typer.echo("the GGUF file does not answer as the merged model does", err=True)
            raise typer.Exit(1)

    @group.command("merge")
    def merge(adapter: Annotated[Path, typer.Argument(help="Adapter folder.")],
              out: Annotated[Path, typer.Option("--out", "-o", help="Merged model folder.")],
              base: Annotated[str, typer.Option(help="Base model spec.")] = "default",
              domain: Annotated[str, typer.Option(
                  help="Domain pack whose train.parity_prompts check the merge.")] = "generic"):
        """Merge an adapter into its base model; refuses unless logits match within 1e-4 on
        the domain pack's parity prompts."""
        quiet_libraries()
        rep = merge_adapter(base, adapter, out, prompts=load_pack(domain).train.parity_prompts)
        typer.echo(f"merged into {out}; max |logit diff| {rep['max_abs_logit_diff']:.2e}")
