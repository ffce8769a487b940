"""LoRA fine-tuning as a library: build a session from a model on disk or in memory, advance
it N optimizer steps at a time, read and replace its adapter tensors, checkpoint it, export it.

    session = setup(cfg, model=model, tokenizer=tok, examples=examples, seed=0)
    rows = train_steps(session, 10)          # continues from wherever the session is
    state = adapter_state(session)           # {PEFT's tensor name: tensor}, e.g. for FedAvg
    load_adapter_state(session, averaged)    # strict: every name and shape must match
    export(session, "runs/x/adapter")        # the folder `workbench train run` writes

The micro-batches of step k depend only on (seed, epoch, k, rank), so N steps and then N more
are the same computation as 2N steps, and a restored checkpoint continues the same sequence.
Nothing here installs a signal handler or ends the process: a stop request is `should_stop`,
answered with a checkpoint and `TrainingInterrupted`. The runnable job (CLI, background jobs,
torchrun) is `workbench.train.recipe`, built on these functions.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import atomic_write_json, replace_dir, sha256_file, sha256_text
from workbench.models.templates import template_fingerprint
from workbench.records import ChatExample, PreferencePair, RunManifest, library_versions
from workbench.train import checkpoint as ckpt
from workbench.train.config import LoraSettings, TrainConfig
from workbench.train.data import (
    Batch, Tokenized, load_examples, make_batches, to_tensors, tokenize_all,
)

if TYPE_CHECKING:
    import threading

    import torch

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
class TrainingSession:
    """One LoRA fine-tuning between calls. `step` and `metrics` advance as it trains; the
    rest is fixed by `setup`."""

    cfg: TrainConfig
    seed: int
    model: Any  # a PeftModel carrying the adapter being trained
    tokenizer: Any
    optimizer: Any
    params: list  # the trainable (adapter) parameters
    train_set: list[Tokenized]
    eval_set: list[Tokenized]
    device: str
    dtype: Any
    total: int  # optimizer steps in the learning-rate schedule
    warmup: int
    batches_per_epoch: int
    base_model: str  # the model spec, or the in-memory model's name
    model_source: str
    data_source: str
    data_hash: str
    forward: Any = None  # the model, or its DistributedDataParallel wrapper
    rank: int = 0
    world: int = 1
    benchmark: list | None = None  # MCItems scored during training (train.domain_eval)
    checkpoint_dir: Path | None = None
    step: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    tokens_real: int = 0
    tokens_padded: int = 0
    seconds: float = 0.0
    reference: Any = None  # method dpo: the ReferenceCache every pair has a row in
    ref_forwards: int = 0  # reference forward passes this session ran (0: all from cache)
    _epoch: tuple[int, list[Batch]] | None = field(default=None, repr=False)


def setup(cfg: TrainConfig, *, seed: int = 0, model_spec: str | None = None, model=None,
          tokenizer=None, examples: list[ChatExample] | None = None,
          pairs: list[PreferencePair] | None = None,
          checkpoint_dir: str | Path | None = None,
          reference_cache: str | Path | None = None) -> TrainingSession:
    """A session at step 0: tokenised data split into train and eval, the model with its
    adapter, optimizer and schedule.

    The model is `model_spec` (resolved and loaded as every model spec is) or `model` with
    `tokenizer`, already in memory: a plain causal LM gets LoRA layers from `cfg.lora`
    (injected in place, as PEFT does), a PeftModel trains the adapter it carries, which must
    agree with `cfg.lora`. An in-memory model keeps its dtype and stays on its device unless
    `cfg.device` names one. The examples are `examples` or what `cfg.data` names.
    `checkpoint_dir` is where `save_checkpoint` (and a stop request) writes; None: nowhere.
    Everything that can be refused (data, template, lengths) is refused before the model
    is loaded.

    With `cfg.method == "dpo"` the data are preference pairs (`pairs`, or the JSONL that
    `cfg.data` names) and the reference log-probabilities of every pair are computed here,
    with the model as it starts (`train.init_adapter`, or the base model under a fresh
    LoRA), or read from `reference_cache` (a JSONL file; None: kept in memory only).
    """
    import torch

    if (model_spec is None) == (model is None):
        raise WorkbenchError("pass a model_spec or an in-memory model, not both or neither")
    if model is not None and tokenizer is None:
        raise WorkbenchError("an in-memory model needs its tokenizer: pass tokenizer=")
    dpo = cfg.method == "dpo"
    given = pairs if dpo else examples
    if (pairs if not dpo else examples) is not None:
        raise WorkbenchError(f"train.method is {cfg.method}: pass "
                             f"{'pairs=' if dpo else 'examples='}, not "
                             f"{'examples=' if dpo else 'pairs='}")
    what = "pairs" if dpo else "examples"
    if given is not None and cfg.data:
        raise WorkbenchError(f"{what} were passed and train.data is {cfg.data!r}: pass one "
                             f"(train.data=None to train on the {what})")
    rank, world = _distributed()

    # the tokenizer and the model's identity
    if model_spec is not None:
        from transformers import AutoConfig, AutoTokenizer

        from workbench.models.local import model_folder
        from workbench.models.resolve import resolve_chat_model

        source = resolve_chat_model(model_spec)
        if source.kind == "openai":
            raise WorkbenchError("training needs local weights, not an HTTP endpoint")
        folder = model_folder(source)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        max_positions = getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings",
                                None)
        base_model, model_source = model_spec, source.describe()
    else:
        max_positions = getattr(model.config, "max_position_embeddings", None)
        base_model = getattr(model.config, "_name_or_path", "") or "in-memory"
        model_source = f"in-memory {type(model).__name__}"
    if cfg.chat_template:
        tokenizer.chat_template = cfg.chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token

    # the data: tokenised and checked in full, then a seeded train/eval split
    if given is None:
        data_path, given = (_load_pairs(cfg) if dpo else load_examples(cfg))
        data_source, data_hash = str(data_path), sha256_file(data_path)[:16]
    else:
        data_source = f"in-memory {'pairs' if dpo else 'examples'}"
        data_hash = sha256_text("".join(json.dumps(e.to_json(), sort_keys=True) + "\n"
                                        for e in given))[:16]
    if dpo:
        from workbench.train.preference import tokenize_pairs

        tokenized = tokenize_pairs(tokenizer, list(given), max_length=cfg.max_length,
                                   max_positions=max_positions, source=data_source)
    else:
        tokenized = tokenize_all(tokenizer, list(given), max_length=cfg.max_length,
                                 max_positions=max_positions, source=data_source)
    order = list(range(len(tokenized)))
    random.Random(seed).shuffle(order)
    n_eval = int(len(order) * cfg.eval_fraction)
    eval_set = [tokenized[i] for i in sorted(order[:n_eval])]
    train_set = [tokenized[i] for i in sorted(order[n_eval:])]
    if not train_set:
        raise WorkbenchError("no training examples left after the eval split")

    # the model with its adapter; the seed fixes the adapter's initialisation and dropout
    device, dtype = _placement(cfg, world, model)
    torch.manual_seed(seed)
    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    if cfg.init_adapter:
        model = _from_adapter(model, cfg.init_adapter)
    model = _with_adapter(model, cfg.lora)
    if cfg.lora.freeze_a:
        for name, p in model.named_parameters():
            if ".lora_A." in name:
                p.requires_grad_(False)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant":
                                                                           False})
        model.enable_input_require_grads()
    model.to(device)
    model.config.use_cache = False
    forward = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        forward = DistributedDataParallel(model, device_ids=[device] if "cuda" in device
                                          else None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    # the schedule: optimizer steps from epochs (or train.max_steps)
    first_epoch = _make_epoch(cfg, train_set, tokenizer, seed, 0)
    steps_per_epoch = max(1, len(first_epoch) // (cfg.grad_accum * world))
    total = cfg.max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    reference, ref_forwards = None, 0
    if dpo:  # the policy at step 0 is the reference: its log-probabilities, once
        from workbench.train.preference import ReferenceCache, compute_reference, model_key

        from peft import get_peft_model_state_dict

        key = model_key(base_model, model_source, get_peft_model_state_dict(
            model, adapter_name=model.active_adapter), dtype)
        reference = ReferenceCache(reference_cache if cfg.dpo.reference_cache else None, key)
        ref_forwards = compute_reference(model, train_set + eval_set, reference,
                                         batch_size=cfg.batch_size,
                                         pad_id=tokenizer.pad_token_id, device=device)
    return TrainingSession(
        cfg=cfg, seed=seed, model=model, tokenizer=tokenizer, optimizer=optimizer,
        params=params, train_set=train_set, eval_set=eval_set, device=device, dtype=dtype,
        total=total, warmup=int(total * cfg.warmup_ratio), batches_per_epoch=len(first_epoch),
        base_model=base_model, model_source=model_source, data_source=data_source,
        data_hash=data_hash, forward=forward, rank=rank, world=world,
        benchmark=_load_benchmark(cfg),
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        reference=reference, ref_forwards=ref_forwards, _epoch=(0, first_epoch))


def train_steps(session: TrainingSession, n: int, *,
                should_stop: Callable[[], bool] | threading.Event | None = None,
                on_step: Callable[[dict], None] | None = None,
                fault: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run `n` optimizer steps from where the session is; return their metric rows.

    After each step: `on_step(row)`, then a checkpoint every `cfg.save_every` steps (when the
    session has a checkpoint folder), then `should_stop()`; when that is true the step is
    checkpointed (again: when there is a folder) and `TrainingInterrupted` is raised.
    `fault(stage)` is a test hook called between checkpoint writes.
    """
    import torch

    s, cfg = session, session.cfg
    if n < 0 or s.step + n > s.total:
        raise WorkbenchError(f"cannot run {n} steps: {s.total - s.step} of the schedule's "
                             f"{s.total} remain (train.max_steps or train.epochs set it)")
    stop = getattr(should_stop, "is_set", should_stop) or (lambda: False)
    rows = []
    s.model.train()
    for _ in range(n):
        t0 = time.perf_counter()
        step = s.step
        lr = lr_at(step, s.total, cfg.learning_rate, s.warmup, cfg.scheduler)
        for group in s.optimizer.param_groups:
            group["lr"] = lr
        batches = _micro_batches(s, step)
        if cfg.method == "dpo":
            n_label, loss_sum, extra = _dpo_backward(s, batches)
        else:
            n_label, loss_sum, extra = _sft_backward(s, batches)
        grad_norm = torch.nn.utils.clip_grad_norm_(s.params, cfg.max_grad_norm).item()
        if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
            raise WorkbenchError(f"step {step + 1}: the loss or the gradient is not finite "
                                 f"(loss {loss_sum / max(n_label, 1):.4g}, gradient norm "
                                 f"{grad_norm:.4g}); training stopped before the update and "
                                 "nothing was written. Lower train.learning_rate or check "
                                 "the data.")
        s.optimizer.step()
        if not all(bool(torch.isfinite(p).all()) for p in s.params):
            raise WorkbenchError(f"step {step + 1}: the update made adapter weights not finite "
                                 f"(learning rate {lr:.4g}); training stopped and nothing "
                                 "was written. Lower train.learning_rate.")
        s.optimizer.zero_grad(set_to_none=True)
        s.step = done = step + 1
        row = {"step": done, "loss": loss_sum / n_label, "lr": lr, "grad_norm": grad_norm,
               **extra, "tokens": sum(b.n_real for b in batches),
               "seconds": time.perf_counter() - t0}
        if s.eval_set and (cfg.eval_every and done % cfg.eval_every == 0 or done == s.total):
            if cfg.method == "dpo":
                row.update({f"eval_{k}": v for k, v in preference_metrics(s, s.eval_set)
                            .items()})
            else:
                row["eval_loss"] = eval_loss(s)
        if s.benchmark and (cfg.domain_eval.every and done % cfg.domain_eval.every == 0
                            or done == s.total):
            row["domain_accuracy"] = domain_accuracy(s)
        s.seconds += time.perf_counter() - t0
        s.metrics.append(row)
        rows.append(row)
        if on_step:
            on_step(row)

        saved = None
        if s.checkpoint_dir and cfg.save_every and done % cfg.save_every == 0 \
                and done < s.total:
            saved = save_checkpoint(s, fault=fault)
        if stop():
            if saved is None and s.checkpoint_dir:
                saved = save_checkpoint(s, fault=fault)
            raise TrainingInterrupted(step=done, checkpoint=saved)
    return rows


