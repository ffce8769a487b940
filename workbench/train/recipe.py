"""LoRA SFT, read top to bottom: setup, train, cleanup.

CPU runs in fp32; a GPU with bf16 support runs in bf16. Under `torchrun --nproc_per_node N`
(or `accelerate launch`) the same recipe trains with DistributedDataParallel: each rank takes
every N-th micro-batch, gradients are averaged, rank 0 writes checkpoints and the adapter.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.io import atomic_write_json, replace_dir, sha256_file
from workbench.records import RunManifest, library_versions
from workbench.train import checkpoint as ckpt
from workbench.train.config import TrainConfig
from workbench.train.data import (
    Batch, make_batches, template_fingerprint, to_tensors, tokenize_all,
)

# Attention and MLP projections of the common decoder families (Llama/SmolLM/Qwen/Mistral,
# GPT-2, GPT-NeoX, Phi, Falcon); LoRA on the attention projections is the usual default.
DEFAULT_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "phi3": ["qkv_proj", "o_proj"],
    "gpt2": ["c_attn", "c_proj"],
    "gpt_neox": ["query_key_value", "dense"],
    "falcon": ["query_key_value", "dense"],
}


@dataclass
class TrainResult:
    output: Path
    steps: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)


def lr_at(step: int, total: int, base: float, warmup: int, kind: str) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then decay."""
    if warmup and step < warmup:
        return base * (step + 1) / warmup
    if kind == "constant":
        return base
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return base * max(0.0, 1 - progress)
    return base * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def load_examples(cfg: TrainConfig):
    from workbench.formats import read_dataset

    if not cfg.data:
        raise WorkbenchError("train.data is not set: pass a dataset file or a distill run")
    path = Path(cfg.data)
    if path.is_dir():
        for cand in (path / "distill" / "sft" / "instruct_mixed.messages.jsonl",
                     path / "sft" / "instruct_mixed.messages.jsonl"):
            if cand.exists():
                path = cand
                break
        else:
            raise WorkbenchError(f"{cfg.data}: no SFT export found in this run folder")
    return path, read_dataset(path, cfg.data_format)


def _distributed() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            import torch

            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return rank, world


