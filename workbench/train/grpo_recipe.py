"""GRPO as one runnable job, read top to bottom like `recipe.train`: setup, train, cleanup.

The caller brings what only a pack knows (the tasks, the agent setup with its sampling, the
reward); this owns the process-level parts: resume from the newest complete checkpoint, the
live metrics file the app reads, the SIGTERM handler (exit 143 after a checkpoint), the export
of the kept adapter, and the rollouts kept beside it for inspection. With
`train.grpo.rollout_server` the adapters it published go with the checkpoints (unless
`publish_dir` names a folder of their own) and the last one is unloaded from the server.

    result = train_grpo(cfg, model_spec="default", tasks=tasks, held_out=dev,
                        agent_setup=pack_setup, reward=pack.reward, output="runs/x/adapter")
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.agents.rollout import RewardFn
from workbench.agents.runner import AgentTask
from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import check_made_here
from workbench.train.config import TrainConfig
from workbench.train.grpo_session import (
    SetupFactory,
    export,
    restore_checkpoint,
    setup,
    train_steps,
)
from workbench.train.recipe import TrainResult, stop_on_sigterm

if TYPE_CHECKING:
    from workbench.models.base import ChatModel


def train_grpo(cfg: TrainConfig, *, tasks: Sequence[AgentTask], agent_setup: SetupFactory,
               reward: RewardFn, output: str | Path, held_out: Sequence[AgentTask] = (),
               model_spec: str | None = None, model=None, tokenizer=None, seed: int = 0,
               resume: bool = True, on_step: Callable[[int, dict], None] | None = None,
               fault: Callable[[str], None] | None = None, log=print,
               teacher: ChatModel | None = None) -> TrainResult:
    """Train the adapter on its rollouts and write it to `output` (the best by held-out
    reward under `grpo.keep_best`). Checkpoints (and the saved rollout batches) go to
    `.<output>.checkpoints` and are removed once the adapter is written; the rollouts are
    kept as `<output>.rollouts/`. With `resume` a re-run continues from the newest complete
    checkpoint. `on_step(step, row)` sees every metric row. `teacher`: a loaded chat model
    standing for `grpo.distill.teacher` (on-policy distillation; else it is loaded from
    that spec)."""
    # ---------------------------------------------------------------- setup

    output = Path(output)
    if cfg.init_adapter and Path(cfg.init_adapter).resolve() == output.resolve():
        raise WorkbenchError(f"train.init_adapter {cfg.init_adapter} is also the output "
                             "folder: training would replace the adapter it starts from")
    check_made_here(output, ("manifest.json",))  # before any work: never a user's folder
    checkpoints = output.parent / f".{output.name}.checkpoints"
    s = setup(cfg, tasks=tasks, agent_setup=agent_setup, reward=reward, held_out=held_out,
              seed=seed, model_spec=model_spec, model=model, tokenizer=tokenizer,
              checkpoint_dir=checkpoints, teacher=teacher)
    if resume and (last := restore_checkpoint(s)):
        log(f"resuming from {last.name} (step {s.step} of {s.total})")
    else:
        shutil.rmtree(checkpoints, ignore_errors=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    live = output.parent / f"{output.name}.live.jsonl"
    live.write_text("".join(json.dumps(m) + "\n" for m in s.metrics))

    def record(row: dict) -> None:
        with open(live, "a") as fh:  # live curves for the app and anyone tailing the run
            fh.write(json.dumps(row) + "\n")
        if row["step"] % cfg.log_every == 0 or row["step"] == s.total:
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in row.items()))
        if on_step:
            on_step(row["step"], row)

    # ---------------------------------------------------------------- train
    try:
        with stop_on_sigterm() as stop:
            train_steps(s, s.total - s.step, should_stop=stop, on_step=record, fault=fault)
    except TrainingInterrupted as e:
        log(f"stopped by SIGTERM after step {e.step}; resume with the same command")
        raise SystemExit(143) from None
    finally:
        if s.server is not None:  # the rollout server's last adapter unloaded
            s.server.close()

    # ---------------------------------------------------------------- cleanup
    manifest = export(s, output)
    kept = output.parent / f"{output.name}.rollouts"
    if (checkpoints / "rollouts").is_dir():
        shutil.rmtree(kept, ignore_errors=True)
        (checkpoints / "rollouts").rename(kept)
    shutil.rmtree(checkpoints, ignore_errors=True)
    log(f"adapter of step {manifest['outputs']['adapter_step']} written to {output}"
        + (f" (held-out reward {s.best_reward:.3f}, at the start {s.start_reward:.3f})"
           if s.best_reward is not None and s.start_reward is not None else ""))
    return TrainResult(output, s.total, s.metrics, manifest)
