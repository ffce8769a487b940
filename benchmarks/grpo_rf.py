"""GRPO on the RF design pack with the bundled model: the tools agent (guided policy) trained
on its own rollouts against the pack's reward, held-out accuracy before and after.

    python benchmarks/grpo_rf.py [--steps 12] [--group 4] [--tasks 4] [--heldout 16]
        [--temperature 0.5] [--lr 5e-4] [--beta 0] [--out runs/grpo_rf] [--json FILE]
        [--generate-per-family N [--generate-seed 0]]
        [--distill-weight W [--distill-teacher self|SPEC] [--privileged TEMPLATE]
         [--reward-weight R]]

The 40 design items are split by a seeded shuffle into held-out items (never rolled out in
training) and training items. With `--generate-per-family N` the pool is the 40 and N
items per family generated from the calculators (`rf.generate`, at most 79, none repeating a
shipped item), so the test, dev and training splits can be large: e.g.
`--generate-per-family 50 --heldout 200 --dev 100` leaves 140 training items. Each step
rolls out `--tasks` training items `--group` times (the guided policy sampling over its
candidates' scores at `--temperature`), rewards them with `rf.reward` (correct within
tolerance, less 0.1 per model mistake) and updates the LoRA adapter. The held-out items
run greedily before training and every `--eval-every` steps; the adapter with the best
held-out reward is kept. The report: per-step figures (reward, within-group spread, groups
with no signal, tool calls, clip fraction, rollout and update tokens/s) and held-out
accuracy of the prompted agent against the kept adapter, each with a Wilson interval, and
an exact McNemar test on the same items. Killed, it resumes from its checkpoints in
`--out`. With `--distill-weight` above 0 the same rollouts also train by on-policy
distillation (`train.grpo.distill`): `--distill-teacher self` (the base model reading
`--privileged`, a format string over the task's metadata such as
'The answer is {item[answer]}.') or a model spec; `--reward-weight 0` is distillation only.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--heldout", type=int, default=16)
    ap.add_argument("--dev", type=int, default=0, help="items that choose the kept adapter "
                    "(0: the held-out items themselves)")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--model", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generate-per-family", type=int, default=None,
                    help="add this many generated design items per family to the 40 "
                         "(default: the 40 only)")
    ap.add_argument("--generate-seed", type=int, default=None,
                    help="the generated items' draw, 0 unless given (their ids carry it)")
    ap.add_argument("--distill-weight", type=float, default=0.0,
                    help="weight of the on-policy distillation advantage (0: off)")
    ap.add_argument("--distill-teacher", default="self",
                    help="self (the base model with --privileged) or a model spec")
    ap.add_argument("--privileged", default="",
                    help="the self-distillation teacher's context, a format string over "
                         "the task's metadata, e.g. 'The answer is {item[answer]}.'")
    ap.add_argument("--reward-weight", type=float, default=1.0,
                    help="weight of the reward's group advantage (0: distillation only)")
    ap.add_argument("--out", type=Path, default=Path("runs/grpo_rf"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--compare-prefix", action="store_true",
                    help="time one forward and backward pass over step 1's rollouts with "
                         "the shared prompt run once and with every rollout run whole")
    a = ap.parse_args()

    from workbench.agent_packs.config import AgentConfig
    from workbench.agent_packs.rf import api as rf
    from workbench.agent_packs.rf.bench import correct
    from workbench.evaluate.stats import mcnemar_exact, wilson_interval
    from workbench.train import grpo_session as G
    from workbench.train.adapter import load_adapter_state
    from workbench.train.config import TrainConfig

    items = rf.load_items("datasets/rf_design")
    if a.generate_per_family:
        from workbench.agent_packs.rf.generate import generate

        items += generate(a.generate_per_family, a.generate_seed or 0)
    random.Random(a.seed).shuffle(items)
    # test items report the result; dev items (with --dev) choose the kept adapter, so the
    # reported figure is not the one the choice was made on
    held, dev = items[:a.heldout], items[a.heldout:a.heldout + a.dev]
    train = items[a.heldout + a.dev:]
    ac = AgentConfig(pack="rf", policy="guided")

    def agent_setup(smp: G.Sampling):
        return rf.tools_setup(ac, temperature=smp.temperature, seed=smp.seed,
                              max_tokens=smp.max_tokens)

    cfg = TrainConfig(method="grpo", max_steps=a.steps, learning_rate=a.lr, batch_size=4,
                      max_length=2560, warmup_ratio=0.0, scheduler="constant", save_every=1,
                      lora={"r": 16, "alpha": 32, "dropout": 0.0},
                      grpo={"group_size": a.group, "tasks_per_step": a.tasks,
                            "temperature": a.temperature, "beta": a.beta,
                            "eval_every": a.eval_every,
                            "distill": {"weight": a.distill_weight,
                                        "teacher": a.distill_teacher,
                                        "privileged": a.privileged,
                                        "reward_weight": a.reward_weight}})
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    s = G.setup(cfg, model_spec=a.model, tasks=[rf.design_task(i) for i in train],
                held_out=[rf.design_task(i) for i in (dev or held)], agent_setup=agent_setup,
                reward=rf.reward, seed=a.seed, checkpoint_dir=a.out / "checkpoints")
    if (last := G.restore_checkpoint(s)):
        print(f"resuming from {last.name}", flush=True)
    setup_s = time.perf_counter() - t0

    def held_out() -> tuple[list[bool], float]:
        """Greedy runs of the held-out items: (correct per item, mean reward)."""
        if not held:
            return [], 0.0
        groups = G.rollout(s, [rf.design_task(i) for i in held], group_size=1,
                           sampling=G.Sampling(0.0, 0, cfg.grpo.max_new_tokens),
                           desc="held-out")
        out = [correct(_value(r), it) for it, (r,) in zip(held, groups, strict=True)]
        return out, sum(r.reward for (r,) in groups) / len(groups)

    start: list[bool] = []
    if s.step == 0 and held:
        start, reward = held_out()
        if not dev:  # the step-0 evaluation GRPO keeps the best against
            s.start_reward = reward
            s.best_step, s.best_reward, s.best_state = 0, reward, G.adapter_state(s)
    log = a.out / "steps.jsonl"

    def on_step(row: dict) -> None:
        with open(log, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)

    t1 = time.perf_counter()
    G.train_steps(s, s.total - s.step, on_step=on_step)
    train_s = time.perf_counter() - t1
    G.export(s, a.out / "adapter")
    # the last step's adapter (evaluated at the end of training when the test items are
    # the held-out ones); the kept one is it, the start, or an earlier step's
    if dev or not s.heldout:
        last, _ = held_out()
    else:
        last = [correct(_value(r), it) for it, r in zip(held, s.heldout, strict=True)]
    if s.best_step == s.step or s.best_state is None:
        end = last
    elif s.best_step == 0 and start:
        end = list(start)
    else:
        load_adapter_state(s, s.best_state)
        end, _ = held_out()
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f" {shlex.quote(str(v))}")
             for k, v in vars(a).items() if v is not None and v is not False]
    res = {"command": "python benchmarks/grpo_rf.py " + " ".join(flags),
           "train_items": len(train), "heldout_items": len(held), "dev_items": len(dev),
           "config": cfg.grpo.model_dump(), "learning_rate": a.lr,
           "setup_seconds": round(setup_s, 1), "train_seconds": round(train_s, 1),
           "best_step": s.best_step, "heldout_reward_start": s.start_reward,
           "heldout_reward_best": s.best_reward, "steps": s.metrics}
    for name, ok in (("agent", start), ("agent+grpo", end), ("agent+grpo_last_step", last)):
        if ok:
            k = sum(ok)
            res[name] = {"correct": k, "n": len(ok), "accuracy": k / len(ok),
                         "wilson95": list(wilson_interval(k, len(ok)))}
    if end and last:  # per test item: right at the start (None: a resumed run), kept, last
        res["per_item"] = {it.id: [x, y, z] for it, x, y, z in zip(
            held, start or [None] * len(held), end, last, strict=True)}
    for tag, after in (("", end), ("_last_step", last)):
        if start and after:
            res["mcnemar_p" + tag] = mcnemar_exact(start, after)
            res["changed" + tag] = {
                "gained": sum(not x and y for x, y in zip(start, after, strict=True)),
                "lost": sum(x and not y for x, y in zip(start, after, strict=True))}
    if a.compare_prefix:
        res["prefix_sharing"] = prefix_timing(s)
    text = json.dumps(res, indent=1)
    (a.out / "result.json").write_text(text)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text)
    print(json.dumps({k: v for k, v in res.items() if k != "steps"}, indent=1))


def _value(rollout) -> float | None:
    v = (rollout.trajectory.final or {}).get("value")
    return float(v) if isinstance(v, (int, float)) else None


def prefix_timing(s) -> dict:
    """Seconds of one forward and backward pass over step 1's rollouts (one micro-batch of
    `train.batch_size`), shared prompt run once against every rollout whole."""
    from workbench.agents.rollout import Rollout
    from workbench.train import grpo_session as G
    from workbench.train.grpo import seq_batch, token_logps

    path = G.rollouts_file(s, 0)
    flat = [Rollout.model_validate_json(x) for x in path.read_text().splitlines()[1:]]
    groups = [flat[i:i + s.cfg.grpo.group_size] for i in range(0, len(flat),
                                                                s.cfg.grpo.group_size)]
    seqs = G.sequences(s, groups)[:s.cfg.batch_size]
    out = {"rows": len(seqs), "tokens": sum(len(q.input_ids) for q in seqs),
           "policy_tokens": sum(q.n_policy for q in seqs)}
    for share in (True, False):
        b = seq_batch(seqs, s.tokenizer.pad_token_id, s.device, share_prefix=share)
        t0 = time.perf_counter()
        token_logps(s.model, b).sum().backward()
        out["shared" if share else "whole"] = {"prefix": b.prefix,
                                               "seconds": round(time.perf_counter() - t0, 2)}
        s.optimizer.zero_grad(set_to_none=True)
    return out


if __name__ == "__main__":
    main()
