"""The adapter folder a training writes: the PEFT weights (safetensors only), the tokenizer,
the manifest, per-step metrics, the training curves and a model card; written atomically."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from workbench.io import atomic_savefig, atomic_write_json, replace_dir
from workbench.text import number, percent


def export_adapter(model, tok, output: Path, manifest: dict, metrics: list[dict]) -> None:
    """Write the adapter folder atomically: safetensors only, model card, manifest."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.parent / f".{output.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    atomic_write_json(tmp / "manifest.json", manifest)
    with open(tmp / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in metrics)
    _plot_curves(metrics, tmp / "training_curves.png")
    (tmp / "README.md").write_text(model_card(manifest, metrics))
    replace_dir(tmp, output)


def model_card(manifest: dict, metrics: list[dict]) -> str:
    o = manifest["outputs"]
    final = o.get("final", {})
    lines = ["---", "library_name: peft", f"base_model: {o['base_model']}",
             f"tags: [lora, workbench, {manifest['config'].get('method', 'sft')}]", "---",
             "", f"# LoRA adapter for {o['base_model']}",
             "", "Trained with the Domain-Agent Workbench (`workbench train`).", "",
             f"- base model: `{o['base_model']}` ({o['model_source']})",
             f"- chat template fingerprint: `{o['chat_template_fingerprint']}`",
             f"- data sha256: `{manifest['input_hashes']['data']}`",
             (f"- steps: {o['steps']}, train examples: {o['train_examples']}, "
              f"eval examples: {o['eval_examples']}"),
             f"- device: {o['device']} ({o['dtype']})"]
    if "adapter_step" in o:  # GRPO: which step's adapter this is, and its held-out reward
        lines.append(f"- adapter of step {o['adapter_step']} (held-out reward "
                     f"{o.get('heldout_reward_best')}, at the start "
                     f"{o.get('heldout_reward_start')})")
    also = sorted(k for k in final if k.startswith("domain_accuracy_"))
    for k in ("loss", "eval_loss", "domain_accuracy", *also, "reward_accuracy",
              "reward_margin", "eval_reward_accuracy", "eval_preference_accuracy",
              "reward_mean", "heldout_reward"):
        if k in final:
            value = percent(final[k]) if "accuracy" in k else number(final[k], 4)
            lines.append(f"- final {k.replace('_', ' ')}: {value}")
    lines += ["", "Hyper-parameters: see `manifest.json`; per-step metrics: `metrics.jsonl`."]
    return "\n".join(lines) + "\n"


def _plot_curves(metrics: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if not metrics:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], label="train loss")
    ev = [m for m in metrics if "eval_loss" in m]
    if ev:
        ax.plot([m["step"] for m in ev], [m["eval_loss"] for m in ev], "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    dom = [m for m in metrics if "domain_accuracy" in m]
    rew = [m for m in metrics if "reward_accuracy" in m]
    grpo = [m for m in metrics if "reward_mean" in m]
    if grpo:  # GRPO: the rollouts' mean reward and the held-out reward
        ax2 = ax.twinx()
        ax2.plot([m["step"] for m in grpo], [m["reward_mean"] for m in grpo], ".-",
                 color="tab:purple", label="rollout reward")
        held = [m for m in grpo if "heldout_reward" in m]
        if held:
            ax2.plot([m["step"] for m in held], [m["heldout_reward"] for m in held], "s--",
                     color="tab:green", label="held-out reward")
        ax2.set_ylabel("reward")
        ax2.legend(loc="lower left")
    elif dom or rew:
        ax2 = ax.twinx()
        if dom:
            ax2.plot([m["step"] for m in dom], [m["domain_accuracy"] for m in dom], "s--",
                     color="tab:green", label="domain accuracy")
            for k in sorted({k for m in dom for k in m if k.startswith("domain_accuracy_")}):
                pts = [m for m in dom if k in m]
                ax2.plot([m["step"] for m in pts], [m[k] for m in pts], "^:",
                         label=k.replace("domain_accuracy_", "domain accuracy, "))
        if rew:  # DPO: the share of pairs whose chosen reward is above the rejected one
            ax2.plot([m["step"] for m in rew], [m["reward_accuracy"] for m in rew], ".-",
                     color="tab:purple", label="reward accuracy")
        ax2.set_ylabel("accuracy")
        ax2.set_ylim(0, 1)
        ax2.legend(loc="lower left")
    ax.legend(loc="upper right")
    fig.tight_layout()

    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
