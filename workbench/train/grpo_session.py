"""GRPO as a library session, in the shape of SFT's and DPO's (`session`): set up, advance N
optimizer steps at a time, checkpoint, export.

    s = setup(cfg, model=model, tokenizer=tok, tasks=tasks, agent_setup=pack_setup,
              reward=pack.reward, held_out=dev_tasks, checkpoint_dir=ck)
    rows = train_steps(s, 10)   # each step: rollouts, then the update; continues where it is
    export(s, "runs/x/adapter") # the best adapter by held-out reward (train.grpo.keep_best)

A step takes `grpo.tasks_per_step` tasks (a seeded order per pass over the tasks), runs each
`grpo.group_size` times with the adapter being trained (`agents.rollout.sample_groups`: tools
live, the pack's reward), tokenises the rollouts (the policy's own tokens marked), and
updates the adapter `grpo.iterations` times on them, each update accumulating the gradients
of micro-batches of `train.batch_size` rollouts. Rollouts whose advantage is 0 (a group with
no signal) give no gradient and, without a KL term, are not run through the model at all.

The rollout batch of a step is written (`<checkpoints>/rollouts/step-N.jsonl`, keyed by the
adapter's tensors) before its update, and every random draw is seeded by (seed, step): a
killed run resumed from its newest checkpoint redoes the same steps exactly, reading the
rollouts it had already made. `pack_setup(Sampling)` builds the pack's agent setup with
the sampling it is given (temperature 0: greedy, for the held-out evaluation).

With `grpo.distill.weight` above 0 a teacher (`grpo_distill`) scores each step's saved
rollouts and its log-probs are saved beside them before the update, as the rollouts are.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.agents.rollout import RewardFn, Rollout, group_stats, sample_groups
from workbench.agents.runner import AgentSetup, AgentTask
from workbench.errors import TrainingInterrupted, WorkbenchError
from workbench.io import atomic_write_text, sha256_text
from workbench.models.templates import template_fingerprint
from workbench.records import RunManifest, library_versions
from workbench.train import checkpoint as ckpt
from workbench.train.adapter import adapter_state, adapter_swapped, load_adapter_state
from workbench.train.adapter_folder import export_adapter
from workbench.train.config import TrainConfig
from workbench.train.grpo import (
    PolicySequence,
    group_advantages,
    grpo_token_loss,
    seq_batch,
    token_logps,
    token_weights,
    tokenize_rollout,
)
from workbench.train.grpo_distill import (
    distill_advantages,
    distill_teacher,
    read_teacher_file,
    teacher_identity,
    teacher_logps,
    write_teacher_file,
)
from workbench.train.step import lr_at

if TYPE_CHECKING:
    import threading

    from workbench.models.base import ChatModel

BEST = "best_adapter.safetensors"  # in a checkpoint: the best adapter so far


@dataclass(frozen=True)
class Sampling:
    """How the pack's policy samples in a rollout: temperature (0: greedy), seed, tokens
    per model turn."""

    temperature: float
    seed: int
    max_tokens: int


SetupFactory = Callable[[Sampling], AgentSetup]


@dataclass
class GrpoSession:
    """One GRPO training between calls; `step`, `metrics` and the best adapter advance."""

    cfg: TrainConfig
    seed: int
    model: Any  # a PeftModel carrying the adapter being trained
    tokenizer: Any
    optimizer: Any
    params: list
    device: str
    dtype: Any
    total: int
    warmup: int
    base_model: str
    model_source: str
    tasks: list[AgentTask]
    held_out: list[AgentTask]
    agent_setup: SetupFactory
    reward: RewardFn
    reference: dict[str, Any] | None = None  # the starting adapter (KL); None: base model
    checkpoint_dir: Path | None = None
    step: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)
    start_reward: float | None = None  # held-out reward before the first step
    best_step: int | None = None
    best_reward: float | None = None
    best_state: dict[str, Any] | None = None
    seconds: float = 0.0
    policy: Any = None  # the adapter being trained as a chat model (`policy_model`)
    heldout: list[Rollout] | None = None  # the last held-out evaluation's rollouts
    teacher: ChatModel | None = None  # the distillation teacher (None: self or off)


def setup(cfg: TrainConfig, *, tasks: Sequence[AgentTask], agent_setup: SetupFactory,
          reward: RewardFn, held_out: Sequence[AgentTask] = (), seed: int = 0,
          model_spec: str | None = None, model=None, tokenizer=None,
          checkpoint_dir: str | Path | None = None,
          teacher: ChatModel | None = None) -> GrpoSession:
    """A session at step 0: the model with its adapter (from `cfg.lora`, or
    `cfg.init_adapter`, which is then the KL reference), the optimizer and the schedule
    (`train.max_steps`, or `train.epochs` passes over the tasks). With distillation on and
    `grpo.distill.teacher` a model spec, the teacher is loaded here unless `teacher` (a
    chat model already loaded) is given."""
    from workbench.train.session import (
        _distributed,
        _placement,
        _setup_model,
        _setup_optimizer,
        _setup_tokenizer,
    )

    if cfg.method != "grpo":
        raise WorkbenchError(f"train.method is {cfg.method}: grpo_session trains method grpo")
    if (model_spec is None) == (model is None):
        raise WorkbenchError("pass a model_spec or an in-memory model, not both or neither")
    if model is not None and tokenizer is None:
        raise WorkbenchError("an in-memory model needs its tokenizer: pass tokenizer=")
    if not tasks:
        raise WorkbenchError("GRPO needs tasks to roll out: none were given")
    _, world = _distributed()
    if world > 1:
        raise WorkbenchError("train.method grpo runs in one process for now (rollouts are "
                             "not split across ranks): run it without torchrun")
    tokenizer, folder, _, base_model, model_source = _setup_tokenizer(
        cfg, model_spec=model_spec, model=model, tokenizer=tokenizer)
    device, dtype = _placement(cfg, 1, model)
    model, _ = _setup_model(cfg, model, folder, seed=seed, device=device, dtype=dtype, world=1)
    params, optimizer = _setup_optimizer(cfg, model)
    g = cfg.grpo
    total = cfg.max_steps or max(1, math.ceil(len(tasks) * cfg.epochs / g.tasks_per_step))
    reference = None
    if g.beta and cfg.init_adapter:  # a fresh adapter starts as the base: no copy needed
        reference = {k: v.detach().clone() for k, v in _adapter(model).items()}
    return GrpoSession(
        cfg=cfg, seed=seed, model=model, tokenizer=tokenizer, optimizer=optimizer,
        params=params, device=device, dtype=dtype, total=total,
        warmup=int(total * cfg.warmup_ratio), base_model=base_model,
        model_source=model_source, tasks=list(tasks), held_out=list(held_out),
        agent_setup=agent_setup, reward=reward, reference=reference,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir is not None else None,
        teacher=distill_teacher(g.distill, teacher))


def _adapter(model) -> dict[str, Any]:
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, adapter_name=model.active_adapter)


def _seed(seed: int, what: str, step: int) -> int:
    return random.Random(f"{seed}:{what}:{step}").randrange(2 ** 31)


# --- rollouts ---------------------------------------------------------------------------------

def step_tasks(s: GrpoSession, step: int) -> list[AgentTask]:
    """The tasks of optimizer step `step` (0-based): positions step * k ... in a seeded
    order of the tasks drawn afresh for every pass over them."""
    k, n = s.cfg.grpo.tasks_per_step, len(s.tasks)
    out = []
    for pos in range(step * k, step * k + k):
        epoch, i = divmod(pos, n)
        order = list(range(n))
        random.Random(f"{s.seed}:tasks:{epoch}").shuffle(order)
        out.append(s.tasks[order[i]])
    return out


def policy_model(s: GrpoSession, batch: int):
    """The adapter being trained as a chat model (the models protocol), in memory."""
    from workbench.models.local import LocalChatModel

    if s.policy is None:  # one wrapper: its one-time notices are said once
        s.policy = LocalChatModel.wrap(s.model.get_base_model(), s.tokenizer, device=s.device,
                                       identity=f"grpo:{s.base_model}")
    s.policy.opts.batch_size = max(1, min(batch, 64))
    return s.policy


def rollout(s: GrpoSession, tasks: Sequence[AgentTask], *, group_size: int,
            sampling: Sampling, desc: str) -> list[list[Rollout]]:
    """Groups of rollouts by the adapter as it is now, with generation's settings (eval
    mode, key/value cache) for their duration."""
    was_training, cache = s.model.training, s.model.config.use_cache
    s.model.eval()
    s.model.config.use_cache = True
    try:
        return sample_groups(policy_model(s, len(tasks) * group_size), tasks,
                             s.agent_setup(sampling), group_size=group_size, reward=s.reward,
                             desc=desc)
    finally:
        s.model.config.use_cache = cache
        s.model.train(was_training)


def heldout_reward(s: GrpoSession) -> dict[str, float]:
    """Greedy rollouts of the held-out tasks, one each: their mean reward and tool calls
    (the rollouts stay in `s.heldout` until the next evaluation)."""
    groups = rollout(s, s.held_out, group_size=1, desc="held-out",
                     sampling=Sampling(0.0, _seed(s.seed, "heldout", 0),
                                       s.cfg.grpo.max_new_tokens))
    s.heldout = [g[0] for g in groups]
    st = group_stats(groups)
    return {"heldout_reward": st["reward_mean"],
            "heldout_tool_calls": st["tool_calls_per_rollout"]}


def _policy_key(s: GrpoSession, step: int) -> str:
    """What a saved rollout batch was made from: the adapter's tensors, the settings and
    the seed (a file under another key is made again)."""
    import hashlib

    h = hashlib.sha256(f"{s.seed}|{step}|{s.cfg.grpo.model_dump_json()}|{s.base_model}"
                       .encode())
    for k, v in sorted(_adapter(s.model).items()):
        h.update(k.encode())
        h.update(v.detach().cpu().float().numpy().tobytes())
    return h.hexdigest()[:24]


def rollouts_file(s: GrpoSession, step: int) -> Path | None:
    if s.checkpoint_dir is None:
        return None
    return s.checkpoint_dir / "rollouts" / f"step-{step + 1:06d}.jsonl"


def step_rollouts(s: GrpoSession, step: int) -> tuple[list[list[Rollout]], float, bool]:
    """(step `step`'s groups, seconds spent making them, whether they were read back): the
    saved batch when its key matches, else new rollouts, written before any update."""
    path, key = rollouts_file(s, step), _policy_key(s, step)
    if path is not None and path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        head = json.loads(lines[0]) if lines else {}
        if head.get("key") == key:
            flat = [Rollout.model_validate_json(x) for x in lines[1:]]
            size = s.cfg.grpo.group_size
            return [flat[i:i + size] for i in range(0, len(flat), size)], 0.0, True
    t0 = time.perf_counter()
    g = s.cfg.grpo
    groups = rollout(s, step_tasks(s, step), group_size=g.group_size,
                     sampling=Sampling(g.temperature, _seed(s.seed, "rollout", step),
                                       g.max_new_tokens),
                     desc=f"rollouts, step {step + 1}")
    seconds = time.perf_counter() - t0
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"step": step + 1, "key": key}) + "\n" + "".join(
            r.model_dump_json() + "\n" for grp in groups for r in grp))
    return groups, seconds, False


# --- the distillation teacher ---------------------------------------------------------------

def step_teacher(s: GrpoSession, step: int, groups: list[list[Rollout]],
                 seqs: list[PolicySequence]) -> tuple[float, bool]:
    """Set each sequence's `teacher_logps` for step `step`: read back from the saved file
    (`step-N.teacher.jsonl` beside the rollouts) when its key matches, else scored and
    written before any update. Returns (seconds spent scoring, whether read back)."""
    path = rollouts_file(s, step)
    path = path.with_name(f"{path.stem}.teacher.jsonl") if path is not None else None
    who = teacher_identity(s.teacher, s.base_model, s.cfg.grpo.distill.privileged)
    key = sha256_text(f"{_policy_key(s, step)}|{who}")[:24]
    logps = read_teacher_file(path, key, len(seqs))
    seconds, reread = 0.0, logps is not None
    if logps is None:
        t0 = time.perf_counter()
        logps = teacher_logps(s.teacher, s.tokenizer, [r for g in groups for r in g], seqs,
                              s.cfg.grpo.distill.privileged,
                              lambda views: _no_grad_logps(s, views, reference=False, base=True))
        seconds = time.perf_counter() - t0
        write_teacher_file(path, step, key, logps)
    for q, lp in zip(seqs, logps, strict=True):
        q.teacher_logps = lp
    return seconds, reread


# --- the update -------------------------------------------------------------------------------

def sequences(s: GrpoSession, groups: list[list[Rollout]]) -> list[PolicySequence]:
    """The step's rollouts tokenised, each with its group-normalised advantage."""
    adv = group_advantages([[r.reward for r in grp] for grp in groups],
                           scale=s.cfg.grpo.scale_rewards)
    out = []
    for grp, advs in zip(groups, adv, strict=True):
        for r, a in zip(grp, advs, strict=True):
            seq = tokenize_rollout(s.tokenizer, r, max_length=s.cfg.max_length)
            seq.advantage = a
            out.append(seq)
    return out


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _no_grad_logps(s: GrpoSession, seqs: list[PolicySequence], *, reference: bool,
                   base: bool = False) -> list[list[float]]:
    """Per-token log-probabilities of each sequence's policy tokens, without gradients and
    in eval mode: the policy as it is now, or (`reference`) the starting policy (the base
    model with the adapter switched off, or the starting adapter swapped in for the pass),
    or (`base`) the base model whatever the start (the self-distillation teacher)."""
    import contextlib

    import torch

    was_training = s.model.training
    s.model.eval()
    current = None
    if reference and s.reference is not None and not base:
        current = {k: v.detach().clone() for k, v in _adapter(s.model).items()}
        load_adapter_state(s, s.reference)
    off = s.model.disable_adapter() if base or reference and s.reference is None \
        else contextlib.nullcontext()
    out: list[list[float]] = []
    try:
        with torch.no_grad(), off:
            for chunk in _chunks(seqs, s.cfg.batch_size):
                b = seq_batch(chunk, s.tokenizer.pad_token_id, s.device,
                              share_prefix=not s.cfg.gradient_checkpointing)
                flat = token_logps(s.model, b).tolist()
                for q in chunk:
                    out.append(flat[:q.n_policy])
                    flat = flat[q.n_policy:]
    finally:
        if current is not None:
            load_adapter_state(s, current)
        s.model.train(was_training)
    return out


def update(s: GrpoSession, seqs: list[PolicySequence]) -> dict[str, float]:
    """`grpo.iterations` optimizer updates on the step's sequences (gradients accumulated
    over micro-batches of `train.batch_size`); returns the loss and statistics of the last."""
    import torch

    g, cfg = s.cfg.grpo, s.cfg
    d = g.distill
    weights = token_weights(seqs, g.loss)
    active = [i for i, q in enumerate(seqs)
              if q.n_policy and (q.advantage * d.reward_weight or g.beta or d.weight)]
    if not active:
        return {"loss": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0, "update_tokens": 0}
    if d.weight and any(seqs[i].teacher_logps is None for i in active):
        raise WorkbenchError(f"step {s.step + 1}: distillation is on but the rollouts have "
                             "no teacher log-probs (step_teacher sets them)")
    if g.beta:
        for i, lp in zip(active, _no_grad_logps(s, [seqs[i] for i in active], reference=True),
                         strict=True):
            seqs[i].ref_logps = lp
    if g.iterations > 1:
        for i, lp in zip(active, _no_grad_logps(s, [seqs[i] for i in active],
                                                reference=False), strict=True):
            seqs[i].old_logps = lp
    eps_high = g.epsilon_high if g.epsilon_high is not None else g.epsilon
    stats: dict[str, float] = {}
    for _ in range(g.iterations):
        loss_sum, n_tok, n_clip, kl_sum, tokens, gap_sum = 0.0, 0, 0, 0.0, 0, 0.0
        for chunk in _chunks(active, cfg.batch_size):
            qs = [seqs[i] for i in chunk]
            b = seq_batch(qs, s.tokenizer.pad_token_id, s.device,
                          share_prefix=not cfg.gradient_checkpointing)
            logp = token_logps(s.model, b)
            adv = torch.tensor([q.advantage * d.reward_weight for q in qs],
                               device=s.device)[b.rows]
            w = torch.tensor([weights[i] for i in chunk], device=s.device)[b.rows]
            old = logp.detach() if g.iterations == 1 else \
                torch.tensor([x for q in qs for x in q.old_logps], device=s.device)
            ref = torch.tensor([x for q in qs for x in q.ref_logps], device=s.device) \
                if g.beta else None
            if d.weight:  # per token: the teacher's view of what the student sampled
                teacher = torch.tensor([x for q in qs for x in q.teacher_logps],
                                       device=s.device)
                gain = distill_advantages(old, teacher)
                adv = adv + d.weight * gain
                gap_sum -= float(gain.sum())
            per_tok, st = grpo_token_loss(logp, old, adv, epsilon=g.epsilon,
                                          epsilon_high=eps_high, beta=g.beta, ref_logp=ref)
            loss = (per_tok * w).sum()
            loss.backward()
            loss_sum += float(loss.detach())
            n_tok += int(logp.numel())
            n_clip += int(st["clipped"].sum())
            kl_sum += float(st["kl"].sum())
            tokens += int(b.attention_mask.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(s.params, cfg.max_grad_norm).item()
        if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
            raise WorkbenchError(f"step {s.step + 1}: the GRPO loss or its gradient is not "
                                 f"finite (loss {loss_sum:.4g}, gradient norm {grad_norm:.4g});"
                                 " training stopped before the update. Lower "
                                 "train.learning_rate.")
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        stats = {"loss": loss_sum, "grad_norm": grad_norm,
                 "clip_fraction": n_clip / max(n_tok, 1),
                 "update_tokens": stats.get("update_tokens", 0) + tokens}
        if g.beta:
            stats["kl"] = kl_sum / max(n_tok, 1)
        if d.weight:  # mean of log p_student - log p_teacher: the reverse KL, sampled
            stats["distill_kl"] = gap_sum / max(n_tok, 1)
    return stats


# --- train ------------------------------------------------------------------------------------

def train_steps(s: GrpoSession, n: int, *,
                should_stop: Callable[[], bool] | threading.Event | None = None,
                on_step: Callable[[dict], None] | None = None,
                fault: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run `n` GRPO steps from where the session is; return their metric rows. Checkpoints,
    `should_stop` and `fault` as in `session.train_steps` (`fault("rollouts")` is called
    once a step's rollouts are saved, `fault("teacher")` once the teacher's log-probs of
    them are, both before its update)."""
    import torch

    cfg, g = s.cfg, s.cfg.grpo
    if n < 0 or s.step + n > s.total:
        raise WorkbenchError(f"cannot run {n} steps: {s.total - s.step} of the schedule's "
                             f"{s.total} remain (train.max_steps or train.epochs set it)")
    stop: Callable[[], bool] = (lambda: False) if should_stop is None else \
        should_stop if callable(should_stop) else should_stop.is_set  # a function or an Event
    if s.held_out and s.step == 0 and s.start_reward is None:
        s.start_reward = heldout_reward(s)["heldout_reward"]
        s.best_step, s.best_reward, s.best_state = 0, s.start_reward, _copy(s)
    rows = []
    s.model.train()
    for _ in range(n):
        t0 = time.perf_counter()
        step = s.step
        lr = lr_at(step, s.total, cfg.learning_rate, s.warmup, cfg.scheduler)
        for group in s.optimizer.param_groups:
            group["lr"] = lr
        groups, roll_s, reread = step_rollouts(s, step)
        if fault:
            fault("rollouts")
        seqs = sequences(s, groups)
        teach_s, teach_reread = (step_teacher(s, step, groups, seqs) if g.distill.weight
                                 else (0.0, False))
        if fault and g.distill.weight:
            fault("teacher")
        torch.manual_seed(_seed(s.seed, "update", step))  # dropout: the same on a resume
        t1 = time.perf_counter()
        st = update(s, seqs)
        upd_s = time.perf_counter() - t1
        s.step = done = step + 1
        gen_tokens = sum(r.trajectory.completion_tokens for grp in groups for r in grp)
        row: dict[str, Any] = {
            "step": done, **group_stats(groups), "lr": lr, **st,
            "rollout_seconds": roll_s, "update_seconds": upd_s,
            "rollout_tokens_per_s": gen_tokens / roll_s if roll_s else None,
            "update_tokens_per_s": st["update_tokens"] / upd_s if upd_s and
            st["update_tokens"] else None,
            # cut by train.max_length: their tail (often every policy token) trains nothing
            "rollouts_truncated": sum(q.extra.get("truncated", False) for q in seqs)
            / max(len(seqs), 1),
            "rollouts_reread": reread, "seconds": time.perf_counter() - t0}
        if g.distill.weight:
            row.update(teacher_seconds=teach_s, teacher_reread=teach_reread)
        if s.held_out and (g.eval_every and done % g.eval_every == 0 or done == s.total):
            row.update(heldout_reward(s))
            if s.best_reward is None or row["heldout_reward"] > s.best_reward:
                s.best_step, s.best_reward, s.best_state = done, row["heldout_reward"], _copy(s)
        s.seconds += time.perf_counter() - t0
        s.metrics.append(row)
        rows.append(row)
        if on_step:
            on_step(row)
        saved = None
        if s.checkpoint_dir and cfg.save_every and done % cfg.save_every == 0 \
                and done < s.total:
            saved = save_checkpoint(s, fault=fault)
        if stop():
            if saved is None and s.checkpoint_dir:
                saved = save_checkpoint(s, fault=fault)
            raise TrainingInterrupted(step=done, checkpoint=saved)
    return rows


def _copy(s: GrpoSession) -> dict[str, Any]:
    return {k: v.detach().to("cpu", copy=True) for k, v in _adapter(s.model).items()}


# --- checkpoints and the adapter folder -------------------------------------------------------

def save_checkpoint(s: GrpoSession, *, fault: Callable[[str], None] | None = None) -> Path:
    """A complete checkpoint at the current step (adapter, optimizer, random states,
    metrics, the best adapter so far), keeping the newest `train.save_total_limit`."""
    if s.checkpoint_dir is None:
        raise WorkbenchError("this session has no checkpoint folder: pass checkpoint_dir to "
                             "setup")
    path = ckpt.save_checkpoint(
        s.checkpoint_dir, s.step, model=s.model, optimizer=s.optimizer,
        state={"metrics": s.metrics, "total": s.total, "start_reward": s.start_reward,
               "best_step": s.best_step, "best_reward": s.best_reward},
        extra={BEST: s.best_state} if s.best_state is not None else None, fault=fault)
    ckpt.rotate(s.checkpoint_dir, s.cfg.save_total_limit)
    return path


def restore_checkpoint(s: GrpoSession, checkpoint: str | Path | None = None) -> Path | None:
    """Continue from `checkpoint`, or the newest complete one in the session's folder;
    None when there is none."""
    if checkpoint is None:
        if s.checkpoint_dir is None:
            raise WorkbenchError("no checkpoint given and the session has no checkpoint "
                                 "folder")
        checkpoint = ckpt.latest_checkpoint(s.checkpoint_dir)
        if checkpoint is None:
            return None
    checkpoint = Path(checkpoint)
    if not (checkpoint / ckpt.MARKER).exists():
        raise WorkbenchError(f"{checkpoint}: not a complete checkpoint (no {ckpt.MARKER} "
                             f"marker)")
    state = ckpt.load_checkpoint(checkpoint, model=s.model, optimizer=s.optimizer)
    s.step, s.metrics = state["step"], state.get("metrics", [])
    s.start_reward, s.best_step, s.best_reward = (state.get("start_reward"),
                                                  state.get("best_step"),
                                                  state.get("best_reward"))
    if (checkpoint / BEST).is_file():
        from safetensors.torch import load_file

        s.best_state = load_file(str(checkpoint / BEST))
    return checkpoint


def export(s: GrpoSession, output: str | Path, *, run_id: str | None = None
           ) -> dict[str, Any]:
    """Write the adapter folder (as SFT's and DPO's) and return its manifest: the adapter
    with the best held-out reward when `grpo.keep_best` and there are held-out tasks, else
    the last one."""
    output = Path(output)
    best = s.cfg.grpo.keep_best and s.best_state is not None
    manifest = RunManifest(
        run_id=run_id or output.name, kind="train", config=s.cfg.model_dump(mode="json"),
        input_hashes={"data": sha256_text("\n".join(t.id for t in s.tasks))[:16]},
        versions=library_versions("torch", "transformers", "peft"), seed=s.seed,
        status="completed" if s.step >= s.total else "partial",
        outputs={"base_model": s.base_model, "model_source": s.model_source,
                 "chat_template_fingerprint": template_fingerprint(s.tokenizer),
                 "steps": s.step, "train_examples": len(s.tasks),
                 "eval_examples": len(s.held_out), "device": s.device,
                 "dtype": str(s.dtype).removeprefix("torch."),
                 "adapter_step": s.best_step if best else s.step,
                 "heldout_reward_start": s.start_reward,
                 "heldout_reward_best": s.best_reward,
                 "final": s.metrics[-1] if s.metrics else {}}).to_json()
    with adapter_swapped(s, s.best_state if best and s.best_step != s.step else None):
        export_adapter(s.model, s.tokenizer, output, manifest, s.metrics)
    return manifest


__all__ = ["GrpoSession", "Sampling", "SetupFactory", "adapter_state", "export",
           "heldout_reward", "restore_checkpoint", "save_checkpoint", "setup",
           "step_rollouts", "step_tasks", "step_teacher", "train_steps", "update"]
