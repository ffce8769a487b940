"""Preference optimisation (DPO) for the training library: pairs to tensors, the reference
model's log-probabilities computed once and cached on disk, and the loss.

A pair is a state (`prompt`) with two continuations. Each side is tokenised as SFT tokenises a
conversation (`data.tokenize_example`), with only the side's own assistant turns labelled: the
prompt, earlier assistant turns inside it and tool results inside a side are masked. A
sequence's log-probability is the sum over its labelled tokens.

The reference policy is the model being trained as it was at step 0 (the base model under a
fresh LoRA, whose B matrices are zero, or the adapter training started from). Its
log-probabilities are computed once per pair before the first step, in eval mode, and cached
in a JSONL file keyed by (model, starting adapter, the pair's tokens): epochs, resumes and
re-runs with other hyper-parameters read them back instead of running the reference again,
and no second copy of the model is kept in memory.

Loss (Rafailov et al. 2023, sigmoid; `ipo`: Azar et al. 2023), per pair with
    h = (log pi(c) - log ref(c)) - (log pi(r) - log ref(r)):
    sigmoid: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
    ipo:     (h - 1 / (2 beta))^2, with per-token mean log-probabilities as IPO defines them
Rewards are beta (log pi - log ref); reward accuracy is the share of pairs whose chosen reward
is above the rejected one; margin is their mean difference.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import DataError, WorkbenchError
from workbench.formats import read_preferences
from workbench.io import sha256_text
from workbench.records import PreferencePair
from workbench.train.data import IGNORE, Tokenized, check_can_tokenize, preview, tokenize_example
from workbench.train.logits import decoder_and_head

if TYPE_CHECKING:
    import torch


@dataclass
class TokenizedPair:
    id: str
    chosen: Tokenized
    rejected: Tokenized

    @property
    def key(self) -> str:
        """Identity of the pair's tokens (the reference cache's key with the model's)."""
        return sha256_text(json.dumps([self.chosen.input_ids, self.chosen.labels,
                                       self.rejected.input_ids, self.rejected.labels]))[:24]

    @property
    def n_trained(self) -> int:
        return self.chosen.n_trained + self.rejected.n_trained


def tokenize_pair(tok, pair: PreferencePair, idx: int = 0) -> TokenizedPair:
    skip = sum(m.role == "assistant" for m in pair.prompt)
    pid = pair.id or f"pair-{idx}"
    return TokenizedPair(pid, tokenize_example(tok, pair.example("chosen"), idx,
                                               skip_assistant=skip),
                         tokenize_example(tok, pair.example("rejected"), idx,
                                          skip_assistant=skip))


def tokenize_pairs(tok, pairs: list[PreferencePair], *, max_length: int,
                   max_positions: int | None, source: str = "dataset") -> list[TokenizedPair]:
    """Tokenise every pair first; refuse (before step 0) on one training cannot use."""
    check_can_tokenize(tok, pairs, max_length=max_length, max_positions=max_positions,
                       source=source, what="preference dataset")
    out = []
    for i, p in enumerate(pairs, start=1):
        t = tokenize_pair(tok, p, i - 1)
        for side in ("chosen", "rejected"):
            s = getattr(t, side)
            if len(s.input_ids) > max_length:
                raise DataError(f"pair {t.id}: its {side} side is {len(s.input_ids)} tokens, "
                                f"over train.max_length={max_length}", path=source, line=i,
                                code="too_long")
            if s.n_trained == 0:
                raise DataError(f"pair {t.id}: its {side} side has no assistant tokens",
                                path=source, line=i, code="no_assistant")
        out.append(t)
    return out


def preview_pair(tok, pair: PreferencePair) -> str:
    """Both sides as the model sees them, the trained tokens of each in [[ ]]."""
    skip = sum(m.role == "assistant" for m in pair.prompt)
    return "\n".join([f"== chosen ({pair.id or 'pair'})",
                      preview(tok, pair.example("chosen"), skip_assistant=skip),
                      f"== rejected ({pair.kind or 'rejected'})",
                      preview(tok, pair.example("rejected"), skip_assistant=skip)])


def load_pairs(path: str | Path) -> list[PreferencePair]:
    return read_preferences(path)


@dataclass
class PairBatch:
    """`pairs` pairs as 2 x pairs padded rows: the chosen sides, then the rejected ones."""

    keys: list[str]
    input_ids: list[list[int]]
    labels: list[list[int]]
    attention_mask: list[list[int]]
    n_real: int
    n_trained: int

    @property
    def pairs(self) -> int:
        return len(self.keys)


def pair_batches(pairs: list[TokenizedPair], *, batch_size: int, pad_id: int, seed: int,
                 epoch: int, shuffle: bool = True) -> list[PairBatch]:
    """Batches of one epoch, in a seeded order that depends only on (seed, epoch)."""
    order = list(range(len(pairs)))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    out = []
    for i in range(0, len(order), batch_size):
        chunk = [pairs[j] for j in order[i:i + batch_size]]
        rows = [p.chosen for p in chunk] + [p.rejected for p in chunk]
        width = max(len(r.input_ids) for r in rows)
        out.append(PairBatch(
            keys=[p.key for p in chunk],
            input_ids=[r.input_ids + [pad_id] * (width - len(r.input_ids)) for r in rows],
            labels=[r.labels + [IGNORE] * (width - len(r.labels)) for r in rows],
            attention_mask=[[1] * len(r.input_ids) + [0] * (width - len(r.input_ids))
                            for r in rows],
            n_real=sum(len(r.input_ids) for r in rows),
            n_trained=sum(r.n_trained for r in rows)))
    return out


