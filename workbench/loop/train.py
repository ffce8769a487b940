"""Training a candidate through the training library (the loop's default trainer).

A trainer is `fn(data, output, settings, *, steps, model_spec, seed, log) -> dict`; the
loop names it by `loop.trainer` ("module:function"), so tests can script one.
"""

from __future__ import annotations

from pathlib import Path

from workbench.errors import DataError
from workbench.io import sha256_file
from workbench.train.config import TrainConfig
from workbench.train.recipe import train


def lora(data: Path, output: Path, settings, *, steps: int, model_spec: str, seed: int,
         log=print) -> dict:
    tc = TrainConfig(data=str(data), max_steps=steps, batch_size=settings.batch_size,
                     learning_rate=settings.learning_rate, max_length=settings.max_length,
                     lora=settings.lora, eval_fraction=0.0, warmup_ratio=0.0,
                     log_every=max(1, steps // 4))
    r = train(tc, model_spec=model_spec, output=output, seed=seed, log=log)
    losses = [m["loss"] for m in r.metrics if "loss" in m]
    return {"steps": r.steps, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None}


WEIGHTS = "adapter_model.safetensors"


def adapter_hash(folder: str | Path) -> str:
    """sha256 of an adapter: its weights and, when there is one, its config (rank, alpha,
    target modules change what the weights do). What a revert must restore exactly."""
    import hashlib

    p = Path(folder) / WEIGHTS
    if not p.is_file():
        raise DataError(f"no adapter weights ({WEIGHTS})", path=str(folder),
                        code="not_found")
    config = Path(folder) / "adapter_config.json"
    if not config.is_file():
        return sha256_file(p)
    return hashlib.sha256(f"{sha256_file(p)}:{sha256_file(config)}".encode()).hexdigest()
