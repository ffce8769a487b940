"""MiniLM on ONNX Runtime: what the session's memory settings cost and keep, side by side.

    python benchmarks/embed_memory.py [--n 512] [--reps 3]
        [--out benchmarks/results/embed_memory.json]

Each variant runs in its own process (peak RSS is per process): `onnxruntime defaults`
(memory pattern on, the arena kept for the session's life) and `ours` (the workbench's
settings: no memory pattern; after a call of several batches the arena is given back).
Passages: the RF corpus sections (cut to 1,500 characters) repeated up to n/2, plus n/2
generated ~60-word passages. Reports passages/s (median of --reps calls, each of all n
passages), one-query latency (median of 100), peak RSS and RSS after the calls.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, resource, statistics, sys, time
variant, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
from workbench.corpus import load_sections
from workbench.models import embed as E
from workbench.rag.synthetic import make_passages

if variant == "onnxruntime defaults":
    import torch

    E._release_arena = lambda: None

    def session(ort, path):  # E._session's threads, onnxruntime's memory defaults
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, torch.get_num_threads())
        opts.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    E._session = session
secs = [s.text[:1500] for s in load_sections("datasets/rf")[0]]
texts = (secs * (n // len(secs) + 1))[:n // 2] + make_passages(n - n // 2, seed=0)
e = E.load_embedder("minilm", backend="onnx")
e.embed(texts[:64])
rates = []
for _ in range(reps):
    t = time.perf_counter()
    e.embed(texts)
    rates.append(len(texts) / (time.perf_counter() - t))
lat = []
for q in range(100):
    t = time.perf_counter()
    e.embed([f"what is the noise figure of stage {q}"])
    lat.append(time.perf_counter() - t)
print(json.dumps({"variant": variant, "passages_per_s": statistics.median(rates),
                  "rates": rates, "query_ms": 1000 * statistics.median(lat),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
                  "rss_after_mb": int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/embed_memory.json")
    a = ap.parse_args()
    rows = []
    for variant in ("onnxruntime defaults", "ours"):
        res = subprocess.run([sys.executable, "-c", CHILD, variant, str(a.n), str(a.reps)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print("| variant | passages/s | one query | peak RSS | RSS after |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['passages_per_s']:.1f} | {r['query_ms']:.2f} ms | "
              f"{r['peak_rss_mb']:,.0f} MB | {r['rss_after_mb']:,.0f} MB |")
    base, ours = rows
    print(f"ratio ours/defaults: passages/s {ours['passages_per_s'] / base['passages_per_s']:.2f}"
          f", peak RSS {ours['peak_rss_mb'] / base['peak_rss_mb']:.2f}, RSS after "
          f"{ours['rss_after_mb'] / base['rss_after_mb']:.2f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"n": a.n, "reps": a.reps, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
