"""GRPO throughput: the training library's GRPO (`train.grpo_session`) vs TRL's GRPOTrainer,
side by side in one run, on the same single-turn task (issue 44): the same model (the bundled
SmolLM2-135M-Instruct, fp32), LoRA (r 16, alpha 32, dropout 0, q/k/v/o), group size,
prompts per step, completion length, temperature (top-p 1, no top-k), learning rate, loss
(token-level mean, group-scaled advantages, no KL, one update per rollout batch), gradient
checkpointing (off on both sides: TRL's GRPOConfig turns it on by default, so the TRL side sets
`gradient_checkpointing=False` unless `--trl-gradient-checkpointing`) and reward code.

    python benchmarks/bench_grpo_trl.py --make-trl-venv      # once: /tmp/trlvenv (below)
    nice -n 19 python benchmarks/bench_grpo_trl.py [--steps 8 --rounds 2]

TRL lives in a side venv so the project's install is untouched: `--make-trl-venv` makes
/tmp/trlvenv from the same interpreter, points it at this venv's site-packages (a .pth file:
the same torch, transformers, peft, accelerate and datasets, and the workbench) and installs
only `trl` into it (`pip install --no-deps trl==<TRL_VERSION>`; its requirements are all in
the project's venv already).

The task: "What is a + b? Answer with the number only." (a, b seeded); the reward
(`score`, called by both sides) is 1 for the right number first, partial credit for a near
one, and a small brevity term, so a group's rollouts almost never tie (ours runs no update
for a group whose rewards tie; TRL runs every row: a tie would make the update figures
incomparable). The prompt is the bare user turn rendered by the model's chat template on
both sides (ours: a single-turn agent setup with no tools in the prompt, see `agent_setup`).

Measured per step (steps after the first, which is warm-up), each side in its own process,
runs interleaved (ours, TRL, ours, TRL, ...):
- rollout tokens/s: tokens generated (up to and including the end-of-turn token) / the
  rollout phase's seconds (ours: `step_rollouts`, i.e. the agent loop, generation and the
  reward; TRL: `_generate_and_score_completions`, i.e. tokenising, generation, decoding and
  the reward);
- generate tokens/s: the same tokens / the seconds inside transformers' `generate` alone
  (both sides generate with transformers' `generate` on the in-memory PEFT model; counted by
  one wrapper around `GenerationMixin.generate`, the same on both sides);
- update tokens/s: non-padding tokens (prompt + completion) of the rows the update trains /
  the update's seconds (ours: `grpo_session.update`; TRL: the optimizer step's time less the
  rollout phase: forward, backward, clipping, optimizer and scheduler).
JSON goes to --out; a markdown table is printed. Versions and the load average before and
after every run are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRL_VERSION = "1.16.0"
TRL_VENV = "/tmp/trlvenv"
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
LR = 2e-4
MAX_LENGTH = 512  # ours: tokens per update row (prompts here are ~40 tokens: no cut)


# --- the task and its reward (the same code on both sides) ---------------------------------

def items(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"id": f"add{i}", "answer": a + b,
                    "prompt": f"What is {a} + {b}? Answer with the number only."})
    return out


def score(text: str, answer: int) -> float:
    """1 for the right number first, 0.5 * closeness for another number, 0 for none; plus
    up to 0.1 for brevity (so that a group's rewards rarely tie)."""
    m = re.search(r"-?\d+", text)
    r = 0.0
    if m:
        x = int(m.group())
        r = 1.0 if x == answer else 0.5 * max(0.0, 1 - abs(x - answer) / max(abs(answer), 1))
    return r + 0.1 * (1 - min(len(text), 256) / 256)


# --- what both children measure the same way ------------------------------------------------

GEN = {"seconds": 0.0, "tokens": 0, "rows": 0, "prompt_tokens": 0}
THREADS: set[int] = set()  # torch's CPU threads seen inside generate


def count_generate(stop_ids: set[int]) -> None:
    """Wrap transformers' `generate`: its seconds, the tokens it made per row (up to and
    including the first end-of-turn or pad token) and the prompts' non-padding tokens."""
    from transformers.generation.utils import GenerationMixin

    inner = GenerationMixin.generate

    def generate(self, *args, **kw):
        ids = kw.get("input_ids", args[0] if args else None)
        mask = kw.get("attention_mask")
        import torch

        THREADS.add(torch.get_num_threads())
        t0 = time.perf_counter()
        out = inner(self, *args, **kw)
        GEN["seconds"] += time.perf_counter() - t0
        seqs = out if hasattr(out, "shape") else out.sequences
        width = ids.shape[1]
        for row in seqs[:, width:].tolist():
            n = next((j + 1 for j, t in enumerate(row) if t in stop_ids), len(row))
            GEN["tokens"] += n
        GEN["rows"] += seqs.shape[0]
        GEN["prompt_tokens"] += int(mask.sum()) if mask is not None else ids.numel()
        return out

    GenerationMixin.generate = generate


def gen_snapshot() -> dict:
    return dict(GEN)


def gen_delta(before: dict) -> dict:
    return {k: GEN[k] - before[k] for k in GEN}


def stop_ids_of(tok, model) -> set[int]:
    ids = {tok.eos_token_id, tok.pad_token_id}
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return {i for i in ids if i is not None}


def engine_probe(model, tok, prompts: list[str], new_tokens: int) -> dict:
    """The same fixed work in both processes after training: the adapter's model generates
    exactly `new_tokens` for each prompt (sampling, key/value cache, no trainer around it).
    Equal figures on both sides mean the processes' engines are alike and a rollout gap is
    in how each trainer drives `generate`."""
    import torch

    tok.padding_side = "left"
    text = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                    add_generation_prompt=True) for p in prompts]
    enc = tok(text, return_tensors="pt", padding=True, add_special_tokens=False)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    model.eval()
    before = gen_snapshot()
    with torch.no_grad():
        torch.manual_seed(0)
        model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                       pad_token_id=tok.pad_token_id, use_cache=True)
    secs = gen_delta(before)["seconds"]
    return {"rows": len(prompts), "new_tokens": new_tokens, "seconds": secs,
            "tokens_per_s": len(prompts) * new_tokens / secs,
            "threads": torch.get_num_threads()}


