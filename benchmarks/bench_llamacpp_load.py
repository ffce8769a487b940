"""llama.cpp generation on a machine that something else is using (issue 42, follow-up).

    python benchmarks/bench_llamacpp_load.py --json benchmarks/results/llamacpp_load.json

The bundled model, loaded as the workbench loads it (`load_model("default", ...)`: the
llama.cpp backend on the f16 copy of the GGUF), generates a batch of 8 prompts x 64 new
tokens, greedy, under each thread setting and each load:

- settings (`--settings`; SETTINGS has more): `default` (the workbench's own choices: the
  engine it picks, all cores, OpenMP threads that sleep when they wait, which `import
  workbench` sets: `workbench.openmp`), `t2-spin` (the default before: 2 threads, libgomp's
  spin-waiting, GOMP_SPINCOUNT=300000), `t2-spin-poll0` (the same with llama.cpp's polling
  level 0: the wheel's ggml is built with OpenMP, whose barriers wait by OpenMP's policy,
  whatever `poll` says), `t1` (one thread: the workaround that was found), and the
  transformers engine on the same model, `tf-default` and `tf-spin` (torch's threads are an
  OpenMP team too);
- loads: 0, 1 or 2 CPU hogs (`python -c "while True: pass"`) started just before the
  measured batch and stopped after it (`--hogs`).

Each measurement runs in a child process of its own (an engine's OpenMP settings are read
once, when it is loaded); the child loads the model and warms it up before the hogs start,
then times one batch: all completion tokens / wall seconds, and the child's CPU seconds in
that time. A batch is cut at `--limit` seconds (the tokens made so far are counted), so a
collapse costs a minute, not hours. Rounds are interleaved (every setting and load once,
then again), and the 1-minute load average before each measurement is printed beside it:
the machine is shared with other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation_engines import PROMPTS  # noqa: E402  the same 8 RF prompts
SPIN = {"GOMP_SPINCOUNT": "300000"}  # libgomp's own default: its threads spin-wait this long
# name -> (backend, its options, environment for the child: OMP_WAIT_POLICY and
# GOMP_SPINCOUNT are taken out of it first, so "default" gets what `import workbench` sets)
SETTINGS: dict[str, tuple[str | None, dict, dict]] = {
    "default": (None, {}, {}),  # the workbench's own choices, whatever they are now
    "t2-spin": ("llamacpp", {"threads": 2}, SPIN),  # the default before: libgomp spinning
    "t2-spin-poll0": ("llamacpp", {"threads": 2, "poll": 0}, SPIN),
    "t1": ("llamacpp", {"threads": 1}, SPIN),  # the workaround that was found
    "t2-passive": ("llamacpp", {"threads": 2}, {"OMP_WAIT_POLICY": "passive"}),
    "t2-spin1k": ("llamacpp", {"threads": 2}, {"GOMP_SPINCOUNT": "1000"}),
    "t2-spin10k": ("llamacpp", {"threads": 2}, {"GOMP_SPINCOUNT": "10000"}),
    "t2-spin100k": ("llamacpp", {"threads": 2}, {"GOMP_SPINCOUNT": "100000"}),
    "tf-spin": ("transformers", {"threads": 2}, SPIN),
    "tf-default": ("transformers", {}, {}),
}
HOG = "while True: pass"


def child(setting: str, new_tokens: int, limit: float) -> None:
    """Load, warm up, say "ready", wait for "go", time one batch, print one JSON line."""
    from workbench import openmp
    from workbench.models import load_model
    from workbench.models.base import GenerationParams, cancel_on

    backend, options, _ = SETTINGS[setting]
    t0 = time.perf_counter()
    model = load_model("default", backend=backend, **options)
    load_s = time.perf_counter() - t0
    convs = [[{"role": "user", "content": p}] for p in PROMPTS]
    model.generate(convs, GenerationParams(max_tokens=8))  # warm-up
    print("ready", flush=True)
    sys.stdin.readline()
    stop = threading.Event()
    timer = threading.Timer(limit, stop.set)
    c0, t0 = os.times(), time.perf_counter()
    timer.start()
    with cancel_on(stop):
        gens = model.generate(convs, GenerationParams(max_tokens=new_tokens))
    seconds = time.perf_counter() - t0
    c1 = os.times()
    timer.cancel()
    info = model.info().details
    model.close()
    tokens = sum(g.completion_tokens for g in gens)
    print(json.dumps({
        "setting": setting, "tokens": tokens, "seconds": round(seconds, 3),
        "tok_s": round(tokens / seconds, 2), "cut": stop.is_set(),
        "cpu_s": round((c1.user - c0.user) + (c1.system - c0.system), 2),
        "errors": sum(not g.ok for g in gens), "load_s": round(load_s, 2),
        "engine": {k: info.get(k) for k in ("engine", "threads", "poll", "device")},
        "openmp": openmp.state()}),
        flush=True)


def measure(setting: str, hogs: int, args) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({k: v for k, v in SETTINGS[setting][2].items() if v})
    cmd = [sys.executable, __file__, "--child", setting, "--new-tokens", str(args.new_tokens),
           "--limit", str(args.limit)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    started: list[subprocess.Popen] = []
    try:
        for line in proc.stdout:
            if line.strip() == "ready":
                break
        else:
            raise SystemExit(f"{setting}: the child exited before it was ready")
        load = os.getloadavg()[0]
        started = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        time.sleep(0.5 if hogs else 0)  # the hogs running before the batch starts
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out = proc.stdout.readline()
        proc.wait(timeout=120)
    finally:
        for h in started:
            h.kill()
            h.wait()
        if proc.poll() is None:
            proc.kill()
    row = json.loads(out)
    row.update(hogs=hogs, load1=round(load, 2))
    return row


def table(rows: list[dict], settings: list[str], hogs: list[int]) -> str:
    def cell(s: str, h: int) -> list[float]:
        return [r["tok_s"] for r in rows if r["setting"] == s and r["hogs"] == h]

    base = settings[0]
    head = "| setting | " + " | ".join(f"{h} hog{'s' if h != 1 else ''}: tok/s" for h in hogs)
    head += "".join(f" | {h} vs {hogs[0]} hogs" for h in hogs[1:])
    head += f" | vs {base}, " + ", ".join(f"{h} hog{'s' if h != 1 else ''}" for h in hogs)
    lines = [head + " |", "|" + "---|" * (head.count("|"))]
    for s in settings:
        med = {h: statistics.median(cell(s, h)) for h in hogs if cell(s, h)}
        vals = [" / ".join(f"{v:.1f}" for v in cell(s, h)) or "-" for h in hogs]
        ratios = [f"{med[h] / med[hogs[0]]:.2f}" if h in med and med.get(hogs[0]) else "-"
                  for h in hogs[1:]]
        bm = {h: statistics.median(cell(base, h)) for h in hogs if cell(base, h)}
        vs = ", ".join(f"{med[h] / bm[h]:.2f}" if h in med and bm.get(h) else "-"
                       for h in hogs)
        lines.append(f"| {s} | " + " | ".join(vals) + "".join(f" | {r}" for r in ratios)
                     + f" | {vs} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default="default,t2-spin,t2-spin-poll0,t1,tf-default,tf-spin",
                    help=f"comma-separated, of: {', '.join(SETTINGS)}")
    ap.add_argument("--hogs", default="0,1,2", help="numbers of CPU hogs, comma-separated")
    ap.add_argument("--reps", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=float, default=40.0,
                    help="seconds after which a batch is cut (its tokens so far counted)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.new_tokens, args.limit)
        return
    settings = args.settings.split(",")
    hogs = [int(h) for h in args.hogs.split(",")]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    uptime = subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()
    print(f"cores: {os.cpu_count()}; start: {uptime}", flush=True)
    rows = []
    for rep in range(args.reps):
        for h in hogs:
            order = settings if (rep + h) % 2 == 0 else settings[::-1]
            for s in order:
                row = measure(s, h, args)
                row["rep"] = rep
                rows.append(row)
                print(f"round {rep} hogs {h} {s:>16}: {row['tokens']:4d} tokens in "
                      f"{row['seconds']:6.1f} s = {row['tok_s']:7.2f} tok/s, cpu "
                      f"{row['cpu_s']:6.1f} s{' (cut)' if row['cut'] else ''}; "
                      f"load {row['load1']}", flush=True)
    end = subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()
    print(f"end: {end}\n")
    print(f"{len(PROMPTS)} prompts x {args.new_tokens} new tokens, greedy; tok/s per round; "
          f"ratios of medians\n")
    print(table(rows, settings, hogs))
    if args.json:
        args.json.write_text(json.dumps({"start": uptime, "end": end, "cores": os.cpu_count(),
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
