"""One optimizer step's pieces: the learning rate at a step, an epoch's batches, the summed
next-token loss (logits only where there are labels), and the backward passes of SFT and DPO
with what each reports."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from workbench.train.config import TrainConfig
from workbench.train.data import make_batches, to_tensors

if TYPE_CHECKING:
    from workbench.train.session import TrainingSession


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


def sft_backward(s: TrainingSession, batches) -> tuple[int, float, dict]:
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


def dpo_backward(s: TrainingSession, batches) -> tuple[int, float, dict]:
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
    return n_pairs, loss_sum, reward_summary(torch.cat(stats["chosen_reward"]),
                                             torch.cat(stats["rejected_reward"]))


def reward_summary(chosen, rejected) -> dict[str, float]:
    return {"reward_accuracy": float((chosen > rejected).float().mean()),
            "reward_margin": float((chosen - rejected).mean()),
            "chosen_reward": float(chosen.mean()), "rejected_reward": float(rejected.mean())}
