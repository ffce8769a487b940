"""The RF design job: the model alone, with RAG over the RF corpus, and with the calculator
tools, on the numeric design benchmark; one report with intervals and paired tests.

With tools the agent's guided policy chooses among calls the pack proposes: every way the
question's quantities fit a calculator's unit-typed arguments (two impedances: both orders;
a frequency only where a frequency goes), then, after the result, which of its fields is the
answer. The free policy lets a capable model write the calls itself.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.agent_packs import grpo as shared
from workbench.agent_packs.api import conditions
from workbench.agent_packs.reports import report_json
from workbench.agent_packs.rf import grpo
from workbench.agent_packs.rf import tools as T
from workbench.agent_packs.rf.bench import DesignItem, correct
from workbench.agent_packs.rf.report import REPORT_JSON, REPORT_MD, RfReport, report_markdown
from workbench.agents.runner import (
    AgentSetup,
    AgentState,
    AgentTask,
    Budget,
    FreePolicy,
    GuidedPolicy,
    run_agents,
)
from workbench.agents.steps import AgentTrajectory
from workbench.agents.tools import Toolbox, ToolError
from workbench.corpus import load_sections
from workbench.domain_packs import load_pack
from workbench.errors import WorkbenchError
from workbench.io import atomic_write_text, read_jsonl, write_jsonl
from workbench.models.base import GenerationParams
from workbench.models.factory import open_chat_model
from workbench.records import ToolCall
from workbench.registry import PipelineResult
from workbench.runs import file_hash, outputs_at
from workbench.text import percent

CONDITIONS = ("alone", "rag", "tools")  # the default set; tools+grpo on request (rf.grpo)


def prompts() -> tuple[str, str]:
    """(system prompt alone or with RAG, system prompt with the calculators) from the rf
    domain pack."""
    s = load_pack("rf").agent.settings
    return (s.get("design_system", "Answer with the number only."),
            s.get("design_tools_system", "Use a calculator, then answer."))
# calculator -> [(argument, kind, required)]; kinds are tools.quantity dimensions or "number"
SLOTS: dict[str, list[tuple[str, str, bool]]] = {
    "reflection": [("load", "impedance", True), ("z0", "impedance", True)],
    "quarter_wave": [("load", "impedance", True), ("z0", "impedance", True),
                     ("frequency", "frequency", True)],
    "l_match": [("source", "impedance", True), ("load", "impedance", True),
                ("frequency", "frequency", True)],
    "link_budget": [("tx_power", "power_dbm", False), ("frequency", "frequency", True),
                    ("distance", "length", True), ("tx_gain", "gain_dbi", False),
                    ("rx_gain", "gain_dbi", False)],
    "coax_impedance": [("d_inner", "length", True), ("d_outer", "length", True),
                       ("er", "number", False)],
    "microstrip_impedance": [("width", "length", True), ("height", "length", True),
                             ("er", "number", True)],
    "vswr_to_gamma": [("vswr", "number", True)],
}
DEFAULTS = {("link_budget", "tx_power"): "0 dBm"}  # path loss alone: any transmit power
_QTY = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*"
                  r"((?i:k?ohms?)|k?Ω|[pnuµμmkMG]?Hz|[kcmuµμ]?m|dBm|dBi|dB)?(?![\w])")
_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def quantities(question: str) -> list[tuple[str, str]]:
    """(text, kind) of each number in the question, in order ("75 ohm", "impedance")."""
    out = []
    for m in _QTY.finditer(question):
        text = m.group(0).strip()
        if not m.group(2):
            out.append((m.group(1), "number"))
            continue
        for kind in ("impedance", "frequency", "length", "power_dbm", "gain_dbi", "ratio_db"):
            try:
                T.quantity(text, kind, "q")
            except ToolError:
                continue
            out.append((text, kind))
            break
    return out


def bindings(question: str, cap: int = 4) -> list[ToolCall]:
    """Every calculator call the question's quantities fit (at most `cap` per calculator)."""
    qs = quantities(question)
    by_kind: dict[str, list[str]] = defaultdict(list)
    for text, kind in qs:
        by_kind[kind].append(text)
    calls: list[ToolCall] = []
    for name, slots in SLOTS.items():
        need = Counter(k for _, k, req in slots if req)
        if any(len(by_kind[k]) < n for k, n in need.items()):
            continue
        kinds = sorted({k for _, k, _ in slots})
        options = [list(itertools.permutations(by_kind[k], min(len(by_kind[k]), sum(
            1 for _, kk, _ in slots if kk == k)))) or [()] for k in kinds]
        for made, combo in enumerate(itertools.product(*options), start=1):
            pools = {k: list(p) for k, p in zip(kinds, combo, strict=True)}
            args = {}
            for arg, kind, _ in slots:
                if pools[kind]:
                    v = pools[kind].pop(0)
                    args[arg] = float(v) if kind == "number" else v
                elif (name, arg) in DEFAULTS:
                    args[arg] = DEFAULTS[(name, arg)]
            calls.append(ToolCall.make(name, args))
            if made >= cap:
                break
    dbs = by_kind["ratio_db"]
    if len(dbs) >= 2 and len(dbs) % 2 == 0:  # cascaded stages: (gain, nf) pairs, or (nf, gain)
        for g, n in ((0, 1), (1, 0)):
            stages = [{"gain": dbs[i + g], "nf": dbs[i + n]} for i in range(0, len(dbs), 2)]
            calls.append(ToolCall.make("cascade_noise_figure", {"stages": stages}))
    return calls


