"""The literature-search job: dialogues on the dev intents under four conditions (a single
keyword query, a fixed hybrid workflow with rule edits, the agent, the oracle teacher), one
report with intervals; the teacher's dialogues on training intents exported as SFT and as
chosen/rejected pairs against controlled corruptions. Adapter conditions beside the agent:
`agent.adapters` (folders given) and, when `agent.conditions` names them, agent+sft and
agent+sft_dpo trained here on those exports (`tuned.py`), with paired comparisons
(`paired.py`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.agent_packs.api import conditions
from workbench.agent_packs.litsearch.corrupt import (
    FEEDBACK,
    STRUCTURAL,
    corrupt,
    feedback_corruption,
)
from workbench.agent_packs.litsearch.dialogue import (
    last_assistant,
    model_turns,
    oracle_choice,
    rule_turns,
    start,
)
from workbench.agent_packs.litsearch.library import library_hash
from workbench.agent_packs.litsearch.pack import (
    Library,
    edits,
    load_corpus,
    sections,
    templates,
    toolbox,
    workflow_call,
)
from workbench.agent_packs.litsearch.paired import paired, paired_lines
from workbench.agent_packs.litsearch.report import REPORT_JSON, REPORT_MD, LitsearchReport
from workbench.agent_packs.litsearch.tuned import (
    TRAINED,
    adapter_folder,
    check_names,
    train_adapters,
)
from workbench.agent_packs.reports import Interval, report_json
from workbench.agents.steps import AgentStep, AgentTrajectory
from workbench.domain_packs import load_pack
from workbench.errors import ConfigError, WorkbenchError
from workbench.evaluate.stats import bootstrap_interval, wilson_interval
from workbench.io import atomic_write_text, read_jsonl, write_jsonl
from workbench.models.factory import open_chat_model
from workbench.models.local import check_adapter_dir
from workbench.records import ChatExample, Message
from workbench.registry import PipelineResult
from workbench.retrieval.search import Searcher
from workbench.runs import RunLayout, file_hash, outputs_at
from workbench.text import markdown_table, number, number_interval, percent

CONDITIONS = ("query_only", "fixed", "agent", "oracle")


def prompts() -> tuple[str, str]:
    """(system prompt, request template) from the litsearch domain pack."""
    pack = load_pack("litsearch")
    return pack.agent.system, pack.agent.settings.get("request", "Find papers related to: "
                                                                 "{query}")


def make_library(cfg, folder: Path, model=None, log=print) -> Library:
    papers, _ = load_corpus(cfg.agent.data)
    secs = sections(papers)
    kw = Searcher(secs, folder / "index", "keyword", log=log)
    sem = Searcher(secs, folder / "index", "semantic", log=log)
    lib = Library(papers, kw, sem, model=model)
    if not lib.citations:
        log(f"{cfg.agent.data}: the library has no citations (BibTeX and RIS exports carry "
            "none): the citation operators cite_backward and cite_forward and the workflows "
            "that expand through them are off")
    return lib


def _fixed(d, cands) -> str:
    if d.workflow is None:
        return "hybrid"
    for name in ("expand_and_drop", "expand_accepted", "drop_rejected"):
        if name in cands:
            return name
    return "keep"


def run_condition(cond: str, intents, lib: Library, model, turns: int, ac) -> list[dict]:
    dialogues = start(intents, *prompts())
    for _ in range(turns):
        if cond == "query_only":
            rule_turns(dialogues, lib, lambda d, c: "keyword" if d.workflow is None else "keep")
        elif cond == "fixed":
            rule_turns(dialogues, lib, _fixed)
        elif cond == "oracle":
            rule_turns(dialogues, lib, oracle_choice(lib))
        else:
            model_turns(dialogues, lib, model, policy=ac.policy, calibrate="none")
    return [d.to_json() for d in dialogues]


def summarise(rows: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"dialogues": len(rows)}
    for key in ("hit5", "mrr", "ndcg10"):
        final = [r["turns"][-1][key] for r in rows]
        avg = [float(np.mean([t[key] for t in r["turns"]])) for r in rows]
        out[f"{key}_final"] = float(np.mean(final))
        out[f"{key}_final_ci95"] = list(bootstrap_interval(final, n_resamples=1000))
        out[f"{key}_avg"] = float(np.mean(avg))
        out[f"{key}_avg_ci95"] = list(bootstrap_interval(avg, n_resamples=1000))
    turns = [t for r in rows for t in r["turns"]]
    errs = sum(t["error"] is not None for t in turns)
    out["execution_error_rate"] = errs / len(turns)
    out["execution_error_ci95"] = list(wilson_interval(errs, len(turns)))
    later = [(r["turns"][-1]["memo_hits"] - r["turns"][0]["memo_hits"],
              r["turns"][-1]["memo_misses"] - r["turns"][0]["memo_misses"]) for r in rows]
    hits, misses = sum(h for h, _ in later), sum(m for _, m in later)
    out["memo_hit_rate_after_turn1"] = hits / (hits + misses) if hits + misses else None
    out["choices"] = {}
    for t in turns:
        out["choices"][t["choice"]] = out["choices"].get(t["choice"], 0) + 1
    out["seconds_per_dialogue"] = float(np.mean([r["seconds"] for r in rows]))
    return out


def export_training(out: Path, dialogues: list[dict], lib: Library) -> dict[str, int]:
    """Gold SFT (the teacher's dialogues) and chosen/rejected pairs per turn."""
    sft, pairs = [], []
    tools = [t.model_dump(mode="json") for t in toolbox().specs()]
    for d in dialogues:
        msgs = d["messages"]
        sft.append(ChatExample.model_validate({"messages": last_assistant(msgs),
                                               "tools": tools, "id": d["id"]}))
        calls = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        prev = None
        for turn, i in zip(d["turns"], calls, strict=False):
            gold = turn["workflow"]
            intent = next(x for x in lib.intents if x.id == d["id"])
            cands = templates(intent, lib.citations) if prev is None else edits(
                prev["workflow"], prev["accepted"], prev["rejected"], lib.papers)
            rejected = [(k, corrupt(gold, k)) for k in STRUCTURAL]
            if prev is not None:
                rejected += [(k, feedback_corruption(cands, turn["choice"], k,
                                                     prev["accepted"], prev["rejected"],
                                                     lib.papers)) for k in FEEDBACK]
            for kind, bad in rejected:
                if bad is None or bad == gold:
                    continue
                pairs.append({"id": f"{d['id']}:t{turn['turn']}:{kind}", "kind": kind,
                              "prompt": msgs[:i], "chosen": [_call_msg(gold)],
                              "rejected": [_call_msg(bad)], "tools": tools,
                              "metadata": {"source": "litsearch", "intent": d["id"],
                                           "turn": turn["turn"]}})
            prev = turn
    files = outputs_at("agent", out)
    write_jsonl(files.path("litsearch_sft_data"), sft)
    atomic_write_text(files.path("preferences"),
                      "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    return {"sft": len(sft), "preferences": len(pairs)}


def _call_msg(wf: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [workflow_call(wf).model_dump(mode="json")]}


def _wanted(ac) -> list[str]:
    """The configured conditions: the pack's four by default; agent+sft and agent+sft_dpo
    (trained here, `tuned.py`) only when `agent.conditions` names them."""
    return conditions(ac, (*CONDITIONS, *TRAINED)) if ac.conditions else list(CONDITIONS)


def evaluate(cfg, ctx):
    ac = cfg.agent
    wanted = _wanted(ac)
    trained = [c for c in TRAINED if c in wanted]
    check_names(ac, trained)
    if trained == [TRAINED[1]]:
        ctx.log(f"{TRAINED[1]} without {TRAINED[0]} in agent.conditions: its adapter starts "
                "from the SFT adapter, but no paired comparison against SFT is made")
    out = ctx.layout.folder("agent")
    out.mkdir(parents=True, exist_ok=True)
    _, intents = load_corpus(ac.data, log=ctx.log)
    dev = [i for i in intents if i.part == "dev"][:ac.dev_limit or None]
    train = [i for i in intents if i.part == "train"][:ac.train_limit or None]
    if not dev:
        where = f"{ac.data}/anchors.jsonl" if Path(ac.data, "anchors.jsonl").is_file() \
            else str(ac.data)
        raise WorkbenchError(f"{where}: no intents with part 'dev' to evaluate on ("
                             f"{len(intents)} intents in all)")
    model = open_chat_model(cfg.models.chat, cfg) if "agent" in wanted else None
    lib = make_library(cfg, out, model=model, log=ctx.log)
    lib.intents = intents
    if Path(ac.data, "papers.jsonl").is_file():
        key = (file_hash(Path(ac.data) / "papers.jsonl"), file_hash(Path(ac.data) /
                                                                    "anchors.jsonl"), ac.turns)
    else:  # a library file or folder: an edited export is new input
        key = (library_hash(ac.data), None, ac.turns)
    # the teacher's training data first: the trained conditions learn from it
    exports = _training_data(ctx, out, key, train, lib, ac)
    tuned = {f"agent+{name}": _with_adapter(cfg, path) for name, path in ac.adapters.items()}
    folders, trained_info = train_adapters(cfg, ctx, out, trained)
    tuned |= {c: _with_adapter(cfg, str(folders[c])) for c in trained}
    summaries = {}
    for cond in [*[c for c in wanted if c not in TRAINED], *tuned]:
        summaries[cond] = _condition(cfg, ctx, out, cond, tuned.get(cond), model, lib, dev,
                                     key)
    report = write_report(out, summaries, exports, dev=len(dev), turns=ac.turns,
                          model=cfg.models.chat.spec, citations=lib.citations,
                          trained=trained_info or None)
    return _result(ctx, out, report, len(dev))


def _condition(cfg, ctx, out: Path, cond: str, mc, model, lib: Library, dev, key
               ) -> dict[str, Any]:
    """One condition's dialogues on the dev intents (its stage: skipped when done), summed
    up; `mc` is the model config of an adapter condition (None: a plain condition)."""
    ac = cfg.agent
    path = outputs_at("agent", out).path("litsearch", cond)

    def go() -> dict[str, Any]:
        t0 = time.perf_counter()
        m = open_chat_model(mc, cfg) if mc is not None else model
        rows = run_condition("agent" if mc is not None else cond, dev, lib, m, ac.turns, ac)
        write_jsonl(path, rows)
        return {"seconds": round(time.perf_counter() - t0, 2)}

    mk = None
    if mc is not None:
        mk = mc.model_dump(mode="json") | {"adapter_sha": file_hash(
            Path(mc.options["adapter"]) / "adapter_model.safetensors")}
    elif cond == "agent":
        mk = cfg.models.chat.model_dump(mode="json")
    rec, _ = ctx.stages("agent").run("litsearch", (key, cond, [i.id for i in dev], mk,
                                                   ac.policy), go, part=cond)
    seconds = (rec.info or {}).get("seconds")
    summary = summarise(read_jsonl(path))
    if seconds is not None:  # wall time, model calls included
        summary["seconds_per_dialogue"] = seconds / max(len(dev), 1)
    return summary


def _training_data(ctx, out: Path, key, train, lib: Library, ac) -> dict[str, Any]:
    """The oracle teacher's dialogues on the training intents, exported as SFT dialogues and
    preference pairs (its stage); the export counts."""
    gold_path = outputs_at("agent", out).path("litsearch_teacher")

    def teach() -> dict[str, Any]:
        rows = run_condition("oracle", train, lib, None, ac.turns, ac)
        write_jsonl(gold_path, rows)
        return export_training(out, rows, lib)

    rec, _ = ctx.stages("agent").run("litsearch_training_data", (key, [i.id for i in train]),
                                     teach)
    return dict(rec.info or {})


def _result(ctx, out: Path, report: LitsearchReport, dev: int):
    ndcg = report.ndcg10()
    line = ", ".join(f"{c} {v:.2f}" for c, v in ndcg.items())
    files = outputs_at("agent", out)
    outputs = {"report": str(out / REPORT_MD), "sft": str(files.path("litsearch_sft_data")),
               "preferences": str(files.path("preferences"))}
    outputs |= {f"adapter_{c.removeprefix('agent+')}": str(adapter_folder(out, c))
                for c in report.trained or {}}
    return PipelineResult(
        pipeline="agent", run_dir=str(ctx.layout.root), outputs=outputs,
        figures={f"{c}_ndcg10": round(v, 4) for c, v in ndcg.items()},
        message=f"{out / REPORT_MD}: nDCG@10 after {report.turns} turns on {dev} "
                f"intents: {line}; {report.exports.sft} SFT dialogues, "
                f"{report.exports.preferences} preference pairs")


def _with_adapter(cfg, adapter: str):
    """models.chat with an adapter attached (an agent+NAME condition)."""
    try:
        check_adapter_dir(adapter)
    except WorkbenchError as e:
        raise ConfigError([f"agent.adapters: {e}"]) from None
    mc = cfg.models.chat
    return mc.model_copy(update={"options": {**mc.options, "adapter": str(adapter)}})


def write_report(out: Path, s: dict[str, dict], exports: dict, *, dev: int, turns: int,
                 model: str, citations: bool = True, trained: dict[str, dict] | None = None
                 ) -> LitsearchReport:
    """`litsearch_report.json` (a `LitsearchReport`) and `litsearch_report.md` in `out`, from
    the conditions' summaries (the paired comparisons read from their dialogue files) and
    the adapters trained here; returns the record."""
    report = LitsearchReport(intents=dev, turns=turns, model=model, citations=citations,
                             conditions=s, exports=exports, paired=paired(out, list(s)),
                             trained=trained)
    atomic_write_text(out / REPORT_JSON, report_json(report))

    def f(v: float, ci: Interval) -> str:
        return number_interval(v, ci.low, ci.high)

    lines = [f"# Literature search: {dev} intents, {turns} turns, model `{model}`", "",
             "Final turn and mean over turns; 95% bootstrap intervals over intents. Relevant "
             "for Hit@5 and MRR: grade >= 2; nDCG@10 uses the grades (3 citation, 2 shared "
             "references or MeSH, 1 shared major MeSH)."
             + ("" if citations else " The library has no citations: the citation "
                "operators and the workflows that expand through them were off."), "",
             markdown_table(
                 ["condition", "Hit@5 final", "MRR final", "nDCG@10 final",
                  "nDCG@10 mean over turns", "execution errors", "memo hits after turn 1",
                  "s / dialogue (wall)", "choices"],
                 [[c, f(v.hit5_final, v.hit5_final_ci95), f(v.mrr_final, v.mrr_final_ci95),
                   f(v.ndcg10_final, v.ndcg10_final_ci95), f(v.ndcg10_avg, v.ndcg10_avg_ci95),
                   percent(v.execution_error_rate), percent(v.memo_hit_rate_after_turn1),
                   number(v.seconds_per_dialogue, 2), v.choices]
                  for c, v in report.conditions.items()])]
    lines += paired_lines(report)
    files = outputs_at("agent", out)
    lines += ["", f"Training data from the oracle teacher on the training intents: "
              f"{report.exports.sft} SFT dialogues (`{files.path('litsearch_sft_data').name}`), "
              f"{report.exports.preferences} chosen/rejected pairs "
              f"(`{files.path('preferences').name}`; "
              "corruptions: " + ", ".join((*STRUCTURAL, *FEEDBACK)) + ")."]
    atomic_write_text(out / REPORT_MD, "\n".join(lines) + "\n")
    return report


def run_inputs(cfg, inputs: list[str], log=print):
    """Run the agent's dialogue on a few intents (ids from anchors.jsonl); each comes back
    as an `AgentTrajectory` whose steps are the submitted workflows and their results."""
    _, intents = load_corpus(cfg.agent.data)
    by_id = {i.id: i for i in intents}
    bad = [x for x in inputs if x not in by_id]
    if bad:
        example = f"e.g. {intents[0].id}; " if intents else ""
        raise WorkbenchError(f"unknown intent id(s) {', '.join(bad)} ({example}see "
                             f"{cfg.agent.data}/anchors.jsonl)")
    model = open_chat_model(cfg.models.chat, cfg)
    lib = make_library(cfg, RunLayout.of(cfg).folder("agent"), model=model, log=log)
    ds = start([by_id[x] for x in inputs], *prompts())
    for _ in range(cfg.agent.turns):
        model_turns(ds, lib, model, policy=cfg.agent.policy)
    out = []
    for d in ds:
        steps: list[AgentStep] = []
        for t in d.turns:
            steps.append(AgentStep(index=len(steps), turn=t["turn"], kind="tool_call",
                                   tool="submit_workflow", arguments={"choice": t["choice"]},
                                   error=t["error"]))
            steps.append(AgentStep(index=len(steps), turn=t["turn"], kind="observation",
                                   content=f"nDCG@10 {t['ndcg10']:.3f}, Hit@5 {t['hit5']:.0f}; "
                                           f"accepted {t['accepted']}, rejected "
                                           f"{t['rejected']}"))
        out.append(AgentTrajectory(id=d.intent.id, task_id=d.intent.id, pack="litsearch",
                                   messages=[Message.model_validate(m) for m in d.messages],
                                   steps=steps, final={"turns": len(d.turns)},
                                   model_turns=len(d.turns), seconds=d.seconds,
                                   metadata={"memo": d.to_json()["memo"]}))
    return out
