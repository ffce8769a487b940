"""On-policy distillation as a second loss on GRPO's rollouts: a teacher scores the tokens the
policy sampled (its own tokens only, the mask GRPO uses), and each such token's advantage
gains `weight x (log p_teacher - log p_student)`.

That is the per-token reverse-KL estimator of on-policy distillation (GKD, Agarwal et al.
2024, with the student's own samples and the reverse KL; Lu & Thinking Machines 2025,
"On-Policy Distillation": advantage = -(log p_student - log p_teacher) per token, discount
0). Put into the policy-gradient surrogate, its gradient is
E_student[(log p_student - log p_teacher) grad log p_student], the gradient of the
per-token reverse KL(student || teacher) on the sampled tokens, so the student is pulled
toward what the teacher would have written, on the states the student itself reaches. It
needs the teacher's log-probability of each sampled token only (no full distributions),
which is what a server or another backend can return.

Two teachers:
- another model through the models protocol (`ChatModel.token_logprobs`): it reads the
  rollout as the student's template renders it, and its tokens are matched to the
  student's by character spans (`align_logprobs`): one to one when the tokenizers agree,
  otherwise each run of text both split at the same places shares its teacher log-prob
  among its student tokens;
- self-distillation: the base model (adapter off) reading the same conversation with
  privileged context (e.g. the gold answer) appended to the task's first user turn
  (`teacher_sequence`); the policy tokens are the same tokens, so log-probs match one to one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.agents.rollout import Rollout
from workbench.errors import BackendError, WorkbenchError
from workbench.io import atomic_write_text
from workbench.models import load_model
from workbench.records import ChatExample, Message
from workbench.train.config import DistillSettings
from workbench.train.data import IGNORE, tokenize_example
from workbench.train.grpo import PolicySequence

if TYPE_CHECKING:
    import torch

    from workbench.models.base import ChatModel, TokenLogprobs

FIELD = "train.grpo.distill"


def distill_advantages(old_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Per-token advantage -(log p_student - log p_teacher), from the log-probs of the
    policy that sampled the tokens (GRPO's `old_logp`): positive where the teacher finds
    the token likelier than the student did."""
    return teacher_logp - old_logp


# --- self-distillation: the same model, privileged context in its prompt --------------------

def privileged_text(template: str, metadata: dict[str, Any], task_id: str) -> str:
    """The privileged context of one rollout: `template` formatted with its task's metadata
    (`{item[answer]}` reaches into a nested field)."""
    try:
        return template.format(**metadata)
    except (KeyError, IndexError, AttributeError, ValueError) as e:
        have = ", ".join(sorted(metadata)) or "none"
        raise WorkbenchError(f"{FIELD}.privileged: {template!r} cannot be filled for task "
                             f"{task_id} ({type(e).__name__}: {e}; its metadata has {have})"
                             ) from None


def with_context(messages: Sequence[Message], context: str) -> list[Message]:
    """The conversation with `context` appended to its first user turn, nothing else
    changed (the teacher's prompt differs from the student's by that context only)."""
    out, done = [], False
    for m in messages:
        if not done and m.role == "user":
            m = m.model_copy(update={"content": f"{m.content or ''}\n\n{context}"})
            done = True
        out.append(m)
    if not done:
        raise WorkbenchError(f"{FIELD}.privileged: the rollout has no user turn to put the "
                             "privileged context in")
    return out


def teacher_sequence(tok, rollout: Rollout, student: PolicySequence, context: str
                     ) -> PolicySequence:
    """The rollout as the self-distillation teacher reads it: `context` in the first user
    turn, then the same policy tokens as `student` (cut where the student's were cut by
    train.max_length), marked the same way."""
    t = rollout.trajectory
    last = max(i for i, m in enumerate(t.messages) if m.role == "assistant")
    msgs = with_context(t.messages[:last + 1], context) if context else t.messages[:last + 1]
    tk = tokenize_example(tok, ChatExample(messages=msgs, tools=t.tools or None, id=t.id))
    ids, mask = tk.input_ids, [int(x != IGNORE) for x in tk.labels]
    want = [x for x, m in zip(student.input_ids[1:], student.mask[1:], strict=True) if m]
    if want:  # keep up to the student's last policy token
        seen, end = 0, 0
        for j in range(1, len(ids)):
            seen += mask[j]
            if seen == len(want):
                end = j + 1
                break
        ids, mask = ids[:end], mask[:end]
    got = [x for x, m in zip(ids[1:], mask[1:], strict=True) if m]
    if got != want:
        raise WorkbenchError(f"{FIELD}: with the privileged context the template renders "
                             f"rollout {t.id}'s own turns as other tokens; self-distillation "
                             "needs them unchanged")
    return PolicySequence(id=t.id, group=rollout.group, input_ids=ids, mask=mask,
                          reward=rollout.reward)


def self_teacher_view(tok, rollout: Rollout, student: PolicySequence, template: str
                      ) -> PolicySequence:
    """`teacher_sequence` with the privileged context `template` makes of the rollout's
    task metadata (none for an empty template)."""
    t = rollout.trajectory
    context = privileged_text(template, t.metadata, t.task_id) if template else ""
    return teacher_sequence(tok, rollout, student, context)


# --- another model through the models protocol -----------------------------------------------