def probe_prompts(a) -> list[str]:
    return [x["prompt"] for x in items(a.prompts)] * a.group


def summarise(steps: list[dict]) -> dict:
    """Throughput over the steps after the first (warm-up), and the per-step rows."""
    timed = steps[1:] or steps
    tot = {k: sum(s[k] for s in timed) for k in ("gen_tokens", "rollout_s", "generate_s",
                                                 "update_tokens", "update_s", "step_s",
                                                 "rows", "prompt_tokens")}
    return {
        "rollout_tokens_per_s": tot["gen_tokens"] / tot["rollout_s"],
        "generate_tokens_per_s": tot["gen_tokens"] / tot["generate_s"],
        "update_tokens_per_s": (tot["update_tokens"] / tot["update_s"]
                                if tot["update_s"] else None),
        "step_s": tot["step_s"] / len(timed),
        "rollout_s_per_step": tot["rollout_s"] / len(timed),
        "update_s_per_step": tot["update_s"] / len(timed),
        "completion_tokens_per_rollout": tot["gen_tokens"] / max(tot["rows"], 1),
        "prompt_tokens_per_rollout": tot["prompt_tokens"] / max(tot["rows"], 1),
        "update_tokens_per_step": tot["update_tokens"] / len(timed),
        "mean_reward": statistics.fmean(s["reward_mean"] for s in steps),
        "steps": steps}


def versions() -> dict:
    import peft
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "peft": peft.__version__, "threads": torch.get_num_threads()}
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:
        out["trl"] = None
    return out


# --- ours: the workbench's GRPO on a single-turn agent setup --------------------------------

def agent_setup_factory(a):
    """A single-turn agent: the bare user turn (no system text, no tools in the prompt),
    one model turn whose text is the answer. The runner needs a final tool to exist; the
    toolbox offers none to the prompt or to the update's template (`specs()` is empty)."""
    from workbench.agents.runner import AgentSetup, Budget, Policy, Scaffold
    from workbench.agents.tools import Tool, Toolbox
    from workbench.models.base import GenerationParams

    class NoSpecs(Toolbox):
        def specs(self, names=None):
            return []

    class UserOnly(Scaffold):
        name = "single-turn"

        def start(self, task, system, final):
            return [{"role": "user", "content": task.prompt}]

    class Reply(Policy):
        name = "reply"

        def __init__(self, params):
            self.params = params

        def act(self, model, states, toolbox, budget):
            return model.generate([s.messages for s in states], self.params)

    def make(sampling):
        box = NoSpecs([Tool("answer", "The answer.", {"type": "object", "properties": {
            "text": {"type": "string"}}}, lambda text: {"text": text}, final=True)])
        params = GenerationParams(max_tokens=sampling.max_tokens,
                                  temperature=sampling.temperature, top_p=1.0,
                                  seed=sampling.seed if sampling.temperature else None)
        return AgentSetup(toolbox=box, scaffold=UserOnly(), policy=Reply(params),
                          budget=Budget(max_steps=1, max_tokens=a.max_new_tokens),
                          parse_final=lambda text: {"text": text}, pack="bench")
    return make


