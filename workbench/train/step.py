"""One optimizer step's pieces: the learning rate at a step, an epoch's batches, and the
backward passes of SFT and DPO with what each reports. The summed next-token loss (logits only
where there are labels) is `logits.summed_loss`, importable from here too. A backward pass
takes the part of the session it reads (`StepState`), not the session."""

from __future__ import annotations

import math
from typing import Any, Protocol

from workbench.train import preference  # by module: tests replace its functions
from workbench.train.config import TrainConfig
from workbench.train.data import make_batches, to_tensors
from workbench.train.logits import decoder_and_head, summed_loss

# the logits code moved to `logits`; imports of it from here (grpo's included) keep working
__all__ = ["StepState", "decoder_and_head", "dpo_backward", "lr_at", "make_epoch",
           "reward_summary", "sft_backward", "summed_loss"]


class StepState(Protocol):
    """What a backward pass reads (the config, what it calls forward, the device, method
    dpo's reference cache) and the token counts it adds to: a `session.TrainingSession`."""

    cfg: TrainConfig
    forward: Any  # the model, or its DistributedDataParallel wrapper
    device: str
    reference: Any  # method dpo: the ReferenceCache every pair has a row in
    tokens_real: int
    tokens_padded: int


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


def make_epoch(cfg: TrainConfig, train_set, tok, seed: int, epoch: int) -> list:
    if cfg.method == "dpo":
        return preference.pair_batches(train_set, batch_size=cfg.batch_size,
                                       pad_id=tok.pad_token_id, seed=seed, epoch=epoch)
    return make_batches(train_set, batch_size=cfg.batch_size, max_length=cfg.max_length,
                        packing=cfg.packing, pad_id=tok.pad_token_id, seed=seed, epoch=epoch)


def sft_backward(s: StepState, batches) -> tuple[int, float, dict]:
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


def dpo_backward(s: StepState, batches) -> tuple[int, float, dict]:
    """Mean DPO loss over the step's pairs; reward statistics of the same pairs."""
    import torch

    n_pairs = sum(b.pairs for b in batches)
    loss_sum = 0.0
    stats: dict[str, list[torch.Tensor]] = {"chosen_reward": [], "rejected_reward": []}
    for b in batches:
        policy, counts = preference.sequence_logps(s.forward, b, s.device)
        ref = s.reference.tensor(b.keys, s.device)
        loss, st = preference.dpo_loss(policy, ref, counts, beta=s.cfg.dpo.beta,
                                       kind=s.cfg.dpo.loss,
                                       label_smoothing=s.cfg.dpo.label_smoothing)
        (loss.sum() / n_pairs).backward()
        loss_sum += float(loss.detach().sum())
        for k, kept in stats.items():
            kept.append(st[k])
        s.tokens_real += b.n_real
        s.tokens_padded += len(b.input_ids) * len(b.input_ids[0])
    return n_pairs, loss_sum, reward_summary(torch.cat(stats["chosen_reward"]),
                                             torch.cat(stats["rejected_reward"]))


def reward_summary(chosen, rejected) -> dict[str, float]:
    return {"reward_accuracy": float((chosen > rejected).float().mean()),
            "reward_margin": float((chosen - rejected).mean()),
            "chosen_reward": float(chosen.mean()), "rejected_reward": float(rejected.mean())}