def distill_teacher(settings: DistillSettings, teacher: ChatModel | None) -> ChatModel | None:
    """The teacher model of a session: `teacher` when given (it stands for the spec in
    `settings.teacher`), else loaded from that spec; None for self-distillation or with
    distillation off. Refuses a backend that cannot return token log-probs."""
    if teacher is not None and settings.teacher == "self":
        raise WorkbenchError(f"a teacher model was passed but {FIELD}.teacher is 'self' "
                             "(the base model): name the teacher there, or pass none")
    if not settings.weight or settings.teacher == "self":
        return None
    if teacher is None:
        teacher = load_model(settings.teacher)
    if not teacher.capabilities.token_logprobs:
        raise WorkbenchError(f"{FIELD}.teacher {settings.teacher}: backend "
                             f"{teacher.backend_name!r} does not return token log-probs "
                             "(a transformers, llama.cpp, ct2 or OpenAI-compatible server "
                             "model does)")
    return teacher


def teacher_identity(teacher: ChatModel | None, base_model: str, privileged: str) -> str:
    """Who scores the rollouts (part of a saved teacher file's key): the base model with its
    privileged context, or the teacher model's identity."""
    if teacher is None:
        return f"self:{base_model}|{privileged}"
    return f"model:{teacher.identity}"


def token_starts(tok, ids: Sequence[int]) -> tuple[str, list[int]]:
    """The text of `ids` (special tokens written out) and each token's first character:
    from the tokenizer's offsets where re-tokenising the text gives the same ids, else by
    decoding every prefix (slower, exact)."""
    text = tok.decode(list(ids), skip_special_tokens=False,
                      clean_up_tokenization_spaces=False)
    try:
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == list(ids):
            return text, [a for a, _ in enc["offset_mapping"]]
    except NotImplementedError:  # a slow tokenizer has no offsets
        pass
    starts = [len(tok.decode(list(ids[:j]), skip_special_tokens=False,
                             clean_up_tokenization_spaces=False)) for j in range(len(ids))]
    return text, starts


def align_logprobs(starts: Sequence[int], mask: Sequence[int], n_chars: int,
                   teacher: TokenLogprobs) -> list[float]:
    """The teacher's log-prob of each student policy token (`mask[j] == 1`, j >= 1), in
    order. The text is cut into runs at every place where both tokenisations start a
    token; a run's teacher log-prob (the sum over its teacher tokens) is shared equally by
    its student tokens, which is one to one where the tokenizers agree, and keeps each
    run's sum, the sequence-level estimate, exact where they do not."""
    t_starts, t_lp = teacher.offsets, teacher.logprobs
    cuts = sorted((set(starts) & set(t_starts)) | {n_chars})
    out: list[float] = []
    si = ti = 0
    for lo, hi in pairwise(cuts):
        s_in = []
        while si < len(starts) and starts[si] < hi:
            if starts[si] >= lo:
                s_in.append(si)
            si += 1
        total, missing = 0.0, False
        while ti < len(t_starts) and t_starts[ti] < hi:
            if t_starts[ti] >= lo:
                lp = t_lp[ti]
                missing |= lp is None
                total += lp or 0.0
            ti += 1
        own = [j for j in s_in if j >= 1 and mask[j]]
        if own and missing:
            raise WorkbenchError(f"{FIELD}.teacher gave no log-prob for a token of the "
                                 "policy's turns (it may have cut the text)")
        if own:
            out += [total / len(s_in)] * len(own)
    if len(out) != sum(mask[1:]):
        raise WorkbenchError(f"{FIELD}.teacher's tokens do not cover the policy's turns: "
                             f"{len(out)} of {sum(mask[1:])} tokens aligned")
    return out


def protocol_teacher_logps(teacher: ChatModel, tok, seq: PolicySequence) -> list[float]:
    """The teacher model's log-prob of each of `seq`'s policy tokens: the rollout's text
    (as the student's template rendered it) scored by `teacher.token_logprobs`, aligned to
    the student's tokens."""
    text, starts = token_starts(tok, seq.input_ids)
    try:
        scored = teacher.token_logprobs(text)
    except BackendError as e:
        raise WorkbenchError(f"{FIELD}.teacher: {e}") from None
    return align_logprobs(starts, seq.mask, len(text), scored)


def teacher_logps(teacher: ChatModel | None, tok, rollouts: Sequence[Rollout],
                  seqs: Sequence[PolicySequence], privileged: str,
                  base_logps: Callable[[list[PolicySequence]], list[list[float]]]
                  ) -> list[list[float]]:
    """The teacher's log-prob of every policy token of every sequence (empty for one without
    policy tokens), `seqs[i]` being `rollouts[i]` tokenised: `teacher` through the models
    protocol, or (None) `base_logps` (the base model, no gradients) on the self-teacher's
    views with the privileged context."""
    todo = [i for i, q in enumerate(seqs) if q.n_policy]
    if teacher is not None:
        lps = [protocol_teacher_logps(teacher, tok, seqs[i]) for i in todo]
    else:
        lps = base_logps([self_teacher_view(tok, rollouts[i], seqs[i], privileged)
                          for i in todo])
    out: list[list[float]] = [[] for _ in seqs]
    for i, lp in zip(todo, lps, strict=True):
        out[i] = lp
    return out


# --- the teacher's log-probs beside the step's rollouts --------------------------------------

def read_teacher_file(path: Path | None, key: str, n: int) -> list[list[float]] | None:
    """The saved log-probs of a step's `n` sequences, or None when there is no file or it
    was made under another key (another adapter, teacher or setting)."""
    if path is None or not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    head = json.loads(lines[0]) if lines else {}
    if head.get("key") != key or len(lines) != n + 1:
        return None
    return [json.loads(x) for x in lines[1:]]


def write_teacher_file(path: Path | None, step: int, key: str,
                       logps: list[list[float]]) -> None:
    """Write a step's teacher log-probs atomically (a header with the key, then one list per
    sequence); JSON floats read back exactly, so a resume sees the same values."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"step": step + 1, "key": key}) + "\n"
                      + "".join(json.dumps(lp) + "\n" for lp in logps))
