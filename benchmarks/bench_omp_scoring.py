"""What OpenMP's passive waiting (issue 42: `import workbench` sets OMP_WAIT_POLICY=passive)
costs or buys torch's scoring on an idle machine: the main job's log-likelihood scoring of
statement items with the bundled model, under OMP_WAIT_POLICY=passive and =active, and
`spinN` (GOMP_SPINCOUNT=N: a waiting thread spins N times, then sleeps).

    python benchmarks/bench_omp_scoring.py [--items 40] [--rounds 2]
        [--policies passive,active,spin1000] [--json benchmarks/results/omp_scoring.json]

The items are the main job's (issue 43): "Which statement about <section> is correct?" over
a sentence of the RF corpus and three perturbed copies, made by a distillation of
`datasets/rf` with a scripted teacher (no model call; statement items need none). Each
measurement is a child process of its own (OpenMP reads its policy once, when the library
is loaded) that loads the bundled model (transformers, fp32; no call cache), then times the
scoring of the items without context twice: the letter and cloze formulations together (the
main job's unseen benchmark under none), and cloze alone (its other benchmarks and
conditions). Rounds are interleaved; the 1-minute load average before each is printed: run
it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(items_file: str) -> None:
    import workbench  # noqa: F401  (sets the policy unless the environment chose one)
    from workbench.evaluate.benchmark import load_benchmark
    from workbench.evaluate.config import EvalConfig
    from workbench.evaluate.run import evaluate_conditions
    from workbench.models.backends import load_model

    items = load_benchmark(items_file)
    model = load_model("default")
    spin = os.environ.get("GOMP_SPINCOUNT")
    out = {"policy": f"spin{spin}" if spin else os.environ.get("OMP_WAIT_POLICY")}
    for name, letter in (("letter+cloze", ["none"]), ("cloze", [])):
        ec = EvalConfig(conditions=["none"], methods=["loglik"], letter_conditions=letter,
                        hit_vs_miss=False)
        t0 = time.perf_counter()
        evaluate_conditions(model, items, ec, model_name="x", log=lambda *a: None)
        out[name] = round(time.perf_counter() - t0, 2)
    print(json.dumps(out))


def statement_items(folder: Path, n: int) -> Path:
    from workbench.distill.config import AgentModel, DistillConfig
    from workbench.distill.pipeline import run_distill
    from workbench.io import write_jsonl
    from workbench.records import MCItem, read_records

    run_distill(DistillConfig(corpus=str(REPO / "datasets" / "rf"), domain="rf",
                              mode="composed", answer_source="text", perspectives=["concepts"],
                              kinds=["mc"], verifier={"enabled": False},
                              benchmark_fraction=0.5, distractors="perturbed",
                              benchmark_items="statement"),
                folder / "distilled", seed=0,
                default_model=AgentModel(spec="fake", options={"script": "fake_teacher:reply"}))
    items = read_records(folder / "distilled" / "benchmark.jsonl", MCItem)[:n]
    write_jsonl(folder / "items.jsonl", items)
    return folder / "items.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policies", default="passive,active",
                    help="passive, active, spinN (GOMP_SPINCOUNT=N), comma-separated")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    sys.path.insert(0, str(REPO / "tests"))  # the scripted teacher
    with tempfile.TemporaryDirectory() as tmp:
        items = statement_items(Path(tmp), a.items)
        rows = []
        policies = a.policies.split(",")
        for r in range(a.rounds):
            for policy in policies:
                load = os.getloadavg()[0]
                env = {k: v for k, v in os.environ.items()
                       if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | {"TQDM_DISABLE": "1"}
                env |= {"GOMP_SPINCOUNT": policy[4:]} if policy.startswith("spin") else \
                    {"OMP_WAIT_POLICY": policy}
                p = subprocess.run([sys.executable, __file__, "--child", str(items)], env=env,
                                   capture_output=True, text=True, check=True)
                row = json.loads(p.stdout.strip().splitlines()[-1]) | {"round": r + 1,
                                                                       "load": load}
                rows.append(row)
                print(json.dumps(row), flush=True)
    med = {f"{policy} {k}": statistics.median(x[k] for x in rows if x["policy"] == policy)
           for policy in policies for k in ("letter+cloze", "cloze")}
    for k in ("letter+cloze", "cloze"):
        base = med[f"{policies[0]} {k}"]
        print(f"{k}: " + ", ".join(f"{p} {med[f'{p} {k}']:.1f} s ({med[f'{p} {k}'] / base:.2f}x)"
                                   for p in policies)
              + f" ({a.items} items, medians of {a.rounds}; x: time against {policies[0]})")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"items": a.items, "rows": rows, "medians": med},
                                     indent=1))


if __name__ == "__main__":
    main()
