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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import sha256_file, sha256_text
from workbench.models.local import pick_device, pick_dtype
from workbench.models.templates import template_fingerprint
from workbench.records import (
    ChatExample,
    MCItem,
    PreferencePair,
    RunManifest,
    library_versions,
    read_records,
)
from workbench.train import checkpoint as ckpt
from workbench.train.adapter import (
    adapter_state,
    adapter_swapped,
    from_adapter,
    init_adapter_state,
    load_adapter_state,
    local_weights,
    with_adapter,
)
from workbench.train.adapter_folder import export_adapter
from workbench.train.config import TrainConfig
from workbench.train.data import Batch, Tokenized, load_examples, tokenize_all
from workbench.train.evals import domain_accuracy, eval_loss, preference_metrics
from workbench.train.preference import (
    ReferenceCache,
    compute_reference,
    load_pairs,
    model_key,
    tokenize_pairs,
)
from workbench.train.step import dpo_backward, lr_at, make_epoch, sft_backward

BEST = "best_adapter.safetensors"  # in a checkpoint: domain_eval.keep_best's adapter so far

if TYPE_CHECKING:
    import threading

# older imports of these names from here keep working
__all__ = ["TrainingSession", "adapter_state", "eval_loss", "export", "init_adapter_state",
           "load_adapter_state", "preference_metrics", "restore_checkpoint", "save_checkpoint",
           "setup", "train_steps"]


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
    also: dict[str, list] = field(default_factory=dict)  # domain_eval.also, read
    checkpoint_dir: Path | None = None
    step: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    tokens_real: int = 0
    tokens_padded: int = 0
    seconds: float = 0.0
    reference: Any = None  # method dpo: the ReferenceCache every pair has a row in
    ref_forwards: int = 0  # reference forward passes this session ran (0: all from cache)
    # domain_eval.keep_best: the evaluated step with the best mean domain accuracy
    best_step: int | None = None
    best_score: float | None = None
    best_state: dict[str, Any] | None = None
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
    `cfg.data` names) and the reference log-probabilities of every pair the schedule draws
    (and every held-out pair) are computed here, with the model as it starts
    (`train.init_adapter`, or the base model under a fresh LoRA), or read from
    `reference_cache` (a JSONL file; None: kept in memory only).
    """
    given = _check_inputs(cfg, model_spec=model_spec, model=model, tokenizer=tokenizer,
                          examples=examples, pairs=pairs)
    rank, world = _distributed()
    tokenizer, folder, max_positions, base_model, model_source = _setup_tokenizer(
        cfg, model_spec=model_spec, model=model, tokenizer=tokenizer)
    train_set, eval_set, data_source, data_hash = _setup_data(
        cfg, tokenizer, given, seed=seed, max_positions=max_positions)
    device, dtype = _placement(cfg, world, model)
    model, forward = _setup_model(cfg, model, folder, seed=seed, device=device, dtype=dtype,
                                  world=world)
    params, optimizer = _setup_optimizer(cfg, model)
    first_epoch, total = _setup_schedule(cfg, train_set, tokenizer, seed=seed, world=world)
    reference, ref_forwards = None, 0
    if cfg.method == "dpo":
        reference, ref_forwards = _setup_reference(
            cfg, model, _scheduled_pairs(cfg, train_set, tokenizer, seed=seed, world=world,
                                         total=total, first_epoch=first_epoch) + eval_set,
            tokenizer, base_model=base_model,
            model_source=model_source, dtype=dtype, device=device,
            reference_cache=reference_cache)
    return TrainingSession(
        cfg=cfg, seed=seed, model=model, tokenizer=tokenizer, optimizer=optimizer,
        params=params, train_set=train_set, eval_set=eval_set, device=device, dtype=dtype,
        total=total, warmup=int(total * cfg.warmup_ratio), batches_per_epoch=len(first_epoch),
        base_model=base_model, model_source=model_source, data_source=data_source,
        data_hash=data_hash, forward=forward, rank=rank, world=world,
        benchmark=_load_benchmark(cfg, cfg.domain_eval.benchmark),
        also={k: _load_benchmark(cfg, v) or [] for k, v in cfg.domain_eval.also.items()},
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        reference=reference, ref_forwards=ref_forwards, _epoch=(0, first_epoch))


# --- the steps of setup, in the order it takes them -------------------------------------------

def _check_inputs(cfg: TrainConfig, *, model_spec, model, tokenizer, examples, pairs):
    """Refuse a model given twice or not at all, and data of the other method or given twice;
    returns the data passed in memory (None: `cfg.data` names it)."""
    if (model_spec is None) == (model is None):
        raise WorkbenchError("pass a model_spec or an in-memory model, not both or neither")
    if model is not None and tokenizer is None:
        raise WorkbenchError("an in-memory model needs its tokenizer: pass tokenizer=")
    if cfg.method == "grpo":
        raise WorkbenchError("train.method grpo trains an agent on its rollouts: its tasks, "
                             "tools and reward are a pack's, so the agent pipeline runs it "
                             "(workbench.train.grpo_session.setup in a library)")
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
    return given


def _setup_tokenizer(cfg: TrainConfig, *, model_spec, model, tokenizer):
    """The tokenizer and the model's identity, before any weights are loaded: (tokenizer,
    the model's folder (None in memory), its max positions, its name, where it came from)."""
    folder = None
    if model_spec is not None:
        from transformers import AutoConfig, AutoTokenizer

        folder, source = local_weights(model_spec)
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
    return tokenizer, folder, max_positions, base_model, model_source