def _sft_backward(s: TrainingSession, batches) -> tuple[int, float, dict]:
    n_label = sum(b.n_trained for b in batches)
    loss_sum = 0.0
    for b in batches:
        inputs = to_tensors(b, s.device)
        labels = inputs.pop("labels")
        loss = summed_loss(s.forward, inputs, labels)
        (loss / n_label).backward()  # mean over every labelled token of the step
        loss_sum += loss.item()
        s.tokens_real += b.n_real
        s.tokens_padded += len(b.input_ids) * len(b.input_ids[0])
    return n_label, loss_sum, {}


def _dpo_backward(s: TrainingSession, batches) -> tuple[int, float, dict]:
    """Mean DPO loss over the step's pairs; reward statistics of the same pairs."""
    import torch

    from workbench.train.preference import dpo_loss, sequence_logps

    n_pairs = sum(b.pairs for b in batches)
    loss_sum, stats = 0.0, {"chosen_reward": [], "rejected_reward": []}
    for b in batches:
        policy, counts = sequence_logps(s.forward, b, s.device)
        ref = s.reference.tensor(b.keys, s.device)
        loss, st = dpo_loss(policy, ref, counts, beta=s.cfg.dpo.beta, kind=s.cfg.dpo.loss,
                            label_smoothing=s.cfg.dpo.label_smoothing)
        (loss.sum() / n_pairs).backward()
        loss_sum += float(loss.detach().sum())
        for k in stats:
            stats[k].append(st[k])
        s.tokens_real += b.n_real
        s.tokens_padded += len(b.input_ids) * len(b.input_ids[0])
    return n_pairs, loss_sum, _reward_summary(torch.cat(stats["chosen_reward"]),
                                              torch.cat(stats["rejected_reward"]))


