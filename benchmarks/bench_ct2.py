"""CTranslate2 vs transformers on the bundled model, side by side in one run.

Generation: greedy tokens/s at each batch size over the same prompts, CTranslate2 (int8 by
default, one row per intra x inter thread layout) against transformers fp32. Scoring:
multiple-choice items/s and parity with transformers fp32 (same choice %, max |delta
log-likelihood|, accuracy of each) for each CTranslate2 quantization asked for.

    python benchmarks/bench_ct2.py                                  # the full run
    python benchmarks/bench_ct2.py --layouts 1x1,2x1,1x2 --items 500
    python benchmarks/bench_ct2.py --prompts 2 --batch-sizes 1,2 --max-tokens 8 --items 10

Prints a markdown table (and the command that made it); `--json FILE` also writes the
figures. Multiple-choice items: the RF benchmark items (datasets/rf_distilled) in both
formulations, chat and raw templates, options rotated, then generated short items
(capitals, sums), up to `--items`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Explain what a transmission line is.", "What is VSWR?", "Define noise figure.",
           "What does a mixer do?", "Why use a 50 ohm impedance?", "What is a Smith chart?",
           "What is phase noise?", "What limits power amplifier efficiency?"]
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Canada", "Ottawa"),
            ("Russia", "Moscow"), ("China", "Beijing"), ("Kenya", "Nairobi"),
            ("Greece", "Athens"), ("Norway", "Oslo"), ("Sweden", "Stockholm"),
            ("Poland", "Warsaw"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
            ("Austria", "Vienna"), ("Peru", "Lima"), ("Cuba", "Havana"), ("Chile", "Santiago"),
            ("Turkey", "Ankara"), ("Thailand", "Bangkok"), ("Argentina", "Buenos Aires"),
            ("Australia", "Canberra")]


# --- multiple-choice items ---------------------------------------------------------------------

def rf_items() -> list:
    from workbench.records import MCItem

    path = REPO / "datasets" / "rf_distilled" / "mcQTSA.jsonl"
    keep = ("id", "question", "options", "answer")
    return [MCItem.model_validate({k: v for k, v in json.loads(line).items() if k in keep})
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def generated_items(n: int) -> list:
    """Short deterministic items: capitals, then sums of two small numbers."""
    from workbench.records import LETTERS, MCItem

    rng = random.Random(0)
    out = []
    for i in range(n):
        if i < len(CAPITALS):
            country, city = CAPITALS[i]
            others = [c for _, c in CAPITALS if c != city]
            question = f"What is the capital of {country}?"
            gold, wrong = city, rng.sample(others, 3)
        else:
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            question = f"What is {a} plus {b}?"
            gold = str(a + b)
            wrong = [str(x) for x in rng.sample(
                [a + b + d for d in (-11, -10, -2, -1, 1, 2, 9, 10)], 3)]
        k = rng.randrange(4)
        options = wrong[:k] + [gold] + wrong[k:]
        out.append(MCItem(id=f"gen-{i}", question=question, options=options,
                          answer=LETTERS[k]))
    return out


def mc_requests(n: int, source: str = "mixed") -> list[tuple]:
    """(ScoreRequest, gold option index) for `n` items. `mixed`: RF items in ten variants
    (letter chat and raw with four rotations, cloze chat and raw), then generated items;
    `generated`: generated items only, letter (chat) and cloze (raw) alternately."""
    from workbench.evaluate.mc import cloze_request, letter_request, rotate
    from workbench.records import LETTERS

    variants = [("letter", "chat", 0), ("cloze", "chat", 0), ("letter", "raw", 0),
                ("cloze", "raw", 0)] + [("letter", t, k) for k in (1, 2, 3)
                                         for t in ("chat", "raw")]
    out: list[tuple] = []
    if source == "mixed":
        items = rf_items()
        for form, template, k in variants:
            for it in items:
                it = rotate(it, k)
                make = letter_request if form == "letter" else cloze_request
                out.append((make(it, template=template), LETTERS.index(it.answer)))
    gen = generated_items(max(0, n - len(out)))
    for i, it in enumerate(gen):
        req = letter_request(it) if i % 2 == 0 else cloze_request(it, template="raw")
        out.append((req, LETTERS.index(it.answer)))
    return out[:n]


def choices(scores) -> list[int]:
    return [max(range(len(row)), key=lambda i: row[i].logprob) for row in scores]


def parity(ref, got, gold: list[int]) -> dict:
    a, b = choices(ref), choices(got)
    n = len(gold)
    return {"items": n,
            "same_choice": sum(x == y for x, y in zip(a, b, strict=True)) / n,
            "max_abs_dloglik": max(abs(x.logprob - y.logprob) for r, g in zip(ref, got)
                                   for x, y in zip(r, g, strict=True)),
            "accuracy_ref": sum(x == g for x, g in zip(a, gold, strict=True)) / n,
            "accuracy": sum(x == g for x, g in zip(b, gold, strict=True)) / n}


# --- measurements ------------------------------------------------------------------------------

def gen_speed(model, convs, batch: int, max_tokens: int, repeat: int) -> float:
    from workbench.models import GenerationParams

    p = GenerationParams(max_tokens=max_tokens)
    model.generate(convs[:1], GenerationParams(max_tokens=4))  # warm-up
    rates = []
    for _ in range(repeat):
        t0, toks = time.perf_counter(), 0
        for i in range(0, len(convs), batch):
            toks += sum(g.completion_tokens for g in model.generate(convs[i:i + batch], p))
        rates.append(toks / (time.perf_counter() - t0))
    return statistics.median(rates)


def timed_score(model, reqs) -> tuple[list, float]:
    model.score([reqs[0]])  # warm-up
    t0 = time.perf_counter()
    out = model.score(reqs)
    return out, len(reqs) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts (from a fixed list of 8)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="median over this many runs")
    ap.add_argument("--quantization", default="int8", help="CTranslate2 for generation")
    ap.add_argument("--layouts", default="1x1",
                    help="CTranslate2 intra_threads x inter_threads, comma-separated")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch threads (default: torch's, one per core)")
    ap.add_argument("--items", type=int, default=500, help="multiple-choice items (0: none)")
    ap.add_argument("--mc-source", default="mixed", choices=("mixed", "generated"))
    ap.add_argument("--score-quantizations", default="float32,int8")
    ap.add_argument("--score-threads", type=int, default=1, help="CTranslate2 intra_threads "
                                                                 "when scoring")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from workbench.models import load_model
    from workbench.progress import quiet_libraries

    quiet_libraries()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    command = "python benchmarks/bench_ct2.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    convs = [[{"role": "user", "content": q}] for q in (PROMPTS * 8)[:args.prompts]]
    figures: dict = {"command": command, "cpu_count": os.cpu_count(),
                     "torch_threads": torch.get_num_threads(), "generation": [],
                     "scoring": []}

    tf = load_model("default", batch_size=max(sizes + [8]))
    ref_rates = {b: gen_speed(tf, convs, b, args.max_tokens, args.repeat) for b in sizes}
    for layout in args.layouts.split(","):
        intra, inter = (int(x) for x in layout.split("x"))
        ct = load_model("default", backend="ctranslate2", quantization=args.quantization,
                        intra_threads=intra, inter_threads=inter, batch_size=max(sizes))
        for b in sizes:
            rate = gen_speed(ct, convs, b, args.max_tokens, args.repeat)
            figures["generation"].append({
                "batch": b, "layout": layout, "quantization": ct.compute_type,
                "ct2_tokens_per_s": rate, "transformers_tokens_per_s": ref_rates[b],
                "ratio": rate / ref_rates[b]})
        ct.close()

    if args.items:
        pairs = mc_requests(args.items, args.mc_source)
        reqs, gold = [r for r, _ in pairs], [g for _, g in pairs]
        ref, ref_rate = timed_score(tf, reqs)
        for q in args.score_quantizations.split(","):
            ct = load_model("default", backend="ctranslate2", quantization=q,
                            intra_threads=args.score_threads, batch_size=8,
                            scoring="ctranslate2")  # measure its own scoring, never auto
            got, rate = timed_score(ct, reqs)
            figures["scoring"].append({"quantization": ct.compute_type,
                                       "ct2_items_per_s": rate,
                                       "transformers_items_per_s": ref_rate,
                                       "ratio": rate / ref_rate, **parity(ref, got, gold)})
            ct.close()

    print(table(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def table(f: dict) -> str:
    lines = [(f"`{f['command']}` ({f['cpu_count']} cores, torch threads "
              f"{f['torch_threads']})"), "",
             ("| generation (greedy) | batch | CTranslate2 tokens/s | transformers fp32 "
              "tokens/s | ratio |"), "|---|---|---|---|---|"]
    for g in f["generation"]:
        lines.append(f"| {g['quantization']}, threads {g['layout']} (intra x inter) | "
                     f"{g['batch']} | {g['ct2_tokens_per_s']:.1f} | "
                     f"{g['transformers_tokens_per_s']:.1f} | {g['ratio']:.2f}x |")
    if f["scoring"]:
        lines += ["", ("| scoring | items | CTranslate2 items/s | transformers fp32 items/s | "
                       "ratio | same choice | max abs delta loglik | accuracy CT2 / fp32 |"),
                  "|---|---|---|---|---|---|---|---|"]
        for s in f["scoring"]:
            lines.append(f"| {s['quantization']} | {s['items']} | {s['ct2_items_per_s']:.2f} | "
                         f"{s['transformers_items_per_s']:.2f} | {s['ratio']:.2f}x | "
                         f"{100 * s['same_choice']:.1f}% | {s['max_abs_dloglik']:.3f} | "
                         f"{100 * s['accuracy']:.1f}% / {100 * s['accuracy_ref']:.1f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
