"""DPO throughput: the training library's DPO vs TRL's DPOTrainer, side by side in one run:
the same model (the bundled SmolLM2-135M), LoRA, pairs, lengths, batch and beta.

    pip install -e .[bench]      # trl
    python benchmarks/dpo_throughput.py [--steps 6] [--out benchmarks/results/dpo.json]

Each configuration runs in its own process. Throughput is pairs/s and useful (non-padding)
tokens/s of both sides over the steps after the first (warm-up). The reference policy:
ours computes its log-probabilities once before step 1 and caches them on disk (timed apart:
`reference_s`; a second epoch or a resume runs no reference pass); TRL runs the reference
forward inside every step by default (`trl_default`) or precomputes it once
(`trl_precompute`, `precompute_ref_log_probs=True`). `ours_second_epoch` re-runs ours on the
same cache: its `reference_s` is what the cache saves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MAX_LEN = 512
BATCH = 4
BETA = 0.1
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def make_pairs(path: Path, n: int = 64) -> None:
    """Pairs cut from the RF corpus: a question, the paragraph it came from (chosen) against
    another section's paragraph (rejected); 40-250 tokens a side."""
    import random

    from workbench.corpus import ingest
    from workbench.records import PreferencePair

    rng = random.Random(0)
    paras = [p for s in ingest(Path("datasets/rf")).sections for p in s.text.split("\n\n")
             if len(p.split()) > 30]
    rows = []
    for i in range(n):
        p, q = paras[i % len(paras)], paras[(i * 7 + 13) % len(paras)]
        cut = rng.randint(30, 180)
        rows.append(PreferencePair.model_validate({
            "id": f"p{i}", "prompt": [{"role": "user", "content": "Explain: "
                                       + " ".join(p.split()[:12]) + "?"}],
            "chosen": [{"role": "assistant", "content": " ".join(p.split()[:cut])}],
            "rejected": [{"role": "assistant", "content": " ".join(q.split()[:cut])}]}))
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))


def run_ours(data: str, steps: int, cache: str) -> dict:
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model
    from workbench.train.config import TrainConfig
    from workbench.train.session import setup, train_steps

    cfg = TrainConfig(method="dpo", data=data, max_length=MAX_LEN, batch_size=BATCH,
                      max_steps=steps, eval_fraction=0.0, warmup_ratio=0.0,
                      dpo={"beta": BETA},
                      lora={"r": LORA["r"], "alpha": LORA["alpha"], "dropout": LORA["dropout"],
                            "target_modules": LORA["targets"]})
    model_folder(resolve_chat_model("default"))
    t0 = time.perf_counter()
    s = setup(cfg, model_spec="default", seed=0, reference_cache=cache)
    setup_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    rows = train_steps(s, steps)
    timed = rows[1:]
    secs = sum(r["seconds"] for r in timed)
    return {"pairs_per_s": BATCH * len(timed) / secs,
            "tokens_per_s": sum(r["tokens"] for r in timed) / secs,
            "step_s": secs / len(timed), "reference_passes": s.ref_forwards,
            "setup_s": setup_s, "train_s": time.perf_counter() - t1,
            "padding_share": 1 - s.tokens_real / s.tokens_padded,
            "final_reward_accuracy": rows[-1]["reward_accuracy"]}


def run_trl(data: str, steps: int, precompute: bool) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from workbench.formats import read_preferences, to_trl_preference
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model

    folder = str(model_folder(resolve_chat_model("default")))
    tok = AutoTokenizer.from_pretrained(folder)
    ds = Dataset.from_list([to_trl_preference(p) for p in read_preferences(data)])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    counts = {"real": 0}

    def hook(mod, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None and mod.training:
            counts["real"] += int(mask.sum())

    model.register_forward_pre_hook(hook, with_kwargs=True)
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.r0 = time.perf_counter(), counts["real"]

        def on_step_end(self, args, state, control, **kw):
            times.append((time.perf_counter() - self.t0, counts["real"] - self.r0))

    args = DPOConfig(output_dir=f"/tmp/trl-dpo-bench-{os.getpid()}", max_steps=steps,
                     per_device_train_batch_size=BATCH, learning_rate=2e-4, beta=BETA,
                     max_length=MAX_LEN, report_to="none", save_strategy="no",
                     logging_steps=1000, use_cpu=True, bf16=False, dataloader_num_workers=0,
                     precompute_ref_log_probs=precompute, seed=0)
    t0 = time.perf_counter()
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"],
                                                lora_dropout=LORA["dropout"],
                                                target_modules=LORA["targets"],
                                                task_type="CAUSAL_LM"),
                         callbacks=[Timer()])
    setup_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    trainer.train()
    timed = times[1:]
    secs = sum(t for t, _ in timed)
    return {"pairs_per_s": BATCH * len(timed) / secs,
            "tokens_per_s": sum(n for _, n in timed) / secs if counts["real"] else None,
            "step_s": secs / len(timed), "setup_s": setup_s,
            "train_s": time.perf_counter() - t1}


CONFIGS = {
    "ours": lambda d, s, c: run_ours(d, s, c),
    "ours_second_epoch": lambda d, s, c: run_ours(d, s, c),  # same cache: no reference pass
    "trl_default": lambda d, s, c: run_trl(d, s, False),
    "trl_precompute": lambda d, s, c: run_trl(d, s, True),
}


def child(name: str, data: str, steps: int, cache: str) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")
    res = CONFIGS[name](data, steps, cache)
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print("RESULT " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description="DPO throughput, ours vs TRL's DPOTrainer")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/dpo.json")
    ap.add_argument("--only", nargs="*", default=list(CONFIGS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.data, a.steps, a.cache)
    data = Path("/tmp/wb-dpo-bench-pairs.jsonl")
    make_pairs(data)
    cache = Path(f"/tmp/wb-dpo-bench-ref-{os.getpid()}.jsonl")
    cache.unlink(missing_ok=True)
    results = {}
    for name in a.only:
        p = subprocess.run([sys.executable, __file__, "--child", name, "--data", str(data),
                            "--steps", str(a.steps), "--cache", str(cache)],
                           capture_output=True, text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not line:
            results[name] = {"error": p.stderr[-800:]}
            print(name, "FAILED", p.stderr[-800:], flush=True)
            continue
        results[name] = json.loads(line[0][7:])
        print(name, json.dumps(results[name]), flush=True)
    o = results.get("ours", {})
    for ref in ("trl_default", "trl_precompute"):
        if o.get("pairs_per_s") and results.get(ref, {}).get("pairs_per_s"):
            results[f"ours_over_{ref}"] = o["pairs_per_s"] / results[ref]["pairs_per_s"]
    if o.get("setup_s") and results.get("ours_second_epoch", {}).get("setup_s"):
        results["reference_cache_saves_s"] = o["setup_s"] - results["ours_second_epoch"][
            "setup_s"]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if not isinstance(v, dict)}))


if __name__ == "__main__":
    main()
