"""GRPO's pieces for the training library: rollouts to token sequences with the policy's own
tokens marked, group-normalised advantages, per-token log-probabilities, and the clipped
policy-gradient loss with an optional KL term (Shao et al. 2024; DAPO's clip-higher and
token-level mean, Yu et al. 2025; Dr. GRPO's unscaled advantages, Liu et al. 2025).

A rollout's conversation is tokenised as SFT tokenises an agent trajectory
(`data.tokenize_example`): the policy's own tokens are its assistant turns (plans, calls,
answers); the system prompt, the task, tool observations (retrieved passages among them) and
the runner's error notes are context and get no gradient. They are the tokens the template
renders for the policy's turns, which are the sampled ones wherever the tokenizer
round-trips the text (it does for the byte-level BPE models here).

Per policy token t of rollout i, with advantage A_i, ratio rho = exp(logp - logp_old), and
the reference's logp_ref:
    loss_t = -min(rho A_i, clip(rho, 1 - eps, 1 + eps_high) A_i) + beta k3_t
    k3_t   = exp(logp_ref - logp) - (logp_ref - logp) - 1          (Schulman's estimator)
summed with weights 1 / (policy tokens of the step) ("token") or 1 / (rollouts of the step x
the rollout's policy tokens) ("sequence"), so micro-batches accumulate to the step's mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.agents.rollout import Rollout
from workbench.records import ChatExample
from workbench.train import step as train_step  # by module: tests replace its functions
from workbench.train.data import IGNORE, tokenize_example

if TYPE_CHECKING:
    import torch


@dataclass
class PolicySequence:
    """One rollout as training tokens: `mask[j]` is 1 where token j is the policy's own."""

    id: str
    group: str
    input_ids: list[int]
    mask: list[int]
    reward: float
    advantage: float = 0.0
    ref_logps: list[float] | None = None  # per policy token, in order (KL term)
    old_logps: list[float] | None = None  # per policy token, before the update (mu > 1)
    teacher_logps: list[float] | None = None  # per policy token, the teacher's (distillation)
    extra: dict = field(default_factory=dict)

    @property
    def n_policy(self) -> int:
        """Policy tokens that are predicted (the first token of a sequence never is)."""
        return sum(self.mask[1:])


def tokenize_rollout(tok, rollout: Rollout, *, max_length: int) -> PolicySequence:
    """The rollout's conversation as the template renders it, the assistant turns marked as
    the policy's; a conversation over `max_length` tokens is cut there (its tail trains
    nothing)."""
    t = rollout.trajectory
    last = max((i for i, m in enumerate(t.messages) if m.role == "assistant"), default=None)
    if last is None:  # the run ended before the policy wrote anything
        return PolicySequence(id=t.id, group=rollout.group, input_ids=[], mask=[],
                              reward=rollout.reward)
    # what follows the policy's last turn (an error note, a tool's reply) trains nothing
    ex = ChatExample(messages=t.messages[:last + 1], tools=t.tools or None, id=t.id)
    tk = tokenize_example(tok, ex)
    ids, mask = tk.input_ids[:max_length], [int(x != IGNORE) for x in tk.labels[:max_length]]
    return PolicySequence(id=t.id, group=rollout.group, input_ids=ids, mask=mask,
                          reward=rollout.reward,
                          extra={"truncated": len(tk.input_ids) > max_length})


def group_advantages(rewards: Sequence[Sequence[float]], *, scale: str = "group",
                     eps: float = 1e-4) -> list[list[float]]:
    """Per group, (r - mean) / (std + eps) with the sample standard deviation (as TRL), or
    r - mean with `scale="none"`. A group whose rewards are all equal gets zeros."""
    out = []
    for g in rewards:
        mean = statistics.fmean(g)
        centred = [r - mean for r in g]
        if scale == "group":
            std = statistics.stdev(g) if len(g) > 1 else 0.0
            centred = [c / (std + eps) for c in centred]
        out.append(centred)
    return out


def token_weights(seqs: Sequence[PolicySequence], kind: str) -> list[float]:
    """Each sequence's weight per policy token, so that the weighted sum over the step is
    the step's mean ("token": over all policy tokens; "sequence": per rollout, then over
    rollouts). Sequences without policy tokens weigh 0."""
    if kind == "token":
        total = sum(s.n_policy for s in seqs)
        return [1.0 / total if total else 0.0 for _ in seqs]
    n = sum(1 for s in seqs if s.n_policy)
    return [1.0 / (n * s.n_policy) if s.n_policy else 0.0 for s in seqs]