def _reward_summary(chosen, rejected) -> dict[str, float]:
    return {"reward_accuracy": float((chosen > rejected).float().mean()),
            "reward_margin": float((chosen - rejected).mean()),
            "chosen_reward": float(chosen.mean()), "rejected_reward": float(rejected.mean())}


def preference_metrics(session: TrainingSession, pairs) -> dict[str, float]:
    """DPO loss, reward accuracy and margin of the current policy on `pairs` (held-out, say),
    against the session's reference; and `preference_accuracy`: the share of pairs whose
    chosen side the policy gives a higher log-probability than the rejected one."""
    import torch

    from workbench.train.preference import dpo_loss, pair_batches, sequence_logps

    s = session
    if not pairs:
        nan = float("nan")
        return {"loss": nan, "reward_accuracy": nan, "reward_margin": nan,
                "chosen_reward": nan, "rejected_reward": nan, "preference_accuracy": nan}
    s.model.eval()
    losses, chosen, rejected, prefer = [], [], [], []
    with torch.no_grad():
        for b in pair_batches(pairs, batch_size=s.cfg.batch_size,
                              pad_id=s.tokenizer.pad_token_id, seed=0, epoch=0,
                              shuffle=False):
            lp, counts = sequence_logps(s.model, b, s.device)
            loss, st = dpo_loss(lp, s.reference.tensor(b.keys, s.device), counts,
                                beta=s.cfg.dpo.beta, kind=s.cfg.dpo.loss,
                                label_smoothing=s.cfg.dpo.label_smoothing)
            losses.append(loss)
            chosen.append(st["chosen_reward"])
            rejected.append(st["rejected_reward"])
            prefer.append((st["chosen_logp"] > st["rejected_logp"]).float())
    s.model.train()
    return {"loss": float(torch.cat(losses).mean()),
            **_reward_summary(torch.cat(chosen), torch.cat(rejected)),
            "preference_accuracy": float(torch.cat(prefer).mean())}


