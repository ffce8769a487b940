"""LoRA SFT or DPO as one runnable job, read top to bottom: setup, train, cleanup.

This is the entry point the CLI (`workbench train run`), background jobs and the pipeline
call: it owns the process-level parts (resume from the last complete checkpoint, live metrics
for the app, TensorBoard, the SIGTERM handler, exit code 143 on a stop, the final export).
The training itself (sessions, steps, adapter tensors, checkpoints) is the library
`workbench.train.session`, which a federated client or an improvement loop calls directly.

CPU runs in fp32; a GPU with bf16 support runs in bf16. Under `torchrun --nproc_per_node N`
(or `accelerate launch`) the same recipe trains with DistributedDataParallel: each rank takes
every N-th micro-batch, gradients are averaged, rank 0 writes checkpoints and the adapter.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import check_made_here
from workbench.models.templates import fingerprint_warning, template_fingerprint
from workbench.train.adapter import DEFAULT_TARGETS
from workbench.train.adapter_folder import export_adapter, model_card
from workbench.train.config import TrainConfig
from workbench.train.data import load_examples
from workbench.train.session import export, restore_checkpoint, setup, train_steps
from workbench.train.step import lr_at, summed_loss

# older imports of these names from here keep working
__all__ = ["DEFAULT_TARGETS", "TrainResult", "export_adapter", "fingerprint_warning",
           "load_examples", "lr_at", "model_card", "stop_on_sigterm", "summed_loss",
           "template_fingerprint", "train"]


@dataclass
class TrainResult:
    output: Path
    steps: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)


def train(cfg: TrainConfig, *, model_spec: str, output: str | Path, seed: int = 0,
          resume: bool = True, on_step: Callable[[int, dict], None] | None = None,
          fault: Callable[[str], None] | None = None, log=print) -> TrainResult:
    """Train a LoRA adapter of `model_spec` on `cfg.data` and write it to `output`.

    Checkpoints go to `.<output>.checkpoints` next to `output` and are removed once the
    adapter is written; with `resume` a re-run continues from the newest complete one.
    SIGTERM stops after the current step with a checkpoint and `SystemExit(143)`.
    `on_step(step, row)` sees every metric row; `fault` is a test hook for checkpoint writes.
    """
    # ---------------------------------------------------------------- setup

    output = Path(output)
    if cfg.init_adapter and Path(cfg.init_adapter).resolve() == output.resolve():
        raise WorkbenchError(f"train.init_adapter {cfg.init_adapter} is also the output folder: "
                             "training would replace the adapter it starts from; name another "
                             "run (-s name=...) or set train.output")
    check_made_here(output, ("manifest.json",))  # before any work: never a user's folder
    checkpoints = output.parent / f".{output.name}.checkpoints"
    reference = output.parent / f".{output.name}.reference.jsonl" \
        if cfg.method == "dpo" and cfg.dpo.reference_cache else None
    session = setup(cfg, model_spec=model_spec, seed=seed, checkpoint_dir=checkpoints,
                    reference_cache=reference)
    if cfg.method == "dpo":
        log(f"reference log-probabilities: {session.ref_forwards} forward passes, "
            f"{len(session.reference.values)} pairs known"
            + (f" (cached in {reference})" if reference else ""))
    rank0 = session.rank == 0
    if resume and (last := restore_checkpoint(session)):
        log(f"resuming from {last.name} (step {session.step} of {session.total})")
    elif rank0:
        shutil.rmtree(checkpoints, ignore_errors=True)
    live = output.parent / f"{output.name}.live.jsonl"
    writer = None
    if rank0:
        output.parent.mkdir(parents=True, exist_ok=True)
        live.write_text("".join(json.dumps(m) + "\n" for m in session.metrics))
        writer = _tensorboard(output.parent / f"{output.name}.tensorboard")

    def record(row: dict) -> None:
        done = row["step"]
        if rank0:  # live curves for the app and anyone tailing the run
            with open(live, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            if done % cfg.log_every == 0 or done == session.total:
                log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in row.items()))
                if writer:
                    for k, v in row.items():
                        if k != "step":
                            writer.add_scalar(f"train/{k}", v, done)
        if on_step:
            on_step(done, row)

    # ---------------------------------------------------------------- train
    try:
        with stop_on_sigterm(enabled=rank0) as stop:
            train_steps(session, max(0, session.total - session.step), should_stop=stop,
                        on_step=record, fault=fault)
    except TrainingInterrupted as e:
        log(f"stopped by SIGTERM after step {e.step}; resume with the same command")
        raise SystemExit(143) from None
    finally:
        if writer:
            writer.close()

    # ---------------------------------------------------------------- cleanup
    manifest = export(session, output)
    if rank0:
        shutil.rmtree(checkpoints, ignore_errors=True)
    if session.world > 1:
        import torch.distributed as dist

        dist.barrier()
    return TrainResult(output, session.total, session.metrics, manifest)


@contextlib.contextmanager
def stop_on_sigterm(enabled: bool = True) -> Iterator[threading.Event]:
    """An Event that SIGTERM sets while the block runs (pass it as `should_stop`); the
    previous handler is back afterwards. Only the main thread may own a signal handler, so in
    any other thread (or with enabled=False) nothing is installed and the Event stays clear."""
    stop = threading.Event()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield stop
    finally:
        # None: the previous handler was installed outside Python and cannot be put back;
        # the default (terminate) is closer to it than ours, which nobody would read now
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _tensorboard(folder: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder))