def toolbox() -> Toolbox:
    return Toolbox([*T.CALCULATORS, T.ANSWER])


def propose(state: AgentState, allowed: list[str]) -> list[ToolCall]:
    """Before a result: the calculator bindings; after one: its fields as answers."""
    if state.observations:
        _, _, value = state.observations[-1]
        data = json.loads(value) if isinstance(value, str) else value
        return [ToolCall.make("answer", {"quantity": k, "value": v}) for k, v in data.items()
                if isinstance(v, (int, float)) and math.isfinite(v)]
    calls = [c for c in bindings(state.task.prompt) if c.function.name in allowed]
    return calls or [ToolCall.make("answer", {"quantity": "unknown", "value": 0})]


def parse_number(text: str) -> float | None:
    m = _NUM.search(text.replace(",", ""))
    return float(m.group(0)) if m else None


def load_items(folder: str | Path) -> list[DesignItem]:
    path = Path(folder) / "design.jsonl"
    if not path.is_file():
        raise WorkbenchError(f"{path}: no design benchmark (agent.data for the rf pack is a "
                             "folder holding design.jsonl; build it with python -m "
                             "workbench.agent_packs.rf.generate)")
    return read_jsonl(path, DesignItem.model_validate)


def _direct(model, items: list[DesignItem], contexts: list[str] | None) -> list[dict]:
    convs = []
    for i, it in enumerate(items):
        user = it.question if contexts is None else \
            f"Reference:\n{contexts[i]}\n\nQuestion: {it.question}"
        convs.append([{"role": "system", "content": prompts()[0]},
                      {"role": "user", "content": user}])
    gens = model.generate(convs, GenerationParams(max_tokens=24))
    return [{"id": it.id, "family": it.family, "text": g.text,
             "prediction": parse_number(g.text), "tool_calls": 0, "errors": int(not g.ok)}
            for it, g in zip(items, gens, strict=True)]


def tools_setup(ac, *, temperature: float = 0.0, seed: int = 0,
                max_tokens: int = 160) -> AgentSetup:
    """The tools condition's agent: the calculators and the answer tool, the configured
    policy; `temperature` > 0 samples (a guided policy over its candidates' scores, a free
    one over tokens), as on-policy training's rollouts do."""
    box = toolbox()
    pol = GuidedPolicy(propose, final_names=box.final_names, temperature=temperature,
                       seed=seed) if ac.policy == "guided" else \
        FreePolicy(GenerationParams(max_tokens=max_tokens, temperature=temperature,
                                    seed=seed if temperature else None),
                   constrained=ac.policy == "free")
    return AgentSetup(toolbox=box, system=prompts()[1],
                      policy=pol, budget=Budget(max_steps=4, max_tool_calls=2),
                      errors=ac.errors, pack="rf",
                      parse_final=lambda t: {"value": v} if (v := parse_number(t)) is not None
                      else None)


FORMAT_PENALTY = 0.1  # per model mistake, and once for a run that ends without an answer


def design_task(item: DesignItem) -> AgentTask:
    """A design item as an agent task carrying the item, so `reward` can check the answer."""
    return AgentTask(item.id, item.question, metadata={"item": item.model_dump(mode="json")})


