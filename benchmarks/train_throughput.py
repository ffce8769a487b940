"""Training throughput: our LoRA SFT recipe vs TRL's SFTTrainer, same model, LoRA config, data.

    pip install -e .[bench]      # trl
    python benchmarks/train_throughput.py [--steps 4] [--out benchmarks/results/train.json]

Each configuration runs in its own process (clean peak memory). Throughput counts useful
(non-padding) tokens per second over the steps after the first (warm-up). MFU uses ~4N FLOPs
per token for LoRA training (forward 2N, backward through activations 2N; the frozen weights
get no gradient) against this machine's measured fp32 matmul peak (MEASURED.md: 138 GFLOP/s
with 2 threads).
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

PEAK_FLOPS = 138e9
MAX_LEN = 512
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def make_data(path: Path, n: int = 160) -> None:
    """Chat examples cut from the RF corpus: varied lengths (~40-400 tokens), like QTSA."""
    import random

    from workbench.formats import write_dataset
    from workbench.corpus import ingest
    from workbench.records import ChatExample

    rng = random.Random(0)
    paras = [p for s in ingest(Path("datasets/rf")).sections for p in s.text.split("\n\n")]
    rows = []
    for i in range(n):
        p = paras[i % len(paras)]
        words = p.split()
        cut = rng.randint(15, min(len(words), 200))
        rows.append(ChatExample.model_validate({"id": f"b{i}", "messages": [
            {"role": "user", "content": "Explain: " + " ".join(words[:12]) + "?"},
            {"role": "assistant", "content": " ".join(words[:cut])}]}))
    write_dataset(path, rows)


def run_ours(data: str, steps: int, packing: bool, checkpointing: bool, batch: int) -> dict:
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model
    from workbench.train.config import TrainConfig
    from workbench.train.recipe import train

    rows = []
    cfg = TrainConfig(data=data, max_length=MAX_LEN, packing=packing, batch_size=batch,
                      max_steps=steps, eval_fraction=0.0, warmup_ratio=0.0,
                      gradient_checkpointing=checkpointing,
                      lora={"r": LORA["r"], "alpha": LORA["alpha"], "dropout": LORA["dropout"],
                            "target_modules": LORA["targets"]})
    model_folder(resolve_chat_model("default"))
    out = Path(f"/tmp/wb-bench-{os.getpid()}")
    train(cfg, model_spec="default", output=out, on_step=lambda s, r: rows.append(r),
          log=lambda m: None)
    timed = rows[1:]
    tokens = sum(r["tokens"] for r in timed)
    secs = sum(r["seconds"] for r in timed)
    man = json.loads((out / "manifest.json").read_text())["outputs"]
    return {"tokens_per_s": tokens / secs, "step_s": secs / len(timed),
            "padding_share": man["padding_share"]}


def run_trl(data: str, steps: int, packing: bool, batch: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from workbench.formats import read_dataset
    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model

    folder = str(model_folder(resolve_chat_model("default")))
    tok = AutoTokenizer.from_pretrained(folder)
    ex = read_dataset(data)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": e.messages[0].content}],
                             "completion": [{"role": "assistant",
                                             "content": e.messages[1].content}]} for e in ex])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    counts = {"real": 0, "total": 0}

    def hook(mod, args, kwargs):
        ids = kwargs.get("input_ids")
        mask = kwargs.get("attention_mask")
        if ids is not None and mod.training:
            counts["total"] += ids.numel()
            counts["real"] += int(mask.sum()) if mask is not None else ids.numel()

    model.register_forward_pre_hook(hook, with_kwargs=True)
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            self.r0 = counts["real"]

        def on_step_end(self, args, state, control, **kw):
            times.append((time.perf_counter() - self.t0, counts["real"] - self.r0))

    args = SFTConfig(output_dir=f"/tmp/trl-bench-{os.getpid()}", max_steps=steps,
                     per_device_train_batch_size=batch, learning_rate=2e-4, packing=packing,
                     max_length=MAX_LEN, report_to="none", save_strategy="no",
                     logging_steps=1000, use_cpu=True, bf16=False, dataloader_num_workers=0,
                     completion_only_loss=True, seed=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"],
                                                lora_dropout=LORA["dropout"],
                                                target_modules=LORA["targets"],
                                                task_type="CAUSAL_LM"),
                         callbacks=[Timer()])
    trainer.train()
    timed = times[1:]
    secs = sum(t for t, _ in timed)
    tokens = sum(n for _, n in timed)
    return {"tokens_per_s": tokens / secs, "step_s": secs / len(timed),
            "padding_share": 1 - counts["real"] / counts["total"] if counts["total"] else None}


CONFIGS = {
    "ours_packing": lambda d, s: run_ours(d, s, True, False, 4),
    "ours_packing_gradckpt": lambda d, s: run_ours(d, s, True, True, 4),
    "ours_padding": lambda d, s: run_ours(d, s, False, False, 8),
    "trl_default": lambda d, s: run_trl(d, s, False, 8),
    "trl_packing": lambda d, s: run_trl(d, s, True, 4),
}


def child(name: str, data: str, steps: int) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")
    res = CONFIGS[name](data, steps)
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print("RESULT " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description="LoRA SFT throughput, ours vs TRL")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results/train.json")
    ap.add_argument("--only", nargs="*", default=list(CONFIGS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.data, a.steps)
    data = Path("/tmp/wb-bench-data.jsonl")
    make_data(data)
    from transformers import AutoConfig

    from workbench.models.local import model_folder
    from workbench.models.resolve import resolve_chat_model

    n_params = 134.5e6  # SmolLM2-135M, embeddings tied
    AutoConfig.from_pretrained(model_folder(resolve_chat_model("default")))
    results = {}
    for name in a.only:
        p = subprocess.run([sys.executable, __file__, "--child", name, "--data", str(data),
                            "--steps", str(a.steps)], capture_output=True, text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not line:
            results[name] = {"error": p.stderr[-800:]}
            print(name, "FAILED", p.stderr[-800:], flush=True)
            continue
        r = json.loads(line[0][7:])
        r["mfu"] = r["tokens_per_s"] * 4 * n_params / PEAK_FLOPS
        results[name] = r
        print(name, json.dumps(r), flush=True)
    o = results.get("ours_packing", {}).get("tokens_per_s")
    for ref in ("trl_default", "trl_packing"):
        if o and results.get(ref, {}).get("tokens_per_s"):
            results[f"ours_over_{ref}"] = o / results[ref]["tokens_per_s"]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k.startswith("ours_over")}))


if __name__ == "__main__":
    main()
