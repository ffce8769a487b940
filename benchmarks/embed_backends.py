"""MiniLM embeddings: ONNX Runtime vs sentence-transformers (PyTorch), side by side in one run.

    python benchmarks/embed_backends.py [--n 512] [--reps 3] [--out benchmarks/results/embed_backends.json]

Passages: the RF corpus sections (cut to 1,500 characters) repeated up to --n, plus generated
~60-word passages; the same texts and batch size for both, alternating runs. Reports
passages/s (median of --reps), the ratio, the largest per-component difference and the
share of 100 queries whose ordered top-10 neighbours are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from workbench.corpus import load_sections
from workbench.models.embed import load_embedder
from workbench.rag.synthetic import make_passages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results/embed_backends.json")
    args = ap.parse_args()

    sections, _ = load_sections("datasets/rf")
    real = [s.text[:1500] for s in sections]
    texts = (real * (args.n // len(real) + 1))[: args.n // 2]
    texts += make_passages(args.n - len(texts), seed=0)
    onnx = load_embedder("minilm", backend="onnx", batch_size=args.batch)
    torch_ = load_embedder("minilm", backend="torch", batch_size=args.batch)
    onnx.embed(texts[:8]), torch_.embed(texts[:8])  # warm-up
    times: dict[str, list[float]] = {"onnx": [], "torch": []}
    vecs = {}
    for _ in range(args.reps):
        for name, emb in (("torch", torch_), ("onnx", onnx)):
            t0 = time.perf_counter()
            vecs[name] = emb.embed(texts, show_progress=False)
            times[name].append(time.perf_counter() - t0)
    rate = {k: len(texts) / statistics.median(v) for k, v in times.items()}
    q = slice(0, 100)
    top = {k: np.argsort(-(v[q] @ v.T), axis=1, kind="stable")[:, :10] for k, v in vecs.items()}
    same = float(np.mean([list(a) == list(b) for a, b in zip(top["onnx"], top["torch"],
                                                            strict=True)]))
    result = {"passages": len(texts), "batch": args.batch, "reps": args.reps,
              "passages_per_s": rate, "ratio_onnx_over_torch": rate["onnx"] / rate["torch"],
              "max_abs_diff": float(np.abs(vecs["onnx"] - vecs["torch"]).max()),
              "same_ordered_top10": same, "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "load_avg": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"| passages | batch | PyTorch passages/s | ONNX passages/s | ratio | max abs diff |"
          f" same ordered top-10 |\n|---|---|---|---|---|---|---|\n| {len(texts)} | "
          f"{args.batch} | {rate['torch']:.1f} | {rate['onnx']:.1f} | "
          f"**{result['ratio_onnx_over_torch']:.2f}x** | {result['max_abs_diff']:.1e} | "
          f"{same:.0%} |")


if __name__ == "__main__":
    main()