def _setup_data(cfg: TrainConfig, tokenizer, given, *, seed: int, max_positions):
    """The data tokenised and checked in full, then a seeded train/eval split: (train set,
    eval set, where the data came from, its hash)."""
    dpo = cfg.method == "dpo"
    if given is None:
        data_path, given = (_load_pairs(cfg) if dpo else load_examples(cfg))
        data_source, data_hash = str(data_path), sha256_file(data_path)[:16]
    else:
        data_source = f"in-memory {'pairs' if dpo else 'examples'}"
        data_hash = sha256_text("".join(json.dumps(e.to_json(), sort_keys=True) + "\n"
                                        for e in given))[:16]
    tokenized: list  # Tokenized examples, or TokenizedPairs for DPO
    if dpo:
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
    return train_set, eval_set, data_source, data_hash


def _setup_model(cfg: TrainConfig, model, folder, *, seed: int, device: str, dtype,
                 world: int):
    """(the model with its trainable adapter on its device, what the steps call forward: the
    model or its DistributedDataParallel wrapper). The seed fixes the adapter's
    initialisation and dropout."""
    import torch

    torch.manual_seed(seed)
    if model is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    if cfg.init_adapter:
        model = from_adapter(model, cfg.init_adapter)
    model = with_adapter(model, cfg.lora)
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
    return model, forward