def run_ours(a) -> dict:
    from workbench.agents.runner import AgentTask
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model
    from workbench.train import grpo_session as G
    from workbench.train.config import TrainConfig

    model_folder(resolve_chat_model("default"))  # converted once, outside the timing
    tasks = [AgentTask(x["id"], x["prompt"], metadata={"answer": x["answer"]})
             for x in items(a.steps * a.prompts)]

    def reward(traj) -> float:
        last = [m for m in traj.messages if m.role == "assistant"]
        return score(str(last[-1].content or "") if last else "", traj.metadata["answer"])

    cfg = TrainConfig(
        method="grpo", max_steps=a.steps, batch_size=a.prompts * a.group, grad_accum=1,
        max_length=MAX_LENGTH, learning_rate=LR, warmup_ratio=0.0, scheduler="linear",
        eval_fraction=0.0, lora={"r": LORA["r"], "alpha": LORA["alpha"],
                                 "dropout": LORA["dropout"], "target_modules": LORA["targets"]},
        grpo={"group_size": a.group, "tasks_per_step": a.prompts,
              "temperature": a.temperature, "max_new_tokens": a.max_new_tokens,
              "beta": 0.0, "iterations": 1, "loss": "token", "scale_rewards": "group",
              "epsilon": 0.2})
    t0 = time.perf_counter()
    s = G.setup(cfg, tasks=tasks, agent_setup=agent_setup_factory(a), reward=reward,
                model_spec="default", seed=a.seed)
    setup_s = time.perf_counter() - t0
    count_generate(stop_ids_of(s.tokenizer, s.model))
    steps = []
    t1 = time.perf_counter()
    for _ in range(a.steps):
        g0 = gen_snapshot()
        row = G.train_steps(s, 1)[0]
        g = gen_delta(g0)
        steps.append({"step": row["step"], "rollout_s": row["rollout_seconds"],
                      "generate_s": g["seconds"], "gen_tokens": g["tokens"], "rows": g["rows"],
                      "prompt_tokens": g["prompt_tokens"],
                      "update_s": row["update_seconds"],
                      "update_tokens": row.get("update_tokens", 0),
                      "step_s": row["seconds"], "reward_mean": row["reward_mean"],
                      "groups_no_signal": row["groups_no_signal"],
                      "own_completion_tokens_per_s": row["rollout_tokens_per_s"]})
    out = summarise(steps)
    out.update(setup_s=setup_s, train_s=time.perf_counter() - t1,
               engine="transformers generate (LocalChatModel.wrap over the PEFT model)",
               threads_in_generate=sorted(THREADS),
               engine_probe=engine_probe(s.model, s.tokenizer, probe_prompts(a),
                                         a.max_new_tokens))
    return out


# --- TRL's GRPOTrainer ----------------------------------------------------------------------

