"""What a benchmark item costs the main job on this machine, and whether int8 scoring may buy it.

The main job (`configs/rf_demo.yaml`, `configs/rf_power.yaml`) scores every benchmark item
under base x {none, semantic, keyword, hybrid} and SFT x {none, best RAG}. This measures, with
the bundled SmolLM2-135M on the transformers backend:

1. raw forward throughput (tokens/s) at a few batch sizes and prompt lengths: the ceiling;
2. seconds per item for each scoring (letter, cloze, 48-token generation), without context
   and with the top-3 keyword chunks of the RF corpus (chunks of 96 words, as the main job);
3. torch dynamic int8 (`quantize_dynamic` of every Linear) against fp32 on the same cloze
   requests: speed ratio, same choice (acc_norm) and the largest log-likelihood change;
4. seconds per question call of the distillation's writer at batch 16 and 64;
5. the evaluation time the main job's conditions would take at --items-target items.

    python benchmarks/bench_main_job_budget.py --items 40 --json benchmarks/results/budget.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rf_items(n: int) -> list:
    from workbench.records import MCItem

    path = REPO / "datasets" / "rf_distilled" / "mcQTSA.jsonl"
    keep = ("id", "question", "options", "answer")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return [MCItem.model_validate({k: v for k, v in r.items() if k in keep}) for r in rows][:n]


def keyword_contexts(items, folder: Path) -> list[str]:
    from workbench.retrieval.index import RagConfig
    from workbench.retrieval.search import build_index, context_providers

    cfg = RagConfig(chunk_size=96, chunk_overlap=16)  # as the main job
    index, _ = build_index(REPO / "datasets" / "rf", folder, cfg, log=lambda m: None)
    return context_providers(index, ["keyword"])["keyword"]([it.question for it in items])


def forward_throughput(model) -> list[dict]:
    import torch

    out = []
    for bs, length in ((1, 100), (1, 400), (16, 100), (8, 400)):
        ids = torch.randint(100, 20000, (bs, length))
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1)
            t0 = time.perf_counter()
            model(input_ids=ids, logits_to_keep=1)
            dt = time.perf_counter() - t0
        out.append({"batch": bs, "tokens": length, "tokens_per_s": round(bs * length / dt)})
        print(f"forward batch {bs} x {length}: {bs * length / dt:.0f} tokens/s", flush=True)
    return out


def generation_batches(prompts: int = 64) -> dict[str, float]:
    """Seconds per question call of the distillation's writer at batch 16 and 64."""
    from workbench.corpus import load_sections
    from workbench.distill.pipeline import Span, _conv, _facts
    from workbench.domain_packs import load_pack
    from workbench.models.backends import load_model
    from workbench.models.base import GenerationParams

    pack = load_pack("rf")
    sections, _ = load_sections(REPO / "datasets" / "rf")
    facts = [f for s in sections for f in _facts(Span(s.id, s, s.text, ""), 0)][:prompts]
    convs = [_conv(pack, pack.prompts.question_from_fact.format(fact=f, start="",
                                                               domain=pack.title))
             for f in facts]
    out = {}
    for bs in (16, 64):
        model = load_model("default", backend="transformers", batch_size=bs)
        model.generate(convs[:2], GenerationParams(max_tokens=4))
        t0 = time.perf_counter()
        model.generate(convs, GenerationParams(max_tokens=48, temperature=0.7, seed=0))
        out[f"batch_{bs}"] = round((time.perf_counter() - t0) / len(convs), 3)
        print(f"question writing at batch {bs}: {out[f'batch_{bs}']} s a call", flush=True)
    return out


def per_item(model, items, contexts) -> dict[str, float]:
    from workbench.evaluate.mc import evaluate_mc

    out = {}
    for name, kw in (("letter", {"methods": ["loglik"], "formulations": ["letter"]}),
                     ("cloze", {"methods": ["loglik"], "formulations": ["cloze"]}),
                     ("generate_48", {"methods": ["generate"], "max_tokens": 48})):
        t0 = time.perf_counter()
        evaluate_mc(model, items, contexts=contexts, **kw)
        out[name] = round((time.perf_counter() - t0) / len(items), 3)
    return out


def int8_parity(model, items, contexts) -> dict:
    import torch

    from workbench.evaluate.mc import argmax, cloze_request

    reqs = [cloze_request(it) for it in items] + [cloze_request(it, c)
                                                   for it, c in zip(items, contexts, strict=True)]
    both = list(items) + list(items)
    t0 = time.perf_counter()
    fp32 = model.score(reqs)
    t_fp32 = time.perf_counter() - t0
    saved = model.model
    model.model = torch.ao.quantization.quantize_dynamic(saved, {torch.nn.Linear},
                                                         dtype=torch.qint8)
    try:
        model.score(reqs[:1])
        t0 = time.perf_counter()
        q = model.score(reqs)
        t_q = time.perf_counter() - t0
    finally:
        model.model = saved

    def choice(row, it):
        return argmax([s.logprob / max(len(o), 1) for s, o in zip(row, it.options,
                                                                   strict=True)])

    same = sum(choice(a, it) == choice(b, it) for a, b, it in zip(fp32, q, both, strict=True))
    acc = [sum(choice(r, it) == "ABCD".index(it.answer) for r, it in zip(rows, both,
                                                                          strict=True))
           / len(both) for rows in (fp32, q)]
    delta = max(abs(x.logprob - y.logprob) for a, b in zip(fp32, q, strict=True)
                for x, y in zip(a, b, strict=True))
    return {"requests": len(reqs), "speedup": round(t_fp32 / t_q, 2),
            "same_choice": round(same / len(both), 3), "accuracy_fp32": round(acc[0], 3),
            "accuracy_int8": round(acc[1], 3), "max_abs_delta_loglik": round(delta, 2)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=40, help="RF items to time (shipped set)")
    ap.add_argument("--items-target", type=int, default=150,
                    help="benchmark size to project the main job's evaluation time for")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    import torch

    from workbench.models.backends import load_model

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    items = rf_items(args.items)
    with tempfile.TemporaryDirectory() as tmp:
        contexts = keyword_contexts(items, Path(tmp) / "index")
    model = load_model("default", backend="transformers", batch_size=16)
    res: dict = {"items": len(items), "threads": torch.get_num_threads(),
                 "forward": forward_throughput(model.model)}
    res["seconds_per_item"] = {"none": per_item(model, items, None),
                               "rag_top3": per_item(model, items, contexts)}
    print("seconds per item:", json.dumps(res["seconds_per_item"]), flush=True)
    res["int8_dynamic"] = int8_parity(model, items, contexts)
    res["generation_s_per_call"] = generation_batches()
    print("torch dynamic int8 vs fp32 (cloze):", json.dumps(res["int8_dynamic"]), flush=True)
    s = res["seconds_per_item"]
    n = args.items_target

    def project(kinds):
        none = sum(s["none"][k] for k in kinds)
        rag = sum(s["rag_top3"][k] for k in kinds)
        return round(n * (2 * none + 4 * rag))  # base: none + 3 RAG; SFT: none + best RAG

    res["projected_eval_seconds"] = {
        "all (letter, cloze, generate)": project(("letter", "cloze", "generate_48")),
        "cloze only": project(("cloze",))}
    print(f"projected evaluation at {n} items:", json.dumps(res["projected_eval_seconds"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res


if __name__ == "__main__":
    main()