def sequence_logps(model, batch: PairBatch, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each row's labelled tokens, their count), per row.

    Like `logits.summed_loss`, the vocabulary projection runs only on labelled positions
    where the model exposes its decoder and output embedding."""
    import torch

    ids = torch.tensor(batch.input_ids, device=device)
    mask = torch.tensor(batch.attention_mask, device=device)
    target = torch.tensor(batch.labels, device=device)[:, 1:]
    keep = target != IGNORE
    rows = torch.arange(ids.shape[0], device=device).unsqueeze(1).expand_as(target)[keep]
    parts = decoder_and_head(model)
    if parts is not None:
        decoder, head = parts
        hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        logits = head(hidden[:, :-1][keep]).float()
    else:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1][
            keep].float()
    tok_logp = torch.log_softmax(logits, dim=-1).gather(
        1, target[keep].unsqueeze(1)).squeeze(1)
    n = ids.shape[0]
    summed = torch.zeros(n, device=device, dtype=tok_logp.dtype).index_add(0, rows, tok_logp)
    counts = keep.sum(dim=1)
    return summed, counts


def dpo_loss(policy: torch.Tensor, reference: torch.Tensor, counts: torch.Tensor, *,
             beta: float, kind: str = "sigmoid", label_smoothing: float = 0.0
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair loss and statistics from per-row log-probabilities (chosen rows, then
    rejected rows, as `pair_batches` lays them out)."""
    import torch.nn.functional as F

    n = policy.shape[0] // 2
    if kind == "ipo":
        policy, reference = policy / counts, reference / counts
    pc, pr, rc, rr = policy[:n], policy[n:], reference[:n], reference[n:]
    h = (pc - rc) - (pr - rr)
    if kind == "ipo":
        loss = (h - 1 / (2 * beta)) ** 2
    else:
        loss = -(1 - label_smoothing) * F.logsigmoid(beta * h) \
            - label_smoothing * F.logsigmoid(-beta * h)
    chosen_r, rejected_r = beta * (pc - rc).detach(), beta * (pr - rr).detach()
    return loss, {"chosen_reward": chosen_r, "rejected_reward": rejected_r,
                  "chosen_logp": pc.detach(), "rejected_logp": pr.detach()}


# --- the reference cache ----------------------------------------------------------------------

class ReferenceCache:
    """Reference log-probabilities on disk: one JSON line per pair, {key, chosen, rejected},
    where key = (model identity, starting adapter, pair tokens). Lines are appended and
    fsynced as batches finish, so a run killed while computing them keeps what it had; a
    damaged or foreign line is ignored (and recomputed)."""

    def __init__(self, path: Path | None, model_key: str):
        self.path, self.model_key = (Path(path) if path else None), model_key
        self.values: dict[str, tuple[float, float]] = {}
        if self.path is None or not os.path.lexists(self.path):
            return
        self._check(self.path)
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                    if row["model"] == model_key:
                        self.values[row["key"]] = (float(row["chosen"]), float(row["rejected"]))
                except (ValueError, KeyError, TypeError):
                    continue

    @staticmethod
    def _check(path: Path) -> None:
        if path.is_symlink() or not path.is_file():
            raise WorkbenchError(f"{path}: the reference cache is not a regular file; "
                                 "refusing to read or append to it")

    def missing(self, keys) -> list[str]:
        return [k for k in keys if k not in self.values]

    def add(self, rows: dict[str, tuple[float, float]]) -> None:
        self.values.update(rows)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(self.path):
            self._check(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"model": self.model_key, "key": k, "chosen": c,
                                      "rejected": r}) + "\n" for k, (c, r) in rows.items())
            fh.flush()
            os.fsync(fh.fileno())

    def tensor(self, keys: list[str], device: str) -> torch.Tensor:
        import torch

        if missing := self.missing(keys):
            raise WorkbenchError(f"{len(missing)} pair(s) have no reference log-probabilities: "
                                 "setup scores only the training pairs its schedule "
                                 "(train.max_steps) draws, and the held-out pairs")
        return torch.tensor([self.values[k][0] for k in keys]
                            + [self.values[k][1] for k in keys], device=device,
                            dtype=torch.float32)


def model_key(base_model: str, model_source: str, adapter: dict[str, Any], dtype) -> str:
    """Identity of the reference policy: the base model, and the starting adapter (a fresh
    LoRA, all B zero, is the base model itself whatever its A)."""
    fresh = all(not bool(v.any()) for k, v in adapter.items() if "lora_B" in k)
    if fresh:
        digest = "base"
    else:
        import hashlib

        h = hashlib.sha256()
        for k in sorted(adapter):
            h.update(k.encode())
            h.update(adapter[k].detach().cpu().float().numpy().tobytes())
        digest = h.hexdigest()[:16]
    return f"{base_model}|{model_source}|{digest}|{str(dtype).removeprefix('torch.')}"


def compute_reference(model, pairs: list[TokenizedPair], cache: ReferenceCache, *,
                      batch_size: int, pad_id: int, device: str,
                      progress=None) -> int:
    """Fill `cache` for every pair it lacks, with `model` in eval mode and no gradients.
    Returns the number of reference forward passes (batches) run: 0 when all were cached."""
    import torch

    todo = [p for p in pairs if p.key not in cache.values]
    if not todo:
        return 0
    was_training = model.training
    model.eval()
    passes = 0
    try:
        with torch.no_grad():
            for b in pair_batches(todo, batch_size=batch_size, pad_id=pad_id, seed=0, epoch=0,
                                  shuffle=False):
                lp, _ = sequence_logps(model, b, device)
                n = b.pairs
                cache.add({k: (float(lp[i]), float(lp[n + i])) for i, k in enumerate(b.keys)})
                passes += 1
                if progress:
                    progress(passes)
    finally:
        model.train(was_training)
    return passes