def run_trl(a) -> dict:
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from datasets import Dataset
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model

    folder = str(model_folder(resolve_chat_model("default")))
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": x["prompt"]}],
                             "answer": x["answer"]} for x in items(a.steps * a.prompts)])

    def reward(prompts, completions, answer, **kw):
        return [score(c[0]["content"] if isinstance(c, list) else c, n)
                for c, n in zip(completions, answer, strict=True)]

    cur: dict = {}
    steps: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            cur.update(t0=time.perf_counter(), g0=gen_snapshot(), roll=0.0, upd_tokens=0,
                       rewards=[])

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - cur["t0"]
            g = gen_delta(cur["g0"])
            steps.append({"step": state.global_step, "rollout_s": cur["roll"],
                          "generate_s": g["seconds"], "gen_tokens": g["tokens"],
                          "rows": g["rows"], "prompt_tokens": g["prompt_tokens"],
                          "update_s": step_s - cur["roll"],
                          "update_tokens": cur["upd_tokens"], "step_s": step_s,
                          "reward_mean": statistics.fmean(cur["rewards"] or [0.0])})

    args = GRPOConfig(
        output_dir=f"/tmp/trl-grpo-bench-{os.getpid()}", max_steps=a.steps,
        per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
        num_generations=a.group, max_completion_length=a.max_new_tokens,
        temperature=a.temperature, top_p=1.0, top_k=0, learning_rate=LR,
        lr_scheduler_type="linear", warmup_steps=0, beta=0.0, epsilon=0.2,
        num_iterations=1, loss_type="dapo", scale_rewards="group", report_to="none",
        save_strategy="no", logging_steps=1000, use_cpu=not torch.cuda.is_available(),
        bf16=False, dataloader_num_workers=0, seed=a.seed, max_grad_norm=1.0,
        weight_decay=0.0, gradient_checkpointing=a.trl_gradient_checkpointing)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds,
                          processing_class=tok,
                          peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"],
                                                 lora_dropout=LORA["dropout"],
                                                 target_modules=LORA["targets"],
                                                 task_type="CAUSAL_LM"),
                          callbacks=[Timer()])
    setup_s = time.perf_counter() - t0
    count_generate(stop_ids_of(tok, trainer.model))
    gen_and_score = trainer._generate_and_score_completions
    compute_loss = trainer.compute_loss

    def timed_rollout(inputs):
        t = time.perf_counter()
        out = gen_and_score(inputs)
        cur["roll"] += time.perf_counter() - t
        cur["rewards"].extend(float(x) for x in
                              trainer._metrics["train"]["reward"][-1:])
        return out

    def counted_loss(model, inputs, *args, **kw):
        cur["upd_tokens"] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        return compute_loss(model, inputs, *args, **kw)

    trainer._generate_and_score_completions = timed_rollout
    trainer.compute_loss = counted_loss
    t1 = time.perf_counter()
    trainer.train()
    out = summarise(steps)
    out.update(setup_s=setup_s, train_s=time.perf_counter() - t1,
               engine="transformers generate (TRL's default: no vLLM, no paged generation)",
               threads_in_generate=sorted(THREADS),
               engine_probe=engine_probe(trainer.model, tok, probe_prompts(a),
                                         a.max_new_tokens))
    return out


# --- the driver -----------------------------------------------------------------------------

def make_trl_venv(path: str) -> None:
    import site

    py = f"{sys.base_prefix}/bin/python3"
    subprocess.run([py, "-m", "venv", path], check=True)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ours = next(p for p in site.getsitepackages() if p.startswith(sys.prefix))
    Path(f"{path}/lib/{ver}/site-packages/zz_workbench_venv.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n")
    subprocess.run([f"{path}/bin/pip", "install", "-q", "--no-deps", f"trl=={TRL_VERSION}"],
                   check=True)
    subprocess.run([f"{path}/bin/python", "-c", "import trl, workbench; print('trl',"
                    " trl.__version__)"], check=True)


def child(a) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")
    t0 = time.perf_counter()
    res = run_ours(a) if a.child == "ours" else run_trl(a)
    res["child_wall_s"] = time.perf_counter() - t0
    res["versions"] = versions()
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print("RESULT " + json.dumps(res))