def adapter_state(session: TrainingSession) -> dict[str, torch.Tensor]:
    """The adapter's tensors, named as PEFT names them in `adapter_model.safetensors`, as
    detached CPU copies (training on does not change them)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(session.model, adapter_name=session.model.active_adapter)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def init_adapter_state(lora: LoraSettings, *, model_spec: str | None = None, model=None,
                       seed: int = 0) -> dict[str, torch.Tensor]:
    """The adapter `setup` would start from (same seed: same A, B = 0) without data or an
    optimizer: what a federated server sends out in round 1. `model` is consumed (LoRA layers
    are injected into it)."""
    import torch

    if (model_spec is None) == (model is None):
        raise WorkbenchError("pass a model_spec or an in-memory model, not both or neither")
    if model is None:
        from transformers import AutoModelForCausalLM

        from workbench.models.local import model_folder
        from workbench.models.resolve import resolve_chat_model

        source = resolve_chat_model(model_spec)
        if source.kind == "openai":
            raise WorkbenchError("an adapter needs local weights, not an HTTP endpoint")
        model = AutoModelForCausalLM.from_pretrained(model_folder(source),
                                                     dtype=torch.float32)
    torch.manual_seed(seed)
    from peft import get_peft_model_state_dict

    peft = _with_adapter(model, lora)
    state = get_peft_model_state_dict(peft, adapter_name=peft.active_adapter)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def load_adapter_state(session: TrainingSession, state: Mapping[str, torch.Tensor]) -> None:
    """Replace the adapter's tensors with `state` (names as `adapter_state` gives them).

    Strict: a missing, unexpected or differently shaped tensor is refused, by name, before
    anything is written. The optimizer's moments and the step counter are left as they are.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    name = session.model.active_adapter
    expected = get_peft_model_state_dict(session.model, adapter_name=name)
    problems = [f"missing {k}" for k in sorted(set(expected) - set(state))]
    problems += [f"unexpected {k}" for k in sorted(set(state) - set(expected))]
    for k in sorted(set(expected) & set(state)):
        want = tuple(expected[k].shape)
        if not hasattr(state[k], "shape"):
            problems.append(f"{k} is a {type(state[k]).__name__}, not a tensor")
        elif tuple(state[k].shape) != want:
            problems.append(f"{k} has shape {tuple(state[k].shape)}, the adapter's is {want}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                           if len(problems) > 5 else "")
        raise WorkbenchError(f"adapter state does not fit this session's adapter: {shown}")
    set_peft_model_state_dict(session.model, dict(state), adapter_name=name)


def save_checkpoint(session: TrainingSession, *,
                    fault: Callable[[str], None] | None = None) -> Path | None:
    """A complete checkpoint of the session at its current step in its checkpoint folder,
    keeping the newest `cfg.save_total_limit`. Ranks other than 0 write nothing (None)."""
    if session.checkpoint_dir is None:
        raise WorkbenchError("this session has no checkpoint folder: pass checkpoint_dir to "
                             "setup")
    if session.rank != 0:
        return None
    path = ckpt.save_checkpoint(session.checkpoint_dir, session.step, model=session.model,
                                optimizer=session.optimizer,
                                state={"metrics": session.metrics, "total": session.total},
                                fault=fault)
    ckpt.rotate(session.checkpoint_dir, session.cfg.save_total_limit)
    return path


def restore_checkpoint(session: TrainingSession, checkpoint: str | Path | None = None
                       ) -> Path | None:
    """Continue from `checkpoint`, or from the newest complete one in the session's folder:
    adapter, optimizer, random-number states, step and metrics. Returns the checkpoint used,
    None when the folder holds none."""
    if checkpoint is None:
        if session.checkpoint_dir is None:
            raise WorkbenchError("no checkpoint given and the session has no checkpoint "
                                 "folder")
        checkpoint = ckpt.latest_checkpoint(session.checkpoint_dir)
        if checkpoint is None:
            return None
    checkpoint = Path(checkpoint)
    if not (checkpoint / ckpt.MARKER).exists():
        raise WorkbenchError(f"{checkpoint}: not a complete checkpoint (no {ckpt.MARKER} "
                             f"marker)")
    state = ckpt.load_checkpoint(checkpoint, model=session.model, optimizer=session.optimizer)
    session.step, session.metrics = state["step"], state.get("metrics", [])
    return checkpoint


def export(session: TrainingSession, output: str | Path, *, run_id: str | None = None
           ) -> dict[str, Any]:
    """Write the adapter folder atomically (safetensors, tokenizer, manifest, metrics, curves,
    model card) and return its manifest. Ranks other than 0 only return the manifest."""
    s, output = session, Path(output)
    manifest = RunManifest(
        run_id=run_id or output.name, kind="train", config=s.cfg.model_dump(mode="json"),
        input_hashes={"data": s.data_hash},
        versions=library_versions("torch", "transformers", "peft"), seed=s.seed,
        status="completed" if s.step >= s.total else "partial",
        outputs={"base_model": s.base_model, "model_source": s.model_source,
                 "chat_template_fingerprint": template_fingerprint(s.tokenizer),
                 "steps": s.step, "train_examples": len(s.train_set),
                 "eval_examples": len(s.eval_set), "device": s.device,
                 "dtype": str(s.dtype).removeprefix("torch."),
                 "tokens_per_s": s.tokens_real / s.seconds if s.seconds else None,
                 "padding_share": 1 - s.tokens_real / s.tokens_padded if s.tokens_padded
                 else None,
                 "final": s.metrics[-1] if s.metrics else {},
                 **({"reference_forward_passes": s.ref_forwards} if s.cfg.method == "dpo"
                    else {})}).to_json()
    if s.rank == 0:
        export_adapter(s.model, s.tokenizer, output, manifest, s.metrics)
    return manifest


# --- the pieces of a step ---------------------------------------------------------------------

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


def _micro_batches(s: TrainingSession, step: int) -> list[Batch]:
    """This rank's micro-batches of optimizer step `step`: global micro-batch
    step * grad_accum * world + k * world + rank, counted through the epochs."""
    per_step = s.cfg.grad_accum * s.world
    out = []
    for k in range(s.cfg.grad_accum):
        epoch, pos = divmod(step * per_step + k * s.world + s.rank, s.batches_per_epoch)
        if s._epoch is None or s._epoch[0] != epoch:
            s._epoch = (epoch, _make_epoch(s.cfg, s.train_set, s.tokenizer, s.seed, epoch))
        out.append(s._epoch[1][pos])
    return out


def _make_epoch(cfg: TrainConfig, train_set, tok, seed: int, epoch: int) -> list:
    if cfg.method == "dpo":
        from workbench.train.preference import pair_batches

        return pair_batches(train_set, batch_size=cfg.batch_size, pad_id=tok.pad_token_id,
                            seed=seed, epoch=epoch)
    return make_batches(train_set, batch_size=cfg.batch_size, max_length=cfg.max_length,
                        packing=cfg.packing, pad_id=tok.pad_token_id, seed=seed, epoch=epoch)


def summed_loss(model, inputs: dict, labels):
    """Sum of next-token cross-entropy over the labelled (assistant) positions.

    Where the model exposes its decoder and output embedding (Llama, Qwen, Mistral, Gemma,
    ...), the vocabulary projection runs only on the positions that have a label: the
    prompt's positions never need logits, and the full (batch x length x vocabulary) logits
    tensor, its shifted copy and its softmax are never materialised.
    """
    import torch

    parts = decoder_and_head(model)
    if parts is None:  # generic path, and under DDP, whose own forward must run to sync
        logits = model(**inputs, use_cache=False).logits.float()
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=-100, reduction="sum")
    decoder, head = parts
    hidden = decoder(**inputs, use_cache=False).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    logits = head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum")