@dataclass
class SeqBatch:
    """Sequences padded on the right; `keep` marks predicted policy tokens (row-major);
    the first `prefix` tokens are the same in every row and predict no policy token."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: torch.Tensor  # (rows, length - 1) bool: target position j + 1 is a policy token
    rows: torch.Tensor  # the row of each kept position, in row-major order
    prefix: int = 0


MIN_PREFIX = 16  # shorter shared prefixes are run with the rest


def shared_prefix(seqs: Sequence[PolicySequence]) -> int:
    """How many leading tokens every sequence shares before the position that predicts its
    first policy token (the rollouts of a task share their whole prompt, those of a pack
    its system prompt and tool descriptions)."""
    if len(seqs) < 2:
        return 0
    first = seqs[0].input_ids
    n = min(len(s.input_ids) for s in seqs)
    for s in seqs[1:]:
        k = 0
        while k < n and s.input_ids[k] == first[k]:
            k += 1
        n = k
    own = min((s.mask.index(1) for s in seqs if 1 in s.mask), default=n + 1)
    return max(0, min(n, own - 1))


def seq_batch(seqs: Sequence[PolicySequence], pad_id: int, device: str, *,
              share_prefix: bool = False) -> SeqBatch:
    import torch

    prefix = shared_prefix(seqs) if share_prefix else 0
    width = max(len(s.input_ids) for s in seqs)
    ids = torch.tensor([s.input_ids + [pad_id] * (width - len(s.input_ids)) for s in seqs],
                       device=device)
    attn = torch.tensor([[1] * len(s.input_ids) + [0] * (width - len(s.input_ids))
                         for s in seqs], device=device)
    mask = torch.tensor([s.mask + [0] * (width - len(s.mask)) for s in seqs], device=device)
    keep = mask[:, 1:].bool()
    rows = torch.arange(len(seqs), device=device).unsqueeze(1).expand_as(keep)[keep]
    return SeqBatch(ids, attn, keep, rows, prefix if prefix >= MIN_PREFIX else 0)


def token_logps(model, batch: SeqBatch) -> torch.Tensor:
    """log pi(token) at every policy token of the batch, flat in row-major order. The
    vocabulary projection runs on those positions only where the model allows it.

    With a shared prefix (`seq_batch(share_prefix=True)`) the prefix runs once and its
    key/value cache, repeated for each row, carries the gradient back to it: the same
    values and gradients as running every row whole (an agent's rollouts share a prompt of
    ~1,500 tokens and add a few hundred of their own)."""
    import torch

    target = batch.input_ids[:, 1:][batch.keep]
    parts = train_step.decoder_and_head(model)
    if parts is not None and batch.prefix:
        decoder, head = parts
        return _shared_prefix_logps(decoder, head, batch, target)
    if parts is not None:
        decoder, head = parts
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         use_cache=False).last_hidden_state
        logits = head(hidden[:, :-1][batch.keep]).float()
    else:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       use_cache=False).logits[:, :-1][batch.keep].float()
    return torch.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, *,
                    epsilon: float, epsilon_high: float, beta: float = 0.0,
                    ref_logp: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (flat tensors of one length) and per-token statistics: `clipped`
    (the ratio is outside the clip range on the side the advantage pushes, so the token
    gives no gradient) and `kl` (k3; zeros without a reference)."""
    import torch

    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * advantage
    loss = -torch.min(unclipped, clipped)
    if ref_logp is not None:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        if beta:
            loss = loss + beta * kl
    else:
        kl = torch.zeros_like(logp)
    was_clipped = ((ratio < 1 - epsilon) & (advantage < 0)) | \
        ((ratio > 1 + epsilon_high) & (advantage > 0))
    return loss, {"clipped": was_clipped.detach(), "kl": kl.detach(), "ratio": ratio.detach()}


def _shared_prefix_logps(decoder, head, batch: SeqBatch, target: torch.Tensor
                         ) -> torch.Tensor:
    import inspect

    import torch

    n, width = batch.input_ids.shape
    cut = batch.prefix
    kw = "cache" if "cache" in inspect.signature(type(decoder).forward).parameters \
        else "past_key_values"
    out = decoder(input_ids=batch.input_ids[:1, :cut], use_cache=True)
    past = getattr(out, "cache", None) or out.past_key_values
    past.batch_repeat_interleave(n)
    positions = torch.arange(cut, width, device=batch.input_ids.device).unsqueeze(0).expand(
        n, width - cut)
    hidden = decoder(input_ids=batch.input_ids[:, cut:], attention_mask=batch.attention_mask,
                     position_ids=positions, use_cache=True, **{kw: past}).last_hidden_state
    logits = head(hidden[:, :-1][batch.keep[:, cut:]]).float()
    return torch.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