def _setup_optimizer(cfg: TrainConfig, model):
    """(the trainable (adapter) parameters, AdamW over them)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=cfg.learning_rate,
                                     weight_decay=cfg.weight_decay)


def _setup_schedule(cfg: TrainConfig, train_set, tokenizer, *, seed: int, world: int):
    """(the first epoch's batches, the optimizer steps of the schedule: from epochs, or
    train.max_steps)."""
    first_epoch = make_epoch(cfg, train_set, tokenizer, seed, 0)
    steps_per_epoch = max(1, len(first_epoch) // (cfg.grad_accum * world))
    total = cfg.max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    return first_epoch, total


def _scheduled_pairs(cfg: TrainConfig, train_set, tokenizer, *, seed: int, world: int,
                     total: int, first_epoch: list) -> list:
    """Method dpo: the training pairs that `total` optimizer steps will draw, over every
    rank, in the order of the schedule (`_micro_batches`). Only these need a reference:
    40 steps of 4 over 336 pairs score 160 of them, not 336."""
    needed = total * cfg.grad_accum * world
    by_key = {p.key: p for p in train_set}
    seen: dict[str, None] = {}
    epoch, batches = 0, first_epoch
    while needed > 0 and len(seen) < len(by_key):
        for b in batches[:needed]:
            seen.update(dict.fromkeys(b.keys))
        needed -= len(batches)
        if needed <= 0:
            break
        epoch += 1
        batches = make_epoch(cfg, train_set, tokenizer, seed, epoch)
    return [by_key[k] for k in seen]


def _setup_reference(cfg: TrainConfig, model, pairs, tokenizer, *, base_model: str,
                     model_source: str, dtype, device: str, reference_cache):
    """Method dpo: the policy at step 0 is the reference; its log-probabilities of every
    pair, computed once (or read from the cache). Returns (the cache, forward passes run)."""
    from peft import get_peft_model_state_dict

    key = model_key(base_model, model_source, get_peft_model_state_dict(
        model, adapter_name=model.active_adapter), dtype)
    reference = ReferenceCache(reference_cache if cfg.dpo.reference_cache else None, key)
    ref_forwards = compute_reference(model, pairs, reference, batch_size=cfg.batch_size,
                                     pad_id=tokenizer.pad_token_id, device=device)
    return reference, ref_forwards


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
    if not cfg.data:
        raise WorkbenchError("train.data is not set: pass a preference JSONL file")
    path = Path(cfg.data)
    if path.is_dir():
        raise WorkbenchError(f"{cfg.data}: train.method dpo reads a preference JSONL file "
                             f"(prompt/chosen/rejected), not a folder")
    return path, load_pairs(path)


def _load_benchmark(cfg: TrainConfig, path: str | None):
    if not path:
        return None

    de = cfg.domain_eval
    return read_records(path, MCItem)[de.skip:de.skip + de.max_items]


# --- train ------------------------------------------------------------------------------------

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
    stop: Callable[[], bool] = (lambda: False) if should_stop is None else \
        should_stop if callable(should_stop) else should_stop.is_set  # a function or an Event
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
            n_label, loss_sum, extra = dpo_backward(s, batches)
        else:
            n_label, loss_sum, extra = sft_backward(s, batches)
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
            row.update({f"domain_accuracy_{k}": domain_accuracy(s, v)
                        for k, v in s.also.items() if v})
            _keep_if_best(s, row)
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


def _keep_if_best(s: TrainingSession, row: dict[str, Any]) -> None:
    """domain_eval.keep_best: remember this step's adapter when its mean domain accuracy
    (the benchmark and every `also` one) beats every earlier evaluated step's (ties keep the
    earlier, shorter-trained one)."""
    if not s.cfg.domain_eval.keep_best:
        return
    accs = [v for k, v in row.items() if k.startswith("domain_accuracy")]
    score = sum(accs) / len(accs)
    if s.best_score is None or score > s.best_score:
        s.best_step, s.best_score, s.best_state = row["step"], score, adapter_state(s)


def _micro_batches(s: TrainingSession, step: int) -> list[Batch]:
    """This rank's micro-batches of optimizer step `step`: global micro-batch
    step * grad_accum * world + k * world + rank, counted through the epochs."""
    per_step = s.cfg.grad_accum * s.world
    out = []
    for k in range(s.cfg.grad_accum):
        epoch, pos = divmod(step * per_step + k * s.world + s.rank, s.batches_per_epoch)
        if s._epoch is None or s._epoch[0] != epoch:
            s._epoch = (epoch, make_epoch(s.cfg, s.train_set, s.tokenizer, s.seed, epoch))
        out.append(s._epoch[1][pos])
    return out


# --- checkpoints and the adapter folder -------------------------------------------------------

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
                                state={"metrics": session.metrics, "total": session.total,
                                       "best_step": session.best_step,
                                       "best_score": session.best_score},
                                extra={BEST: session.best_state}
                                if session.best_state is not None else None, fault=fault)
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
    session.best_step, session.best_score = state.get("best_step"), state.get("best_score")
    if (checkpoint / BEST).is_file():
        from safetensors.torch import load_file

        session.best_state = load_file(str(checkpoint / BEST))
    return checkpoint


def export(session: TrainingSession, output: str | Path, *, run_id: str | None = None
           ) -> dict[str, Any]:
    """Write the adapter folder atomically (safetensors, tokenizer, manifest, metrics, curves,
    model card) and return its manifest: the adapter of the best evaluated step under
    `domain_eval.keep_best`, else the last. Ranks other than 0 only return the manifest."""
    s, output = session, Path(output)
    best = s.best_state is not None and s.best_step != s.step
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
                 "adapter_step": s.best_step if best else s.step,
                 **({"domain_accuracy_best": s.best_score} if s.best_score is not None
                    else {}),
                 **({"reference_forward_passes": s.ref_forwards} if s.cfg.method == "dpo"
                    else {})}).to_json()
    if s.rank == 0:
        with adapter_swapped(s, s.best_state if best else None):
            export_adapter(s.model, s.tokenizer, output, manifest, s.metrics)
    return manifest