def train(cfg: TrainConfig, *, model_spec: str, output: str | Path, seed: int = 0,
          resume: bool = True, on_step: Callable[[int, dict], None] | None = None,
          fault: Callable[[str], None] | None = None, log=print) -> TrainResult:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.local import model_folder, pick_device, pick_dtype
    from workbench.models.resolve import resolve_chat_model

    # ---------------------------------------------------------------- setup
    output = Path(output)
    rank, world = _distributed()
    source = resolve_chat_model(model_spec)
    if source.kind == "openai":
        raise WorkbenchError("training needs local weights, not an HTTP endpoint")
    folder = model_folder(source)
    tok = AutoTokenizer.from_pretrained(folder)
    if cfg.chat_template:
        tok.chat_template = cfg.chat_template
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    from transformers import AutoConfig

    max_pos = getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings", None)
    data_path, examples = load_examples(cfg)
    tokenized = tokenize_all(tok, examples, max_length=cfg.max_length, max_positions=max_pos,
                             source=str(data_path))
    rng = random.Random(seed)
    order = list(range(len(tokenized)))
    rng.shuffle(order)
    n_eval = int(len(order) * cfg.eval_fraction)
    eval_set = [tokenized[i] for i in sorted(order[:n_eval])]
    train_set = [tokenized[i] for i in sorted(order[n_eval:])]
    if not train_set:
        raise WorkbenchError("no training examples left after the eval split")

    device = pick_device(cfg.device)
    if world > 1 and device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    dtype = pick_dtype(device, cfg.dtype)
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    targets = cfg.lora.target_modules or DEFAULT_TARGETS.get(base.config.model_type)
    if not targets:
        raise WorkbenchError(f"no default LoRA targets for model type "
                             f"{base.config.model_type!r}: set train.lora.target_modules")
    model = get_peft_model(base, LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha,
                                            lora_dropout=cfg.lora.dropout,
                                            target_modules=targets, task_type="CAUSAL_LM"))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant":
                                                                           False})
        model.enable_input_require_grads()
    model.to(device)
    model.config.use_cache = False
    wrapped = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device] if "cuda" in device
                                          else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def epoch_batches(epoch: int) -> list[Batch]:
        return make_batches(train_set, batch_size=cfg.batch_size, max_length=cfg.max_length,
                            packing=cfg.packing, pad_id=tok.pad_token_id, seed=seed,
                            epoch=epoch)

    per_epoch = len(epoch_batches(0))
    micro_per_step = cfg.grad_accum * world
    steps_per_epoch = max(1, per_epoch // micro_per_step)
    total = cfg.max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    warmup = int(total * cfg.warmup_ratio)
    ckpt_dir = output.parent / f".{output.name}.checkpoints"
    start, metrics = 0, []
    if resume and (last := ckpt.latest_checkpoint(ckpt_dir)):
        state = ckpt.load_checkpoint(last, model=model, optimizer=optimizer)
        start, metrics = state["step"], state.get("metrics", [])
        log(f"resuming from {last.name} (step {start} of {total})")
    elif rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    stop = {"flag": False}
    old_handler = signal.signal(signal.SIGTERM, lambda *a: stop.update(flag=True)) \
        if rank == 0 and _main_thread() else None
    writer = _tensorboard(output.parent / f"{output.name}.tensorboard") if rank == 0 else None
    live = output.parent / f"{output.name}.live.jsonl"
    if rank == 0:
        output.parent.mkdir(parents=True, exist_ok=True)
        live.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    bench = _load_benchmark(cfg)

    cache: dict[int, list[Batch]] = {}

    # ---------------------------------------------------------------- train
    model.train()
    t_run = time.perf_counter()
    tokens_real = tokens_padded = 0
    step = start
    for step in range(start, total):
        t0 = time.perf_counter()
        lr = lr_at(step, total, cfg.learning_rate, warmup, cfg.scheduler)
        for g in optimizer.param_groups:
            g["lr"] = lr
        batches = []
        for k in range(cfg.grad_accum):
            gi = step * micro_per_step + k * world + rank
            epoch, pos = divmod(gi, per_epoch)
            if epoch not in cache:
                cache.clear()
                cache[epoch] = epoch_batches(epoch)
            batches.append(cache[epoch][pos])
        n_label = sum(b.n_trained for b in batches)
        loss_sum = 0.0
        for b in batches:
            t = to_tensors(b, device)
            labels = t.pop("labels")
            loss = summed_loss(wrapped if world > 1 else model, t, labels)
            (loss / n_label).backward()
            loss_sum += loss.item()
            tokens_real += b.n_real
            tokens_padded += len(b.input_ids) * len(b.input_ids[0])
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        row = {"step": step + 1, "loss": loss_sum / n_label, "lr": lr, "grad_norm": gnorm,
               "tokens": sum(b.n_real for b in batches), "seconds": time.perf_counter() - t0}
        done = step + 1
        if eval_set and (cfg.eval_every and done % cfg.eval_every == 0 or done == total):
            row["eval_loss"] = _eval_loss(model, eval_set, cfg, tok, device)
        if bench and (cfg.domain_eval.every and done % cfg.domain_eval.every == 0
                      or done == total):
            row["domain_accuracy"] = _domain_eval(model, tok, bench, device)
        metrics.append(row)
        if rank == 0:  # live curves for the app and anyone tailing the run
            with open(live, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        if rank == 0 and (done % cfg.log_every == 0 or done == total):
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in row.items()))
            if writer:
                for k, v in row.items():
                    if k != "step":
                        writer.add_scalar(f"train/{k}", v, done)
        if on_step:
            on_step(done, row)
        want_save = cfg.save_every and done % cfg.save_every == 0 and done < total
        if rank == 0 and (want_save or (stop["flag"] and done < total)):
            ckpt.save_checkpoint(ckpt_dir, done, model=model, optimizer=optimizer,
                                 state={"metrics": metrics, "total": total}, fault=fault)
            ckpt.rotate(ckpt_dir, cfg.save_total_limit)
        if stop["flag"]:
            log(f"stopped by SIGTERM after step {done}; resume with the same command")
            if writer:
                writer.close()
            raise SystemExit(143)
    # ---------------------------------------------------------------- cleanup
    if old_handler is not None:
        signal.signal(signal.SIGTERM, old_handler)
    if writer:
        writer.close()
    elapsed = time.perf_counter() - t_run
    result = TrainResult(output, total, metrics)
    if rank == 0:
        manifest = RunManifest(
            run_id=output.name, kind="train", config=cfg.model_dump(mode="json"),
            input_hashes={"data": sha256_file(data_path)[:16]},
            versions=library_versions("torch", "transformers", "peft"), seed=seed,
            status="completed",
            outputs={"base_model": model_spec, "model_source": source.describe(),
                     "chat_template_fingerprint": template_fingerprint(tok),
                     "steps": total, "train_examples": len(train_set),
                     "eval_examples": len(eval_set), "device": device,
                     "dtype": str(dtype).removeprefix("torch."),
                     "tokens_per_s": tokens_real / elapsed if elapsed else None,
                     "padding_share": 1 - tokens_real / tokens_padded if tokens_padded
                     else None,
                     "final": metrics[-1] if metrics else {}})
        export_adapter(model, tok, output, manifest.to_json(), metrics)
        result.manifest = manifest.to_json()
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return result