def fmt(x, nd=1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def table(runs: list[dict], summary: dict) -> str:
    lines = ["| run | side | rollout tok/s | generate tok/s | update tok/s | step s "
             "(rollout + update) | tokens/rollout (prompt + completion) | engine probe tok/s | "
             "wall s | load before -> after |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['round']} | {r['side']} | failed | | | | | | | |")
            continue
        lines.append(
            f"| {r['round']} | {r['side']} | {fmt(r['rollout_tokens_per_s'])} | "
            f"{fmt(r['generate_tokens_per_s'])} | {fmt(r['update_tokens_per_s'])} | "
            f"{fmt(r['step_s'], 2)} ({fmt(r['rollout_s_per_step'], 2)} + "
            f"{fmt(r['update_s_per_step'], 2)}) | "
            f"{fmt(r['prompt_tokens_per_rollout'])} + "
            f"{fmt(r['completion_tokens_per_rollout'])} | "
            f"{fmt(r.get('engine_probe', {}).get('tokens_per_s'))} | {fmt(r['wall_s'])} | "
            f"{r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f} |")
    lines.append("")
    for k in ("rollout_tokens_per_s", "generate_tokens_per_s", "update_tokens_per_s",
              "engine_probe_tokens_per_s"):
        s = summary.get(k, {})
        lines.append(f"- {k} (median over rounds): ours {fmt(s.get('ours'))}, TRL "
                     f"{fmt(s.get('trl'))}, ours/TRL **{fmt(s.get('ours_over_trl'), 2)}x**")
    return "\n".join(lines)


def write(a, runs: list[dict]) -> dict:
    """Medians per side over the rounds and ours/TRL; the JSON to --out. Returns the summary."""
    summary: dict = {}
    for r in runs:
        if "engine_probe" in r:
            r["engine_probe_tokens_per_s"] = r["engine_probe"]["tokens_per_s"]
    for k in ("rollout_tokens_per_s", "generate_tokens_per_s", "update_tokens_per_s",
              "step_s", "engine_probe_tokens_per_s"):
        per = {side: [r[k] for r in runs if r["side"] == side and r.get(k)]
               for side in ("ours", "trl")}
        s = {side: statistics.median(v) if v else None for side, v in per.items()}
        if s["ours"] and s["trl"]:
            s["ours_over_trl"] = (s["trl"] / s["ours"] if k == "step_s"
                                  else s["ours"] / s["trl"])
        summary[k] = s
    ok = [r for r in runs if "versions" in r]
    result = {
        "config": {"model": "default (bundled SmolLM2-135M-Instruct, fp32)", "lora": LORA,
                   "learning_rate": LR, "steps": a.steps, "prompts_per_step": a.prompts,
                   "group_size": a.group, "max_new_tokens": a.max_new_tokens,
                   "temperature": a.temperature, "top_p": 1.0, "top_k": None,
                   "beta": 0.0, "iterations": 1, "loss": "token mean (TRL: dapo)",
                   "gradient_checkpointing": {"ours": False,
                                              "trl": a.trl_gradient_checkpointing},
                   "warmup_steps_excluded": 1, "seed": a.seed, "rounds": a.rounds,
                   "task": "single-turn addition, shared reward `score`"},
        "versions": {r["side"]: r["versions"] for r in ok},
        "cpu_count": os.cpu_count(), "nice": os.nice(0),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "summary": summary, "runs": runs}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description="GRPO throughput, ours vs TRL's GRPOTrainer")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per run (the "
                    "first is warm-up, left out of the throughput)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (tasks) per step")
    ap.add_argument("--group", type=int, default=4, help="rollouts per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2, help="ours, TRL pairs, interleaved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL's own default (on); off by default here, as ours is")
    ap.add_argument("--trl-python", default=f"{TRL_VENV}/bin/python")
    ap.add_argument("--make-trl-venv", action="store_true",
                    help=f"make {TRL_VENV} (trl {TRL_VERSION} over this venv) and exit")
    ap.add_argument("--out", default="benchmarks/results/grpo_trl.json")
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_trl_venv:
        return make_trl_venv(TRL_VENV)
    if a.child:
        return child(a)
    common = ["--steps", str(a.steps), "--prompts", str(a.prompts), "--group", str(a.group),
              "--max-new-tokens", str(a.max_new_tokens), "--temperature", str(a.temperature),
              "--seed", str(a.seed)] + (["--trl-gradient-checkpointing"]
                                        if a.trl_gradient_checkpointing else [])
    runs = []
    for rnd in range(1, a.rounds + 1):
        for side, py in (("ours", sys.executable), ("trl", a.trl_python)):
            before = os.getloadavg()
            t0 = time.perf_counter()
            # one OpenMP wait policy for both sides (the workbench's passive unless the
            # environment names one): a child that imports torch before the workbench
            # would otherwise spin while the other waits passively, 1.1-1.5x apart
            env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY",
                                                                   "passive")}
            p = subprocess.run([py, __file__, "--child", side, *common],
                               check=False, capture_output=True, text=True, env=env)
            run = {"round": rnd, "side": side, "wall_s": time.perf_counter() - t0,
                   "load_before": before, "load_after": os.getloadavg()}
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not line:
                run["error"] = p.stderr[-1500:]
                print(f"round {rnd} {side} FAILED\n{p.stderr[-1500:]}", flush=True)
            else:
                run.update(json.loads(line[0][7:]))
                print(f"round {rnd} {side}: rollout {run['rollout_tokens_per_s']:.1f} tok/s, "
                      f"update {fmt(run['update_tokens_per_s'])} tok/s, "
                      f"wall {run['wall_s']:.0f} s", flush=True)
            runs.append(run)
            write(a, runs)  # after every run: a stopped benchmark keeps what it measured
    summary = write(a, runs)
    print(table(runs, summary))


if __name__ == "__main__":
    main()