def reward(trajectory: AgentTrajectory, *, format_penalty: float = FORMAT_PENALTY) -> float:
    """The pack's reward for on-policy training: 1 when the run's answer is within the
    item's tolerance of the calculators' value (`bench.correct`), else 0; minus
    `format_penalty` for each mistake the model made (an unknown tool, arguments that break
    a schema, a reply with neither a call nor an answer) and once more when the run ended
    without an answer. The task was made by `design_task`."""
    item = DesignItem.model_validate(trajectory.metadata["item"])
    value = (trajectory.final or {}).get("value")
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
    return float(correct(number, item)) - format_penalty * (trajectory.errors
                                                            + (not trajectory.ok))


def _with_tools(model, items: list[DesignItem], ac) -> list[dict]:
    setup = tools_setup(ac)
    trajs = run_agents(model, [AgentTask(it.id, it.question) for it in items], setup,
                       desc="rf tools")
    return [{"id": it.id, "family": it.family, "prediction": (t.final or {}).get("value"),
             "tool": next((s.tool for s in t.steps if s.kind == "tool_call" and not s.error),
                          None), "tool_calls": t.tool_calls, "errors": t.errors,
             "trajectory": t.model_dump(mode="json")} for it, t in zip(items, trajs,
                                                                       strict=True)]


def evaluate(cfg, ctx):
    ac = cfg.agent
    wanted = conditions(ac, (*CONDITIONS, grpo.CONDITION)) if ac.conditions \
        else list(CONDITIONS)
    out = ctx.layout.folder("agent")
    out.mkdir(parents=True, exist_ok=True)
    folder = ctx.layout.artifact("agent", "rf_grpo").parent
    items, training = _items_and_training(cfg, ctx, wanted, folder)
    opened: list = []

    def base_model():
        """The model without an adapter, opened when a condition needs it."""
        if not opened:
            opened.append(open_chat_model(cfg.models.chat, cfg))
        return opened[0]

    key = (file_hash(Path(ac.data) / "design.jsonl"), cfg.models.chat.model_dump(mode="json"),
           ac.policy, ac.retriever, ac.search_k, cfg.corpus, ac.errors.model_dump())
    results: dict[str, list[dict]] = {}
    seconds: dict[str, float] = {}
    try:
        for cond in wanted:
            path = outputs_at("agent", out).path("rf", cond)

            def go(cond=cond, path=path) -> dict[str, Any]:
                t0 = time.perf_counter()
                write_jsonl(path, _condition_rows(cond, cfg, ctx, items, out, folder,
                                                  base_model))
                return {"seconds": round(time.perf_counter() - t0, 2)}

            inputs = (key, cond, [i.id for i in items]) + ((  # a new adapter: run again
                file_hash(folder / "adapter_model.safetensors"),) if cond in training else ())
            rec, _ = ctx.stages("agent").run("rf", inputs, go, part=cond)
            seconds[cond] = (rec.info or {}).get("seconds", rec.seconds)
            results[cond] = read_jsonl(path)
    finally:
        for m in opened:
            m.close()
    report = rf_report(out, items, results, seconds, model=cfg.models.chat.spec,
                       training=training)
    acc = report.accuracy()
    md = out / REPORT_MD
    return PipelineResult(
        pipeline="agent", run_dir=str(ctx.layout.root),
        outputs={"report": str(md)},
        figures={f"{c}_accuracy": round(v, 4) for c, v in acc.items()},
        message=f"{md}: accuracy within {percent(items[0].tolerance)} on "
                f"{len(items)} design items: " + ", ".join(f"{c} {percent(v)}"
                                                          for c, v in acc.items()))


def _items_and_training(cfg, ctx, wanted: list[str], folder: Path
                        ) -> tuple[list[DesignItem], dict[str, Any]]:
    """The items every condition is scored on, and (with tools+grpo) the training of its
    adapter in `folder`: {condition: the stage's record}."""
    ac = cfg.agent
    items = load_items(ac.data)
    if not items:
        raise WorkbenchError(f"{ac.data}/design.jsonl: no items")
    if grpo.CONDITION not in wanted:
        return (items[:ac.dev_limit] if ac.dev_limit else items), {}
    if "tools" not in wanted:
        ctx.log("warning: tools+grpo without tools in agent.conditions: no paired test "
                "against the prompted tools agent")
    # every condition on the test items; the rest train. A seeded shuffle before
    # agent.dev_limit: generated files come family by family
    split = grpo.split_items(items, ac.grpo.test_share, ac.grpo.dev_share, cfg.seed,
                             limit=ac.dev_limit)
    info = grpo.adapter(cfg, ctx, split, folder, tools_setup=tools_setup, task=design_task,
                        reward=reward, code=(FORMAT_PENALTY, prompts()))
    return split.test, {grpo.CONDITION: info}


