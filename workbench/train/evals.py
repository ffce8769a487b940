"""What the model being trained is measured by between steps: the held-out loss, the DPO
preference metrics of held-out pairs, and multiple-choice accuracy on a domain benchmark.
Each takes the part of the session it reads (`Measured`), not the session."""

from __future__ import annotations

from typing import Any, Protocol

from workbench.evaluate import mc  # by module: tests replace its functions
from workbench.models.local import LocalChatModel
from workbench.train import preference
from workbench.train.config import TrainConfig
from workbench.train.data import to_tensors
from workbench.train.logits import summed_loss
from workbench.train.step import make_epoch, reward_summary


class Measured(Protocol):
    """What the measures read of a session (a `session.TrainingSession`): the config, the
    model being trained with its tokenizer and device, the held-out set, the domain benchmark
    and, for method dpo, the reference cache."""

    cfg: TrainConfig
    model: Any
    tokenizer: Any
    device: str
    eval_set: list
    benchmark: list | None
    reference: Any


def eval_loss(session: Measured) -> float:
    """Mean next-token loss per labelled token on the held-out examples (method dpo: the
    mean DPO loss of the held-out pairs)."""
    import torch

    s = session
    if s.cfg.method == "dpo":
        return preference_metrics(s, s.eval_set)["loss"]
    s.model.eval()
    total = n = 0
    with torch.no_grad():
        for b in make_epoch(s.cfg, s.eval_set, s.tokenizer, 0, 0):
            inputs = to_tensors(b, s.device)
            labels = inputs.pop("labels")
            total += summed_loss(s.model, inputs, labels).item()
            n += b.n_trained
    s.model.train()
    return total / max(n, 1)


def domain_accuracy(session: Measured, items: list | None = None) -> float:
    """Multiple-choice accuracy on `train.domain_eval`'s benchmark (or `items`) with the
    model being trained, through the scorer the evaluation uses and in its formulation
    (`domain_eval.scoring`: cloze_norm, the report's headline, or the letters)."""
    s = session
    items = (s.benchmark or []) if items is None else items
    s.model.eval()
    scorer = LocalChatModel.wrap(s.model, s.tokenizer, device=s.device, identity="training")
    predict = mc.cloze_norm_predictions if s.cfg.domain_eval.scoring == "cloze_norm" \
        else mc.loglik_letter_predictions
    preds = predict(scorer, items)
    s.model.train()
    return mc.accuracy_of(preds, items)


def preference_metrics(session: Measured, pairs) -> dict[str, float]:
    """DPO loss, reward accuracy and margin of the current policy on `pairs` (held-out, say),
    against the session's reference; and `preference_accuracy`: the share of pairs whose
    chosen side the policy gives a higher log-probability than the rejected one. `pairs` must
    have a reference: the held-out pairs, or training pairs the schedule draws (setup scores
    no others)."""
    import torch

    s = session
    if not pairs:
        nan = float("nan")
        return {"loss": nan, "reward_accuracy": nan, "reward_margin": nan,
                "chosen_reward": nan, "rejected_reward": nan, "preference_accuracy": nan}
    s.model.eval()
    losses, chosen, rejected, prefer = [], [], [], []
    with torch.no_grad():
        for b in preference.pair_batches(pairs, batch_size=s.cfg.batch_size,
                                         pad_id=s.tokenizer.pad_token_id, seed=0, epoch=0,
                                         shuffle=False):
            lp, counts = preference.sequence_logps(s.model, b, s.device)
            loss, st = preference.dpo_loss(lp, s.reference.tensor(b.keys, s.device), counts,
                                           beta=s.cfg.dpo.beta, kind=s.cfg.dpo.loss,
                                           label_smoothing=s.cfg.dpo.label_smoothing)
            losses.append(loss)
            chosen.append(st["chosen_reward"])
            rejected.append(st["rejected_reward"])
            prefer.append((st["chosen_logp"] > st["rejected_logp"]).float())
    s.model.train()
    return {"loss": float(torch.cat(losses).mean()),
            **reward_summary(torch.cat(chosen), torch.cat(rejected)),
            "preference_accuracy": float(torch.cat(prefer).mean())}