def decoder_and_head(model):
    """(decoder, output embedding) of a model whose logits are the head applied to the
    decoder's last hidden state (Llama, Qwen, Mistral, Gemma, ...), so logits can be computed
    only at the positions that have a label; None under DDP (whose own forward must run) or
    when the model scales or caps its logits."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return None
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = getattr(inner, "get_decoder", lambda: None)()
    head = inner.get_output_embeddings()
    cfg = inner.config
    if decoder is None or head is None or getattr(cfg, "final_logit_softcapping", None) \
            or getattr(cfg, "logit_scale", None) is not None:
        return None
    return decoder, head


def eval_loss(session: TrainingSession) -> float:
    """Mean next-token loss per labelled token on the held-out examples (method dpo: the
    mean DPO loss of the held-out pairs)."""
    import torch

    s = session
    if s.cfg.method == "dpo":
        return preference_metrics(s, s.eval_set)["loss"]
    s.model.eval()
    total = n = 0
    with torch.no_grad():
        for b in _make_epoch(s.cfg, s.eval_set, s.tokenizer, 0, 0):
            inputs = to_tensors(b, s.device)
            labels = inputs.pop("labels")
            total += summed_loss(s.model, inputs, labels).item()
            n += b.n_trained
    s.model.train()
    return total / max(n, 1)


def domain_accuracy(session: TrainingSession) -> float:
    """Multiple-choice accuracy (log-likelihood of the letters) on `train.domain_eval`'s
    benchmark with the model being trained, through the scorer the evaluation uses."""
    from workbench.evaluate.mc import accuracy_of, loglik_letter_predictions
    from workbench.models.local import LocalChatModel

    s = session
    s.model.eval()
    scorer = LocalChatModel.wrap(s.model, s.tokenizer, device=s.device, identity="training")
    preds = loglik_letter_predictions(scorer, s.benchmark)
    s.model.train()
    return accuracy_of(preds, s.benchmark)


# --- setup helpers ----------------------------------------------------------------------------

def _distributed() -> tuple[int, int]:
    """(rank, world size) from the torchrun / accelerate environment; joins the process
    group when there is more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return rank, world


