"""What a site does with an adapter, through the training library: train it N steps on the
site's rows, measure held-out loss and multiple-choice accuracy. Used by the Flower client
app, the in-process runner and the baselines alike, so all three train the same way."""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any

from workbench.evaluate.mc import evaluate_mc
from workbench.federated.config import LocalTrain
from workbench.federated.sites import SiteData
from workbench.federated.weights import State, from_torch, to_torch
from workbench.models.local import LocalChatModel
from workbench.train.config import TrainConfig
from workbench.train.data import tokenize_all
from workbench.train.session import (
    adapter_state,
    eval_loss,
    init_adapter_state,
    load_adapter_state,
    setup,
    train_steps,
)


def site_seed(seed: int, rnd: int, site: str) -> int:
    """One seed per (run seed, round, site): reruns and resumed runs train identically."""
    return (seed * 1_000_003 + rnd * 7919 + zlib.crc32(site.encode())) % (2**31)


def train_config(local: LocalTrain, *, aggregation: str = "fedavg", steps: int | None = None):
    lora = local.lora.model_copy(update={"freeze_a": aggregation == "ffa"})
    return TrainConfig(max_steps=steps or local.steps, learning_rate=local.learning_rate,
                       batch_size=local.batch_size, max_length=local.max_length,
                       eval_fraction=0.0, warmup_ratio=0.0, scheduler="constant",
                       lora=lora, device="cpu" if _no_cuda() else "auto")


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def initial_state(model: str, local: LocalTrain, seed: int) -> State:
    return from_torch(init_adapter_state(local.lora, model_spec=model, seed=seed))


@dataclass
class LocalResult:
    state: State
    metrics: dict[str, float]


def local_train(site: SiteData, start: State | None, *, model: str, local: LocalTrain,
                aggregation: str = "fedavg", seed: int = 0, rnd: int = 1,
                steps: int | None = None, eval_before: bool = True) -> LocalResult:
    """Start from `start` (None: the fresh adapter of `seed`), train `steps` (default
    local.steps) on the site's rows, return the new adapter and numbers only."""
    t0 = time.perf_counter()
    cfg = train_config(local, aggregation=aggregation, steps=steps)
    s = setup(cfg, model_spec=model, examples=site.train, seed=site_seed(seed, rnd, site.name))
    if start is not None:
        load_adapter_state(s, to_torch(start))
    _set_eval(s, site)
    metrics: dict[str, float] = {"num-examples": float(len(site.train))}
    if eval_before and s.eval_set:
        metrics["eval-loss-before"] = eval_loss(s)
    rows = train_steps(s, cfg.max_steps)
    metrics["train-loss"] = sum(r["loss"] for r in rows) / len(rows)
    metrics["steps"] = float(len(rows))
    metrics["seconds"] = time.perf_counter() - t0
    return LocalResult(from_torch(adapter_state(s)), metrics)


def evaluate(site: SiteData, state: State, *, model: str, local: LocalTrain,
             mc: bool = True) -> dict[str, Any]:
    """Held-out loss and (with `mc`) cloze accuracy on the site's benchmark items.
    Returns numbers plus `mc_correct`, the per-item outcomes (kept on the site in a
    deployment; the experiment uses them for paired tests)."""
    cfg = train_config(local)
    s = setup(cfg, model_spec=model, examples=site.train, seed=0)
    load_adapter_state(s, to_torch(state))
    _set_eval(s, site)
    out: dict[str, Any] = {"eval-loss": eval_loss(s)} if s.eval_set else {}
    if mc and site.benchmark:
        s.model.eval()
        scorer = LocalChatModel.wrap(s.model, s.tokenizer, device=s.device,
                                     identity=f"fed:{site.name}")
        results = evaluate_mc(scorer, site.benchmark, methods=("loglik",),
                              formulations=("cloze",))
        correct = [r.scores.get("cloze_norm", 0.0) == 1.0 for r in results]
        out.update({"mc-correct": float(sum(correct)), "mc-n": float(len(correct)),
                    "mc_correct": correct,
                    "mc_predictions": [r.extra["predictions"].get("cloze_norm")
                                       for r in results]})
    return out


def _set_eval(session, site: SiteData) -> None:
    if site.eval:
        session.eval_set = tokenize_all(session.tokenizer, site.eval,
                                        max_length=session.cfg.max_length, max_positions=None,
                                        source=str(site.folder / "eval.jsonl"))