def _condition_rows(cond: str, cfg, ctx, items: list[DesignItem], out: Path, folder: Path,
                    base_model: Callable[[], Any]) -> list[dict]:
    """One condition's rows: the tools agent (on the base model, or with the tools+grpo
    adapter in `folder` merged), or the model alone / with RAG."""
    from workbench.retrieval.search import Searcher

    ac = cfg.agent
    if cond == "tools":
        return _with_tools(base_model(), items, ac)
    if cond == grpo.CONDITION:
        tuned = shared.adapted_model(cfg, folder)
        try:
            return _with_tools(tuned, items, ac)
        finally:
            tuned.close()
    contexts = None
    if cond == "rag":
        sections, _ = load_sections(cfg.corpus)
        search = Searcher(sections, outputs_at("agent", out).path("rf_index"), ac.retriever,
                          log=ctx.log)
        hits = search([it.question for it in items], ac.search_k)
        contexts = ["\n\n".join(h.text for h in hs) for hs in hits]
    return _direct(base_model(), items, contexts)


def rf_report(out: Path, items: list[DesignItem], results: dict[str, list[dict]],
              seconds: dict[str, float], *, model: str,
              training: dict[str, dict[str, Any]] | None = None) -> RfReport:
    """The report of the conditions' rows: `rf_report.json` (an `RfReport`) and
    `rf_report.md` in `out`; returns the record."""
    from workbench.evaluate.stats import mcnemar_exact, wilson_interval

    by_id = {i.id: i for i in items}
    conds: dict[str, Any] = {}
    ok: dict[str, list[bool]] = {}
    for c, rows in results.items():
        ok[c] = [correct(r["prediction"], by_id[r["id"]]) for r in rows]
        k, n = sum(ok[c]), len(rows)
        fams: dict[str, list[bool]] = defaultdict(list)
        for r, good in zip(rows, ok[c], strict=True):
            fams[r["family"]].append(good)
        conds[c] = {"n": n, "accuracy": k / n if n else 0.0,
                    "accuracy_ci95": list(wilson_interval(k, n)),
                    "answered": sum(r["prediction"] is not None for r in rows),
                    "tool_calls_mean": sum(r["tool_calls"] for r in rows) / max(n, 1),
                    "errors": sum(r["errors"] for r in rows),
                    "seconds_per_item": seconds.get(c, 0.0) / max(n, 1),
                    "by_family": {f: f"{sum(v)}/{len(v)}" for f, v in sorted(fams.items())}}
        if c.startswith("tools"):
            conds[c]["tool_chosen"] = dict(Counter(r.get("tool") for r in rows))
            conds[c]["right_tool"] = sum(r.get("tool") == by_id[r["id"]].tool for r in rows)
    tests = {}
    for a, b in (("alone", "tools"), ("rag", "tools"), ("alone", "rag"),
                 ("tools", "tools+grpo")):
        if a in ok and b in ok:
            tests[f"{b} vs {a}"] = {"p": mcnemar_exact(ok[a], ok[b]),
                                    "delta": (sum(ok[b]) - sum(ok[a])) / len(items)}
    report = RfReport(items=len(items), model=model, conditions=conds, paired=tests,
                      training=training or None)
    atomic_write_text(out / REPORT_JSON, report_json(report))
    atomic_write_text(out / REPORT_MD, report_markdown(report, tolerance=items[0].tolerance))
    return report


def run_inputs(cfg, inputs: list[str], log=print) -> list[AgentTrajectory]:
    """Run the tools agent on a few questions (benchmark ids or free text)."""
    by_id = {i.id: i for i in load_items(cfg.agent.data)}
    items = [by_id[x] if x in by_id else DesignItem(id=f"input-{k}", question=x, answer=0.0,
                                                     quantity="", tool="", family="input")
             for k, x in enumerate(inputs)]
    rows = _with_tools(open_chat_model(cfg.models.chat, cfg), items, cfg.agent)
    return [AgentTrajectory.model_validate(r["trajectory"]) for r in rows]
