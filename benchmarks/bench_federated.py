"""Federated round latency, bytes per round, and where the time goes: the same rounds in
process (InProcessGrid, no sockets) and on a real loopback deployment (SuperLink + one
SuperNode per site), side by side.

    python benchmarks/bench_federated.py --rounds 3 --model default
    python benchmarks/bench_federated.py --rounds 3 --model /path/to/tiny-model

"Site compute" is what the sites report for their own work (model load, eval, training steps):
the sum in process (sites run one after another), the slowest site in a deployment (they run
in parallel). The rest of a round's wall time is overhead: in a deployment Flower's polling
(the SuperNode asks every few seconds, the server's send-and-receive sleeps between pulls),
the cold start of a client-app process per message and (de)serialisation. Writes a Markdown table to stdout and the
raw numbers to --out/bench.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]


def summarise(rows: list[dict], *, parallel: bool) -> dict:
    """Round wall time against the sites' own compute: the slowest site's when the sites run
    in parallel (deployment), the sum when they run one after another (in process)."""
    train = [r for r in rows if r["kind"] == "train"]
    wall = [r["seconds"] for r in train]
    per_site = [[m.get("seconds", 0.0) for m in r["sites"].values()] for r in train]
    compute = [max(s) if parallel else sum(s) for s in per_site]
    return {"rounds": len(train), "round_s": sum(wall) / len(wall),
            "site_compute_s": sum(compute) / len(compute),
            "transport_share": 1 - sum(compute) / sum(wall),
            "mb_down": train[0]["bytes_down"] / 1e6, "mb_up": train[0]["bytes_up"] / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--model", default="default")
    ap.add_argument("--port", type=int, default=9390)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_federated")
    a = ap.parse_args()

    from workbench.federated.api import run_federated
    from workbench.federated.config import FederatedConfig
    from workbench.federated.deploy import Deployment
    from workbench.federated.sites import site_folders, split_sites
    from workbench.progress import quiet_libraries

    quiet_libraries()
    shutil.rmtree(a.out, ignore_errors=True)
    split_sites(ROOT / "datasets" / "rf_distilled", a.out / "sites", sites=a.sites)
    sites = site_folders(a.out / "sites")
    cfg = FederatedConfig.model_validate({
        "model": a.model, "rounds": a.rounds, "mc_eval": False,
        "local": {"steps": a.steps, "batch_size": 2, "max_length": 512},
        "guards": {"min_nodes": a.sites, "round_timeout_s": 600}})
    results = {}

    t0 = time.perf_counter()
    run_federated(cfg, sites, a.out / "inprocess", log=lambda m: None)
    results["in process"] = {**summarise(rows_of(a.out / "inprocess"), parallel=False),
                             "total_s": time.perf_counter() - t0}

    d = Deployment(a.out / "dep", port=a.port, insecure=True)
    (a.out / "cfg.json").write_text(cfg.model_dump_json())
    try:
        t0 = time.perf_counter()
        d.up(sites, wait_s=120)
        up_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_id = d.submit(a.out / "cfg.json", a.out / "deployed")
        st = d.wait_run(run_id, 3600)
        total = time.perf_counter() - t0
    finally:
        d.down()
    if st.get("status") != "finished:completed":
        raise SystemExit(f"deployment run ended {st}")
    results["deployment"] = {**summarise(rows_of(a.out / "deployed"), parallel=True),
                             "total_s": total,
                             "up_s": up_s}
    (a.out / "bench.json").write_text(json.dumps(results, indent=1))

    print(f"model `{a.model}`, {a.sites} sites x {a.rounds} rounds x {a.steps} steps\n")
    print("| path | round wall s | sites' compute s (in process: sum; deployment: slowest) | "
          "everything else | MB down per round | MB up per round | run total s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['round_s']:.1f} | {r['site_compute_s']:.1f} | "
              f"{100 * r['transport_share']:.0f}% | {r['mb_down']:.2f} | {r['mb_up']:.2f} | "
              f"{r['total_s']:.0f} |")
    ratio = results["deployment"]["round_s"] / results["in process"]["round_s"]
    print(f"\ndeployment / in process round latency: {ratio:.2f}x; deployment up in "
          f"{results['deployment']['up_s']:.0f} s")


if __name__ == "__main__":
    main()