def _placement(cfg: TrainConfig, world: int, model) -> tuple[str, Any]:
    """(device, dtype): picked from the config for a model still to be loaded; an in-memory
    model keeps its dtype and, unless `cfg.device` says otherwise, its device."""
    import torch

    from workbench.models.local import pick_device, pick_dtype

    if model is None:
        device = pick_device(cfg.device)
        if world > 1 and device == "cuda":
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        return device, pick_dtype(device, cfg.dtype)
    first = next(model.parameters())
    if cfg.dtype != "auto" and getattr(torch, cfg.dtype, None) != first.dtype:
        raise WorkbenchError(f"train.dtype is {cfg.dtype} but the model in memory is "
                             f"{first.dtype}: convert it first (model.to(dtype)) or leave "
                             f"train.dtype at auto")
    return (str(first.device) if cfg.device == "auto" else cfg.device), first.dtype


def _load_pairs(cfg: TrainConfig):
    from workbench.train.preference import load_pairs

    if not cfg.data:
        raise WorkbenchError("train.data is not set: pass a preference JSONL file")
    path = Path(cfg.data)
    if path.is_dir():
        raise WorkbenchError(f"{cfg.data}: train.method dpo reads a preference JSONL file "
                             f"(prompt/chosen/rejected), not a folder")
    return path, load_pairs(path)


