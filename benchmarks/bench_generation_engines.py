"""Generation engines for the bundled model, side by side in one run (issue 42).

    python benchmarks/bench_generation_engines.py --llama-server PATH/llama-server \
        --json benchmarks/results/generation_engines.json

Three OpenAI-compatible servers on 127.0.0.1 run the bundled SmolLM2-135M-Instruct, all up
at once and measured in interleaved rounds so that the machine's load falls on each alike
(both llama.cpp servers decode the same file: the f16 copy of the Q4_1 GGUF that the
backend makes once, see `LlamaCppOptions.weights`):

- `workbench serve --backend transformers` (the default before issue 42: fp32 weights
  dequantised from the GGUF, the transformers generation loop);
- `workbench serve` (now the default: the workbench's llama.cpp backend, llama.cpp's server
  from the xllamacpp wheel inside the process, prompts rendered and tokenised by the
  workbench);
- llama.cpp's own `llama-server` binary on the same file (`--llama-server`, the reference;
  repeatable: a build with native CPU flags, and one with the wheel's flags, AVX2, to tell the
  backend's own overhead from the build's), 8 slots, a KV cache per slot, 2 threads.

Each round: single stream (5 prompts one after another, greedy, up to 128 new tokens;
completion tokens / wall seconds), time to the first streamed token (median of 5), and 8
concurrent requests (8 prompts at once; all completion tokens / wall seconds). The load
average before and after each round is printed beside it.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Explain what VSWR measures in an RF system.",
           "How does a quarter-wave transformer match two impedances?",
           "What limits the noise figure of a low-noise amplifier?",
           "Describe how a double-balanced mixer suppresses its local oscillator.",
           "Why do microstrip lines radiate at discontinuities?",
           "What does the Smith chart show about a load?",
           "How is the Q factor of a resonator measured?",
           "What sets the bandwidth of a Wilkinson power divider?"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import httpx

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited ({proc.returncode})")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url}: not up in {timeout} s")


MODEL: dict[str, str] = {}  # url -> the model name the server lists


def chat(url: str, prompt: str, *, stream: bool = False) -> tuple[int, float, float]:
    """(completion tokens, seconds, seconds to the first streamed content)."""
    import httpx

    if url not in MODEL:
        MODEL[url] = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": MODEL[url], "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 128, "temperature": 0.0, "stream": stream}
    t0 = time.perf_counter()
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"], time.perf_counter() - t0, 0.0
    first = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0].get("delta") or {}
                if delta.get("content"):
                    first = time.perf_counter() - t0
    return 0, time.perf_counter() - t0, first or 0.0


def measure(url: str) -> dict:
    tokens = seconds = 0.0
    for p in PROMPTS[:5]:
        n, s, _ = chat(url, p)
        tokens, seconds = tokens + n, seconds + s
    ttft = statistics.median(chat(url, p, stream=True)[2] for p in PROMPTS[:5])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(lambda p: chat(url, p), PROMPTS))
    wall = time.perf_counter() - t0
    return {"single_tok_s": tokens / seconds, "single_tokens": tokens,
            "concurrent8_tok_s": sum(r[0] for r in rows) / wall,
            "concurrent8_tokens": sum(r[0] for r in rows), "ttft_s": ttft}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", action="append", default=[], metavar="[LABEL=]PATH",
                    help="llama.cpp's llama-server binary, a reference (repeat for several "
                         "builds, e.g. native=build-native/bin/llama-server "
                         "avx2=build-avx2/bin/llama-server)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from workbench.models.llamacpp import _weights_file
    from workbench.models.resolve import resolve_chat_model

    src = resolve_chat_model("default")
    # the file the llama.cpp backend decodes (the f16 copy of the Q4_1 file, made once)
    gguf = _weights_file(src, src.path / src.gguf_file, "auto")
    env = {**os.environ, "TQDM_DISABLE": "1"}
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    logs = tempfile.TemporaryDirectory()
    cmds = {"workbench serve (transformers)": [sys.executable, "-m", "workbench", "serve",
                                               "--backend", "transformers"],
            "workbench serve (llama.cpp backend)": [sys.executable, "-m", "workbench",
                                                    "serve"]}
    for i, ref in enumerate(a.llama_server):
        label, _, path = ref.rpartition("=")
        label = label or ("native" if len(a.llama_server) == 1 else f"build {i + 1}")
        cmds[f"llama.cpp llama-server ({label} build)"] = [
            path, "-m", str(gguf), "-np", "8", "--no-kv-unified", "-c",
            str(8 * 4096), "-t", "2", "-cram", "0", "--no-webui", "--host", "127.0.0.1"]
    try:
        for name, cmd in cmds.items():
            port = free_port()
            cmd = cmd + ["--port", str(port)]
            log = open(Path(logs.name) / f"{len(procs)}.log", "w")  # noqa: SIM115
            procs[name] = (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                            stderr=subprocess.STDOUT),
                           f"http://127.0.0.1:{port}")
        for name, (proc, url) in procs.items():
            wait(url, proc)
            chat(url, "Hello")  # warm-up
        rows = []
        for rnd in range(a.rounds):
            for name, (_, url) in procs.items():
                load0 = os.getloadavg()[0]
                row = {"round": rnd + 1, "engine": name, **measure(url),
                       "load_before": load0, "load_after": os.getloadavg()[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        logs.cleanup()
    names = list(procs)
    print("\n| engine | single stream tok/s | 8 concurrent tok/s | time to first token s |"
          " load (1 min) |")
    print("|---|---|---|---|---|")
    def rng(rs: list[dict], k: str, f: str = "{:.1f}") -> str:
        return "-".join(f.format(v) for v in sorted({min(r[k] for r in rs),
                                                      max(r[k] for r in rs)}))

    for name in names:
        rs = [r for r in rows if r["engine"] == name]
        loads = [r["load_before"] for r in rs] + [r["load_after"] for r in rs]
        print(f"| {name} | {rng(rs, 'single_tok_s')} | {rng(rs, 'concurrent8_tok_s')} | "
              f"{rng(rs, 'ttft_s', '{:.2f}')} | {min(loads):.1f}-{max(loads):.1f} |")
    med = {n: {k: statistics.median(r[k] for r in rows if r["engine"] == n)
               for k in ("single_tok_s", "concurrent8_tok_s")} for n in names}
    base, ours = names[0], names[1]
    ratios = {"single_vs_transformers": med[ours]["single_tok_s"] / med[base]["single_tok_s"],
              "concurrent8_vs_transformers": med[ours]["concurrent8_tok_s"]
              / med[base]["concurrent8_tok_s"]}
    for ref in names[2:]:
        label = ref.split("(")[1].split(" build")[0]
        ratios[f"single_vs_llama_server_{label}"] = (med[ours]["single_tok_s"]
                                                     / med[ref]["single_tok_s"])
        ratios[f"concurrent8_vs_llama_server_{label}"] = (med[ours]["concurrent8_tok_s"]
                                                          / med[ref]["concurrent8_tok_s"])
    print("\nratios (medians): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