def summed_loss(model, inputs: dict, labels):
    """Sum of next-token cross-entropy over the labelled (assistant) positions.

    Where the model exposes its decoder and output embedding (Llama, Qwen, Mistral, Gemma,
    ...), the vocabulary projection runs only on the positions that have a label: the
    prompt's positions never need logits, and the full (batch x length x vocabulary) logits
    tensor, its shifted copy and its softmax are never materialised.
    """
    import torch

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = getattr(inner, "get_decoder", lambda: None)()
    head = inner.get_output_embeddings()
    cfg = inner.config
    fast = decoder is not None and head is not None and not getattr(
        cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) is None
    if not fast:  # generic path (and under DDP, whose forward must run)
        logits = model(**inputs, use_cache=False).logits.float()
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100, reduction="sum")
    hidden = decoder(**inputs, use_cache=False).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _tensorboard(folder: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder))


def _eval_loss(model, eval_set, cfg, tok, device) -> float:
    import torch

    model.eval()
    total = n = 0
    with torch.no_grad():
        for b in make_batches(eval_set, batch_size=cfg.batch_size, max_length=cfg.max_length,
                              packing=cfg.packing, pad_id=tok.pad_token_id, seed=0, epoch=0):
            t = to_tensors(b, device)
            labels = t.pop("labels")
            total += summed_loss(model, t, labels).item()
            n += b.n_trained
    model.train()
    return total / max(n, 1)


def _load_benchmark(cfg: TrainConfig):
    if not cfg.domain_eval.benchmark:
        return None
    from workbench.records import MCItem, read_records

    return read_records(cfg.domain_eval.benchmark, MCItem)[:cfg.domain_eval.max_items]


def _domain_eval(model, tok, items, device) -> float:
    """Multiple-choice accuracy (log-likelihood of the letters) with the model being
    trained, through the same scorer the evaluation uses."""
    from workbench.evaluate.mc import accuracy_of, loglik_letter_predictions
    from workbench.models.local import LocalChatModel

    model.eval()
    scorer = LocalChatModel.wrap(model, tok, device=device, identity="training")
    preds = loglik_letter_predictions(scorer, items)
    model.train()
    return accuracy_of(preds, items)


def export_adapter(model, tok, output: Path, manifest: dict, metrics: list[dict]) -> None:
    """Write the adapter folder atomically: safetensors only, model card, manifest."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.parent / f".{output.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    atomic_write_json(tmp / "manifest.json", manifest)
    with open(tmp / "metrics.jsonl", "w") as fh:
        for row in metrics:
            fh.write(json.dumps(row) + "\n")
    _plot_curves(metrics, tmp / "training_curves.png")
    (tmp / "README.md").write_text(model_card(manifest, metrics))
    replace_dir(tmp, output)


def model_card(manifest: dict, metrics: list[dict]) -> str:
    o = manifest["outputs"]
    final = o.get("final", {})
    lines = ["---", "library_name: peft", f"base_model: {o['base_model']}", "tags: [lora, "
             "workbench, sft]", "---", "", f"# LoRA adapter for {o['base_model']}", "",
             "Trained with the Domain-Agent Workbench (`workbench train`).", "",
             f"- base model: `{o['base_model']}` ({o['model_source']})",
             f"- chat template fingerprint: `{o['chat_template_fingerprint']}`",
             f"- data sha256: `{manifest['input_hashes']['data']}`",
             f"- steps: {o['steps']}, train examples: {o['train_examples']}, eval examples: "
             f"{o['eval_examples']}", f"- device: {o['device']} ({o['dtype']})"]
    for k in ("loss", "eval_loss", "domain_accuracy"):
        if k in final:
            lines.append(f"- final {k.replace('_', ' ')}: {final[k]:.4f}")
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
    if dom:
        ax2 = ax.twinx()
        ax2.plot([m["step"] for m in dom], [m["domain_accuracy"] for m in dom], "s--",
                 color="tab:green", label="domain accuracy")
        ax2.set_ylabel("MC accuracy")
        ax2.set_ylim(0, 1)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fingerprint_warning(adapter: str | Path, tok) -> str | None:
    """A warning when the chat template in use differs from the one the adapter was trained
    with (evaluation and serving call this)."""
    m = Path(adapter) / "manifest.json"
    if not m.exists():
        return None
    trained = json.loads(m.read_text()).get("outputs", {}).get("chat_template_fingerprint")
    now = template_fingerprint(tok)
    if trained and trained != now:
        return (f"warning: chat template differs from the one {adapter} was trained with "
                f"({now} != {trained})")
    return None

