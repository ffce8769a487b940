"""Core figures: bundled model first load (GGUF conversion) vs cached load, greedy generation
tokens/s at batch 1 and 8, and `workbench --help` wall time.

    python benchmarks/core_models.py            # prints a markdown table
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPTS = ["Explain what a transmission line is.", "What is VSWR?", "Define noise figure.",
           "What does a mixer do?", "Why use a 50 ohm impedance?", "What is a Smith chart?",
           "What is phase noise?", "What limits power amplifier efficiency?"]


def timed_load(home: str) -> float:
    code = ("import time, os; t=time.perf_counter(); from workbench.models import load_model; "
            "m=load_model('default'); print(time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, WB_HOME=home, TQDM_DISABLE="1"), check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as home:
        first = timed_load(home)
        cached = statistics.median(timed_load(home) for _ in range(3))
    rows.append(("bundled SmolLM2 load, first (GGUF -> safetensors)", f"{first:.1f} s"))
    rows.append(("bundled SmolLM2 load, cached (median of 3, incl. imports)",
                 f"{cached:.1f} s ({cached / first:.2f} of first)"))

    from workbench.models import GenerationParams, load_model

    m = load_model("default", batch_size=8)
    p = GenerationParams(max_tokens=64)
    convs = [[{"role": "user", "content": q}] for q in PROMPTS]
    m.generate(convs[:1], GenerationParams(max_tokens=4))  # warm-up
    for bs in (1, 8):
        t0 = time.perf_counter()
        if bs == 1:
            gens = [m.generate([c], p)[0] for c in convs[:4]]
        else:
            gens = m.generate(convs, p)
        dt = time.perf_counter() - t0
        toks = sum(g.completion_tokens for g in gens)
        rows.append((f"greedy generation, batch {bs} ({len(gens)} prompts, 64 max new tokens)",
                     f"{toks / dt:.1f} tokens/s"))
    helps = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "workbench", "--help"], capture_output=True,
                       check=True)
        helps.append(time.perf_counter() - t0)
    rows.append(("`workbench --help` (median of 5)", f"{statistics.median(helps):.2f} s"))
    print("| What | Figure |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
