"""How fast each generation engine reads prompts (issue 42), in process.

    python benchmarks/bench_prompt_reading.py [--backends transformers,llamacpp,llamacpp-file]

16 prompts of ~260 tokens cut from the RF corpus, one new token each, so the time is the
prompt pass: prompt tokens over wall seconds, two repetitions per engine (each engine in its
own process, one after the other). Decoding speed is `bench_generation_engines.py`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGINES = {"transformers": {"backend": "transformers"}, "llamacpp": {"backend": "llamacpp"},
           "llamacpp-file": {"backend": "llamacpp", "weights": "file"}}


def child(name: str) -> None:
    from workbench.models import load_model
    from workbench.models.base import GenerationParams
    from workbench.progress import quiet_libraries

    quiet_libraries()
    words = " ".join(p.read_text() for p in sorted((REPO / "datasets" / "rf").glob("*.md"))
                     ).split()
    convs = [[{"role": "user", "content": " ".join(words[i * 150:(i + 1) * 150])
               + "\nWrite one question."}] for i in range(16)]
    model = load_model("default", **ENGINES[name])
    one = GenerationParams(max_tokens=1)
    model.generate(convs[:1], one)  # warm-up
    rows = []
    for rep in range(2):
        t0 = time.perf_counter()
        gens = model.generate(convs, one)
        dt = time.perf_counter() - t0
        n = sum(g.prompt_tokens for g in gens)
        rows.append({"engine": name, "rep": rep + 1, "prompt_tokens": n,
                     "seconds": round(dt, 2), "prompt_tok_s": round(n / dt, 1)})
    model.close()
    print("RESULT " + json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="transformers,llamacpp,llamacpp-file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    rows = []
    for name in a.backends.split(","):
        p = subprocess.run([sys.executable, __file__, "--child", name], cwd=REPO,
                           capture_output=True, text=True, check=False)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not line:
            raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-2000:]}")
        rows += json.loads(line[0][7:])
        print(json.dumps(rows[-2:]), flush=True)
    print("\n| engine | prompt tokens / s |\n|---|---|")
    for name in a.backends.split(","):
        v = sorted(r["prompt_tok_s"] for r in rows if r["engine"] == name)
        print(f"| {name} | {v[0]:.0f}-{v[-1]:.0f} |")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
