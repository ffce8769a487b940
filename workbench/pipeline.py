"""The main job: reproduce RF-Agent's comparison for any domain with one command.

    ingest + distil -> split (benchmark sections disjoint from training) -> build indexes
    -> evaluate base x {none, semantic, keyword, hybrid} -> LoRA SFT on the training split
    -> evaluate SFT x {none, best RAG} -> report.md / report.json with the table, retrieval
    metrics from the benchmark's provenance, training curves and plots.

Every stage records a hash of its inputs; a re-run skips the stages whose inputs did not
change, and the model calls of a re-run distillation come from the call cache.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from workbench.config import ExperimentConfig
from workbench.io import atomic_write_json, atomic_write_text, sha256_file

STAGES = ("distill", "index", "eval_base", "train", "eval_sft", "report")


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


class Stages:
    def __init__(self, run: Path):
        self.path = run / "stages.json"
        self.state = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, name: str, h: str) -> bool:
        return self.state.get(name, {}).get("hash") == h

    def mark(self, name: str, h: str, seconds: float, **info) -> None:
        self.state[name] = {"hash": h, "seconds": round(seconds, 1), **info}
        atomic_write_json(self.path, self.state)


def run_pipeline(cfg: ExperimentConfig, *, log=print) -> dict[str, Any]:
    from workbench.distill.api import distill_from_config
    from workbench.evaluate.run import (
        evaluate_conditions, load_benchmark, retrieval_metrics, write_eval,
    )
    from workbench.models.factory import open_chat_model
    from workbench.rag.index import RagIndex
    from workbench.records import Section, read_records

    run = cfg.run_dir
    run.mkdir(parents=True, exist_ok=True)
    stages = Stages(run)
    t_all = time.perf_counter()
    base_cfg = {"models": cfg.models.chat.model_dump(), "seed": cfg.seed}

    # 1. distil (the call cache makes a re-run cheap even when this stage must redo)
    h_distill = _hash(base_cfg, cfg.distill.model_dump(), _corpus_hash(cfg.distill.corpus))
    t0 = time.perf_counter()
    if not stages.done("distill", h_distill):
        log("== distill")
        res = distill_from_config(cfg, progress=log)
        stages.mark("distill", h_distill, time.perf_counter() - t0,
                    accepted=res.report["accepted"])
    distill_dir = run / "distill"
    bench_path = distill_dir / "benchmark.jsonl"
    sft_path = distill_dir / "sft" / "instruct_mixed.messages.jsonl"

    # 2. indexes over the whole corpus (benchmark questions must find their sections)
    index_dir = run / "index"
    h_index = _hash(sha256_file(distill_dir / "sections.jsonl"), cfg.rag.model_dump())
    t0 = time.perf_counter()
    if not stages.done("index", h_index):
        log("== index")
        sections = read_records(distill_dir / "sections.jsonl", Section)
        RagIndex.build(sections, index_dir, config=cfg.rag, log=log)
        stages.mark("index", h_index, time.perf_counter() - t0)
    index = None

    def get_index():
        nonlocal index
        if index is None:
            index = RagIndex.load(index_dir)
        return index

    items = load_benchmark(bench_path, cfg.pipeline.eval_items) if \
        bench_path.exists() and bench_path.stat().st_size else []
    if not items:
        log("warning: the distillation produced no benchmark items; evaluation is skipped")

    # 3. base model under every condition
    ec = cfg.eval.model_copy(update={"conditions": ["none", "semantic", "keyword", "hybrid"]})
    h_base = _hash(base_cfg, sha256_file(bench_path) if items else None, h_index,
                   ec.model_dump(), cfg.pipeline.eval_items)
    t0 = time.perf_counter()
    base_name = f"base ({cfg.models.chat.spec})"
    if items and not stages.done("eval_base", h_base):
        log("== evaluate base model")
        model = open_chat_model(cfg.models.chat, cfg)
        results, summary = evaluate_conditions(model, items, ec, index=get_index(),
                                               model_name=base_name, log=log)
        write_eval(run / "eval_base", results, summary,
                   {"model": model.identity, "items": len(items),
                    "retrieval": retrieval_metrics(get_index(), items)})
        stages.mark("eval_base", h_base, time.perf_counter() - t0)
    base_summary = _read_summary(run / "eval_base")

    # 4. LoRA SFT on the training split
    adapter = run / "adapter"
    tc = cfg.train.model_copy(update={"data": str(sft_path), "output": str(adapter)})
    tc.domain_eval.benchmark = str(bench_path) if items else None
    h_train = _hash(base_cfg, sha256_file(sft_path) if sft_path.exists() else None,
                    tc.model_dump())
    t0 = time.perf_counter()
    if not stages.done("train", h_train):
        log("== train")
        from workbench.train.recipe import train

        train(tc, model_spec=cfg.models.chat.spec, output=adapter, seed=cfg.seed, log=log)
        stages.mark("train", h_train, time.perf_counter() - t0)

    # 5. the SFT model without RAG and with the base model's best RAG
    best = _best_rag(base_summary)
    conds = ["none", "semantic", "keyword", "hybrid"] if cfg.pipeline.sft_conditions == "all" \
        else ["none"] + ([best] if best else [])
    ec_sft = cfg.eval.model_copy(update={"conditions": conds, "hit_vs_miss": False})
    h_sft = _hash(h_train, h_base, ec_sft.model_dump(), sha256_file(
        adapter / "adapter_model.safetensors"))
    t0 = time.perf_counter()
    if items and not stages.done("eval_sft", h_sft):
        log("== evaluate SFT model")
        mc = cfg.models.chat.model_copy(update={"options": {**cfg.models.chat.options,
                                                            "adapter": str(adapter),
                                                            "merge_adapter": True}})
        model = open_chat_model(mc, cfg)
        results, summary = evaluate_conditions(model, items, ec_sft, index=get_index(),
                                               model_name="SFT (LoRA)", log=log)
        write_eval(run / "eval_sft", results, summary, {"model": model.identity,
                                                        "items": len(items)})
        stages.mark("eval_sft", h_sft, time.perf_counter() - t0)

    # 6. report
    report = build_report(cfg, run, stages.state, base_summary, _read_summary(run / "eval_sft"),
                          best, time.perf_counter() - t_all)
    stages.mark("report", _hash(report["table"]), 0.0)
    log(f"== report: {run / 'report.md'}")
    return report


def _corpus_hash(corpus: str) -> str:
    p = Path(corpus)
    files = sorted(p.rglob("*")) if p.is_dir() else [p]
    return _hash([(str(f.relative_to(p) if p.is_dir() else f.name), sha256_file(f))
                  for f in files if f.is_file()])


def _read_summary(folder: Path) -> dict:
    f = folder / "summary.json"
    return json.loads(f.read_text()) if f.exists() else {}


def _best_rag(base: dict) -> str | None:
    conds = base.get("conditions", {})
    scored = [(conds[c].get("acc_loglik_letter", 0), c) for c in ("semantic", "keyword",
                                                                  "hybrid") if c in conds]
    return max(scored)[1] if scored else None


ROW_NAMES = {"none": "", "semantic": " + semantic RAG", "keyword": " + keyword RAG",
             "hybrid": " + hybrid RAG"}


def build_report(cfg, run: Path, stages: dict, base: dict, sft: dict, best: str | None,
                 seconds: float) -> dict[str, Any]:
    table = []
    for who, summ in (("Base", base), ("SFT", sft)):
        for cond, s in summ.get("conditions", {}).items():
            if cond not in ROW_NAMES:
                continue
            table.append({"model": who, "condition": cond, "name": who + ROW_NAMES[cond],
                          "n": s.get("n"), "acc_loglik": s.get("acc_loglik_letter"),
                          "acc_loglik_text_norm": s.get("acc_loglik_text_norm"),
                          "acc_generate": s.get("acc_generate"),
                          "agreement": s.get("agreement_loglik_generate"),
                          "seconds_per_item": s.get("seconds_per_item")})
    hit_miss = {c.replace("_ranks4-6", ""): {"ranks_1_3": base["conditions"][c.replace(
        "_ranks4-6", "")].get("acc_loglik_letter"), "ranks_4_6": s.get("acc_loglik_letter")}
        for c, s in base.get("conditions", {}).items() if c.endswith("_ranks4-6")}
    distill = json.loads((run / "distill" / "report.json").read_text()) \
        if (run / "distill" / "report.json").exists() else {}
    train_manifest = json.loads((run / "adapter" / "manifest.json").read_text()) \
        if (run / "adapter" / "manifest.json").exists() else {}
    report = {"name": cfg.name, "seed": cfg.seed, "model": cfg.models.chat.spec,
              "table": table, "best_rag": best, "hit_vs_miss": hit_miss,
              "retrieval": base.get("retrieval", {}),
              "distill": {k: distill.get(k) for k in ("accepted", "stages", "rejects",
                                                     "verifier", "letter_balance",
                                                     "model_calls")},
              "train": train_manifest.get("outputs", {}),
              "stage_seconds": {k: v.get("seconds") for k, v in stages.items()},
              "seconds": round(seconds, 1)}
    atomic_write_json(run / "report.json", report)
    _plot_table(table, run / "comparison.png")
    atomic_write_text(run / "report.md", report_markdown(report, run))
    return report


def _fmt(v, pct=False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def report_markdown(r: dict, run: Path) -> str:
    lines = [f"# {r['name']}: base vs RAG vs SFT", "",
             f"Model `{r['model']}`, seed {r['seed']}, total {r['seconds']} s "
             "(stages skipped on a re-run take ~0 s).", "",
             "## The comparison (RF-Agent's table)", "",
             "| configuration | items | accuracy (log-likelihood) | accuracy (generation) | "
             "accuracy (option text, length-norm.) | agreement | s/item |",
             "|---|---|---|---|---|---|---|"]
    for row in r["table"]:
        lines.append(f"| {row['name']} | {row['n']} | {_fmt(row['acc_loglik'], True)} | "
                     f"{_fmt(row['acc_generate'], True)} | "
                     f"{_fmt(row['acc_loglik_text_norm'], True)} | "
                     f"{_fmt(row['agreement'], True)} | {_fmt(row['seconds_per_item'])} |")
    lines += ["", "Chance is 25% (four options). ![comparison](comparison.png)", ""]
    if r["hit_vs_miss"]:
        lines += ["## Does retrieval quality matter? (contexts from ranks 1-3 vs ranks 4-6)",
                  "", "| retriever | ranks 1-3 | ranks 4-6 |", "|---|---|---|"]
        lines += [f"| {k} | {_fmt(v['ranks_1_3'], True)} | {_fmt(v['ranks_4_6'], True)} |"
                  for k, v in r["hit_vs_miss"].items()]
        lines.append("")
    if r["retrieval"]:
        lines += ["## Retrieval (each benchmark question's source section is its relevant "
                  "document)", "", "| retriever | Hit@1 | Hit@3 | Hit@10 | MRR | nDCG@10 |",
                  "|---|---|---|---|---|---|"]
        for k, m in r["retrieval"].items():
            lines.append(f"| {k} | {_fmt(m['hit@1'])} | {_fmt(m['hit@3'])} | "
                         f"{_fmt(m['hit@10'])} | {_fmt(m['mrr'])} | {_fmt(m['ndcg@10'])} |")
        lines.append("")
    d = r["distill"]
    if d.get("accepted"):
        a = d["accepted"]
        lines += ["## Data", "", f"- distilled samples: {a['total']} ({a['mc']} multiple-"
                  f"choice, {a['nd']} open), {a['train']} for training, "
                  f"{a['benchmark_items']} benchmark items from held-out sections",
                  "- details: [distill/report.md](distill/report.md)", ""]
    t = r["train"]
    if t:
        fin = t.get("final", {})
        lines += ["## Training", "", f"- {t.get('steps')} steps on {t.get('train_examples')} "
                  f"examples, {t.get('device')} {t.get('dtype')}, "
                  f"{_fmt(t.get('tokens_per_s'))} tokens/s, padding share "
                  f"{_fmt(t.get('padding_share'), True)}",
                  f"- final loss {_fmt(fin.get('loss'))}, eval loss "
                  f"{_fmt(fin.get('eval_loss'))}, domain accuracy "
                  f"{_fmt(fin.get('domain_accuracy'), True)}",
                  "- curves: ![training](adapter/training_curves.png)", ""]
    lines += ["## Stage times (s)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r["stage_seconds"].items()]
    return "\n".join(lines) + "\n"


def _plot_table(table: list[dict], path: Path) -> None:
    if not table:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["name"] for row in table]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 3.8))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [row["acc_loglik"] or 0 for row in table], 0.4,
           label="log-likelihood")
    ax.bar([x + 0.2 for x in xs], [row["acc_generate"] or 0 for row in table], 0.4,
           label="generation")
    ax.axhline(0.25, color="grey", linestyle=":", linewidth=1, label="chance")
    ax.set_xticks(list(xs), names, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title("Base vs RAG vs SFT")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