def _from_adapter(model, folder: str):
    """The model with a trainable copy of the adapter in `folder` (train.init_adapter)."""
    from peft import PeftModel

    path = Path(folder)
    if not (path / "adapter_config.json").is_file():
        raise WorkbenchError(f"train.init_adapter {folder}: not an adapter folder (no "
                             f"adapter_config.json)")
    return PeftModel.from_pretrained(model, str(path), is_trainable=True)


def _with_adapter(model, lora: LoraSettings):
    """The model as a PeftModel with a trainable LoRA adapter."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        _check_adapter(model, lora)
        return model
    targets = lora.target_modules or DEFAULT_TARGETS.get(model.config.model_type)
    if not targets:
        raise WorkbenchError(f"no default LoRA targets for model type "
                             f"{model.config.model_type!r}: set train.lora.target_modules")
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha,
                                            lora_dropout=lora.dropout, target_modules=targets,
                                            task_type="CAUSAL_LM"))


def _check_adapter(model, lora: LoraSettings) -> None:
    from peft import LoraConfig

    pc = model.peft_config[model.active_adapter]
    if not isinstance(pc, LoraConfig):
        raise WorkbenchError(f"the PeftModel carries a {pc.peft_type} adapter; training here "
                             f"is LoRA")
    have = {"r": pc.r, "alpha": pc.lora_alpha, "dropout": pc.lora_dropout}
    want = {"r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout}
    if lora.target_modules:
        have["target_modules"] = sorted(pc.target_modules)
        want["target_modules"] = sorted(lora.target_modules)
    differ = [f"{k}: adapter {have[k]}, train.lora {want[k]}" for k in want
              if have[k] != want[k]]
    if differ:
        raise WorkbenchError("the PeftModel's adapter disagrees with train.lora ("
                             + "; ".join(differ) + "): make them agree")
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkbenchError("the PeftModel's adapter is frozen: load it with "
                             "PeftModel.from_pretrained(..., is_trainable=True)")


def _load_benchmark(cfg: TrainConfig):
    if not cfg.domain_eval.benchmark:
        return None
    from workbench.records import MCItem, read_records

    return read_records(cfg.domain_eval.benchmark, MCItem)[:cfg.domain_eval.max_items]


# --- the adapter folder -----------------------------------------------------------------------

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
    for k in ("loss", "eval_loss", "domain_accuracy", "reward_accuracy", "reward_margin",
              "eval_reward_accuracy", "eval_preference_accuracy"):
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
    rew = [m for m in metrics if "reward_accuracy" in m]
    if dom or rew:
        ax2 = ax.twinx()
        if dom:
            ax2.plot([m["step"] for m in dom], [m["domain_accuracy"] for m in dom], "s--",
                     color="tab:green", label="domain accuracy")
        if rew:  # DPO: the share of pairs whose chosen reward is above the rejected one
            ax2.plot([m["step"] for m in rew], [m["reward_accuracy"] for m in rew], ".-",
                     color="tab:purple", label="reward accuracy")
        ax2.set_ylabel("accuracy")
        ax2.set_ylim(0, 1)
        ax2.legend(loc="lower left")
    ax.legend(loc="upper right")
    fig.tight_layout()
    from workbench.io import atomic_savefig

    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
