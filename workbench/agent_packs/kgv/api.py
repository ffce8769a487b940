"""The KGV job: closed-book, single-turn RAG, the agent, the teacher's trajectories, the LoRA
student, and one report comparing them with intervals (by seen vs long-tail predicates)."""

from __future__ import annotations

import json
import random
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from workbench.agent_packs import grpo
from workbench.agent_packs.api import conditions
from workbench.agent_packs.kgv import graph as G
from workbench.agent_packs.kgv.evidence import (
    Evidence,
    folder_evidence,
    index_evidence,
    index_key,
    searcher,
)
from workbench.agent_packs.kgv.metrics import prediction, route
from workbench.agent_packs.kgv.pack import KGClaim, KgvAgent, load_claims, settings
from workbench.agent_packs.kgv.report import REPORT_JSON, REPORT_MD, write_report
from workbench.agent_packs.kgv.reward import FORMAT_PENALTY, SEARCH_COST, reward
from workbench.agents.export import sft_examples
from workbench.agents.runner import (
    AgentSetup,
    Budget,
    FreePolicy,
    GuidedPolicy,
    run_agents,
    scaffold,
)
from workbench.agents.steps import AgentTrajectory
from workbench.corpus import corpus_hash
from workbench.domain_packs import load_pack
from workbench.errors import ConfigError, WorkbenchError
from workbench.io import atomic_write_text, read_jsonl, write_jsonl
from workbench.models.base import GenerationParams
from workbench.models.factory import open_chat_model
from workbench.registry import PipelineResult
from workbench.runs import Outputs, RunLayout, file_hash, hash_inputs, outputs_at
from workbench.text import percent
from workbench.train.config import TrainConfig
from workbench.train.recipe import train as train_lora

if TYPE_CHECKING:
    from workbench.agent_packs.kgv.report import KgvReport

BASELINES = ("closed_book", "rag", "agent")
CONDITIONS = (*BASELINES, "agent_sft")  # the default set; agent_grpo on request
GRPO = "agent_grpo"  # the agent trained with GRPO against `reward` (AgentKGV's second stage)


def load_data(folder: str | Path, pack: str = "kgv") -> tuple[list[KGClaim], list[Any]]:
    """(claims, evidence entries) of a KGV data folder: claims.jsonl + documents.jsonl in the
    pack's schema, or a graph with claims and documents as they come (`graph.py`)."""
    claims, docs, _ = load_kg(folder, pack)
    return claims, docs


def load_kg(folder: str | Path, pack: str = "kgv", index: str | Path | None = None
            ) -> tuple[list[KGClaim], list[Any], dict[str, Any]]:
    """(claims, evidence entries (none for a prebuilt index), wordings of the graph's own
    predicates)."""
    kg = read_kg(folder, pack, index)
    return kg.claims, kg.evidence.docs or [], kg.extra


@dataclass
class KG:
    """A KGV data folder read: its claims, its evidence, the graph's own wordings."""

    claims: list[KGClaim]
    evidence: Evidence
    extra: dict[str, Any]


def read_kg(folder: str | Path, pack: str = "kgv", index: str | Path | None = None) -> KG:
    """The claims of a KGV data folder, and its evidence: the built index `index` when
    given, else what the folder holds (`evidence.py`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkbenchError(f"{folder}: not a folder (agent.data for kgv: a folder with "
                             "claims and a graph or documents)")
    linked = [p.name for p in folder.iterdir() if p.is_symlink()]
    if linked:  # only regular files inside the folder the user named are opened
        raise WorkbenchError(f"{folder}: {', '.join(sorted(linked)[:3])} is a link; copy "
                             "the file into the folder instead (links are not followed)")
    built = index_evidence(index) if index is not None else None
    gfile = G.graph_file(folder)
    if gfile is None and (folder / "claims.jsonl").is_file() and \
            (folder / "documents.jsonl").is_file():  # the pack's own shape
        return KG(load_claims(folder / "claims.jsonl"),
                  built or folder_evidence(folder, None, {}), {})
    cfile = next((folder / n for n in ("claims.tsv", "claims.txt", "claims.jsonl")
                  if (folder / n).is_file()), None)
    if cfile is None:
        raise WorkbenchError(f"{folder}: no claims.tsv, claims.txt or claims.jsonl (agent.data "
                             "for kgv: claims, and a graph (.nt, .ttl, .tsv) or documents)")
    graph = G.read_graph(gfile) if gfile else None
    pack_words = settings(load_pack(pack)).predicates
    extra = G.graph_wordings(graph, pack_words) if graph else {}
    words = SimpleNamespace(settings=SimpleNamespace(predicates={**extra, **pack_words}))
    claims = G.read_claims(cfile, graph, lambda text: read_claim(text, words),
                           predicates={*extra, *pack_words})
    return KG(claims, built or folder_evidence(folder, graph, {**extra, **pack_words}), extra)


def select(claims: list[KGClaim], part: str, limit: int | None, seed: int) -> list[KGClaim]:
    """Claims of one part, round-robin over (split, label) groups so a limit stays balanced."""
    groups: dict[tuple[str, str | None], list[KGClaim]] = defaultdict(list)
    for c in claims:
        if c.part == part:
            groups[(c.split, c.label)].append(c)
    rng = random.Random(seed)
    for g in groups.values():
        rng.shuffle(g)
    out: list[KGClaim] = []
    keys = sorted(groups)
    while any(groups[k] for k in keys) and (limit is None or len(out) < limit):
        for k in keys:
            if groups[k] and (limit is None or len(out) < limit):
                out.append(groups[k].pop())
    return out


def make_agent(cfg, folder: Path, log=print, kg: KG | None = None) -> KgvAgent:
    """The agent over the configured evidence (`kg`: the data folder already read)."""
    ac = cfg.agent
    kg = kg or read_kg(ac.data, ac.pack, ac.index)
    ev = kg.evidence
    search = searcher(ev, folder / "index", ac.retriever, log=log)
    return KgvAgent(load_pack(ac.pack), search, k=ac.search_k,
                    entry_ids=None if ev.docs is None else {i for d in ev.docs
                                                               for i in (d.id, d.doc_id)},
                    wordings=kg.extra, cites=ev.cites, source=ev.describe(ac.retriever))


def make_setup(agent: KgvAgent, ac, condition: str, *, policy: str | None = None,
               temperature: float = 0.0, seed: int = 0, max_tokens: int = 120) -> AgentSetup:
    pack = agent.pack
    box = agent.toolbox()
    common = {"toolbox": box, "system": pack.agent.system, "pack": pack.name,
              "prompt_version": pack.prompt_version, "errors": ac.errors,
              "parse_final": agent.parse_final}

    def guided(propose):
        return GuidedPolicy(propose, temperature=temperature, seed=seed,
                            calibrate=ac.calibrate, final_names=box.final_names)

    if condition == "closed_book":
        return AgentSetup(policy=guided(agent.propose_closed_book),
                          budget=Budget(max_steps=1, max_tool_calls=0), **common)
    if condition == "rag":
        return AgentSetup(policy=guided(agent.propose_rag),
                          budget=Budget(max_steps=3, max_tool_calls=1), **common)
    kind = policy or ac.policy
    pol = guided(agent.propose) if kind == "guided" \
        else FreePolicy(GenerationParams(max_tokens=max_tokens, temperature=temperature,
                                         seed=seed),
                        constrained=kind == "free")
    return AgentSetup(policy=pol, budget=ac.budget, scaffold=scaffold(ac.scaffold), **common)


def run_condition(model, claims: list[KGClaim], agent: KgvAgent, setup: AgentSetup,
                  path: Path, *, chunk: int, log=print, desc: str = "agent", key: Any = None
                  ) -> list[AgentTrajectory]:
    """Run the claims not yet in `path`, a chunk at a time, rewriting `path` after each
    chunk: a killed run re-run finishes the rest. `key` names what produced the file (the
    stage's inputs): a file made under another key is started over; runs that a backend
    failure stopped are run again."""
    stamp = path.with_suffix(".key")
    want = hash_inputs(key)
    if path.exists() and (not stamp.exists() or stamp.read_text().strip() != want):
        path.unlink()
        path.with_suffix(".timing.json").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(stamp, want + "\n")
    done = {t.task_id: t for t in read_jsonl(path, AgentTrajectory.model_validate)
            if t.stop != "backend_error"} if path.exists() else {}
    todo = [c for c in claims if c.id not in done]
    if done:
        log(f"{path.name}: {len(done)} done, {len(todo)} to run")
    timing = path.with_suffix(".timing.json")
    wall = json.loads(timing.read_text()) if timing.exists() and done else \
        {"seconds": 0.0, "claims": 0}
    for lo in range(0, len(todo), chunk):
        part = todo[lo:lo + chunk]
        t0 = time.perf_counter()
        for t in run_agents(model, [agent.task(c) for c in part], setup, desc=desc):
            done[t.task_id] = agent.annotate(t)
        write_jsonl(path, [done[c.id] for c in claims if c.id in done])
        wall = {"seconds": round(wall["seconds"] + time.perf_counter() - t0, 2),
                "claims": wall["claims"] + len(part)}
        atomic_write_text(timing, json.dumps(wall) + "\n")
    return [done[c.id] for c in claims]


def _cap(kept: list[AgentTrajectory], key, share: float) -> list[AgentTrajectory]:
    """Cut the majority group (by `key`) to `share` of the result, when there are two."""
    groups: dict[str, list[AgentTrajectory]] = defaultdict(list)
    for t in kept:
        groups[key(t)].append(t)
    if len(groups) == 2 and share < 1:
        major, minor = sorted(groups, key=lambda g: -len(groups[g]))
        cap = int(share * len(groups[minor]) / (1 - share))
        groups[major] = groups[major][:max(cap, 1)]
    return sorted((t for ts in groups.values() for t in ts), key=lambda t: t.task_id)


def choose_teacher(trajs: list[AgentTrajectory], max_route_share: float
                   ) -> list[AgentTrajectory]:
    """Per claim the correct run with the fewest searches; then the majority route, and the
    majority verdict, are each cut to `max_route_share` of what is kept (so the student
    learns neither "always search" nor "always SUPPORTED")."""
    best: dict[str, AgentTrajectory] = {}
    for t in trajs:
        if not t.ok or t.errors or prediction(t) != t.metadata["claim"]["label"]:
            continue
        cur = best.get(t.task_id)
        if cur is None or t.calls_to("search") < cur.calls_to("search"):
            best[t.task_id] = t
    kept = sorted(best.values(), key=lambda t: t.task_id)
    kept = _cap(kept, route, max_route_share)
    return _cap(kept, prediction, max_route_share)


def _open(cfg, spec_model=None, adapter: Path | None = None):
    mc = spec_model or cfg.models.chat
    if adapter is not None:
        mc = mc.model_copy(update={"options": {**mc.options, "adapter": str(adapter)}})
    return open_chat_model(mc, cfg)


@dataclass
class _Evaluation:
    """What the stages of one `evaluate` share: the folder, the claims, the agent, the parts
    of every stage's key, and the base model, opened at most once and only when a stage has
    to run (an up-to-date re-run loads no model)."""

    cfg: Any
    ctx: Any
    out: Path
    dev: list[KGClaim]
    train: list[KGClaim]
    agent: KgvAgent
    stages: Any
    pack_key: tuple
    data_key: tuple
    model_key: dict
    model: Any = None

    @property
    def ac(self):
        return self.cfg.agent

    @property
    def files(self) -> Outputs:
        """The agent pipeline's declared files in `out`."""
        return outputs_at("agent", self.out)

    def base_model(self):
        self.model = self.model or _open(self.cfg)
        return self.model

    def agent_settings(self) -> dict[str, Any]:
        """The agent's settings that change its runs (part of the stage keys)."""
        return self.ac.model_dump(mode="json", include={"policy", "scaffold", "budget",
                                                         "errors"})

    def run_claims(self, model, claims: list[KGClaim], setup: AgentSetup, path: Path, *,
                   desc: str, key: Any) -> list[AgentTrajectory]:
        return run_condition(model, claims, self.agent, setup, path, chunk=self.ac.chunk,
                             log=self.ctx.log, desc=desc, key=key)


def evaluate(cfg, ctx):
    wanted = conditions(cfg.agent, (*CONDITIONS, GRPO)) if cfg.agent.conditions \
        else list(CONDITIONS)
    ev = _start(cfg, ctx)
    results = _run_baselines(ev, wanted)
    teacher_info: dict[str, Any] = {}
    training: dict[str, Any] = {}
    if "agent_sft" in wanted:
        teacher_info, results["agent_sft"] = _run_agent_sft(ev)
    if GRPO in wanted:
        if "agent" not in wanted:
            ctx.log("warning: agent_grpo without agent in agent.conditions: no paired test "
                    "against the agent it was trained from")
        training[GRPO], results[GRPO] = _run_agent_grpo(ev)
    report = write_report(ev.out, results, teacher_info, dev=len(ev.dev), train=len(ev.train),
                          model=cfg.models.chat.spec, searches=ev.agent.searches,
                          evidence=ev.agent.source, training=training)
    return _pipeline_result(ev, report, results)


def _start(cfg, ctx) -> _Evaluation:
    """The agent folder (emptied with --fresh), the labelled dev and train claims, the agent,
    and the parts of the stage keys that every condition shares."""
    ac = cfg.agent
    out = ctx.layout.folder("agent")
    trajectories = ctx.layout.artifact("agent", "agent").parent  # every condition's runs
    if getattr(ctx, "fresh", False):  # --fresh: no claim is kept from an earlier run
        import shutil

        shutil.rmtree(trajectories, ignore_errors=True)
    kg = read_kg(ac.data, ac.pack, ac.index)
    claims = kg.claims
    unlabelled = [c.id for c in claims if c.label is None]
    if unlabelled:
        raise WorkbenchError(f"{ac.data}: {len(unlabelled)} claims have no label (first: "
                             f"{unlabelled[0]}); evaluation needs SUPPORTED or REFUTED for "
                             "each (`agent run kgv` verifies unlabelled ones)")
    dev = select(claims, "dev", ac.dev_limit, cfg.seed)
    train = select(claims, "train", ac.train_limit, cfg.seed)
    if not dev:
        raise WorkbenchError(f"{ac.data}: no claims with part 'dev' to evaluate")
    agent = make_agent(cfg, out, log=ctx.log, kg=kg)  # a bad index stops here, before runs
    trajectories.mkdir(parents=True, exist_ok=True)
    data_key: tuple = (corpus_hash(ac.data), ac.retriever, ac.search_k)
    if ac.index is not None:  # a run made without an index keeps its key
        data_key += (index_key(kg.evidence),)
    return _Evaluation(
        cfg=cfg, ctx=ctx, out=out, dev=dev, train=train, agent=agent,
        pack_key=(agent.pack.prompt_version, agent.pack.agent.model_dump(mode="json")),
        data_key=data_key,
        model_key=cfg.models.chat.model_dump(mode="json"), stages=ctx.stages("agent"))


def _run_baselines(ev: _Evaluation, wanted) -> dict[str, list[AgentTrajectory]]:
    """Closed-book, RAG and the agent on the dev claims, each its own stage."""
    ac = ev.ac
    results: dict[str, list[AgentTrajectory]] = {}
    for cond in (c for c in BASELINES if c in wanted):
        path = ev.files.path(cond)
        setup = make_setup(ev.agent, ac, cond)
        key = (ev.data_key, ev.pack_key, ev.model_key, [c.id for c in ev.dev], cond,
               ac.calibrate, ac.chunk,
               ev.agent_settings() if cond == "agent" else ac.errors.model_dump())
        ev.stages.run(cond, key, lambda p=path, s=setup, c=cond, k=key: {"n": len(ev.run_claims(
            ev.base_model(), ev.dev, s, p, desc=c, key=k))})
        results[cond] = read_jsonl(path, AgentTrajectory.model_validate)
    return results


def _run_agent_sft(ev: _Evaluation) -> tuple[dict[str, Any], list[AgentTrajectory]]:
    """The teacher's runs on the train claims, the LoRA student trained on the kept ones, and
    the student as the agent on the dev claims: (teacher and student info, its runs)."""
    ac = ev.ac
    files = ev.files
    spath, adapter = files.path("sft"), files.path("adapter").parent
    teach_key = (ev.data_key, ev.pack_key, ev.model_key, [c.id for c in ev.train],
                 ac.teacher.model_dump(mode="json"), ac.calibrate, ac.chunk, ev.agent_settings())
    rec, _ = ev.stages.run("teacher", teach_key, lambda: _teach(ev, teach_key, spath))
    teacher_info = dict(rec.info or {})
    rec, _ = ev.stages.run("student", (file_hash(spath), ac.student.model_dump(mode="json"),
                                       ev.model_key, ev.cfg.seed),
                           lambda: _train_student(ev, spath, adapter))
    teacher_info["student"] = dict(rec.info or {})
    path = files.path("agent_sft")
    sft_key = (ev.data_key, ev.pack_key, ev.model_key, [c.id for c in ev.dev],
               file_hash(adapter / "adapter_model.safetensors"), ac.calibrate, ac.chunk,
               ev.agent_settings())
    ev.stages.run("agent_sft", sft_key, lambda: {"n": len(ev.run_claims(
        _open(ev.cfg, adapter=adapter), ev.dev, make_setup(ev.agent, ac, "agent"), path,
        desc="agent_sft", key=sft_key))})
    return teacher_info, read_jsonl(path, AgentTrajectory.model_validate)


def _teach(ev: _Evaluation, teach_key: tuple, spath: Path) -> dict[str, Any]:
    """The teacher's sampled runs (teacher.jsonl) and the SFT examples of the runs kept."""
    t = ev.ac.teacher
    tmodel = _open(ev.cfg, t.model) if t.model else ev.base_model()
    allruns: list[AgentTrajectory] = []
    for i in range(t.samples):
        setup = make_setup(ev.agent, ev.ac, "agent", policy=t.policy,
                           temperature=t.temperature, seed=ev.cfg.seed + i)
        runs = ev.run_claims(tmodel, ev.train, setup,
                             ev.files.path("teacher_run", str(i)),
                             desc=f"teacher {i + 1}", key=(teach_key, i))
        allruns += [r.model_copy(update={"id": f"{r.id}:s{i}"}) for r in runs]
    write_jsonl(ev.files.path("teacher"), allruns)
    kept = choose_teacher(allruns, t.max_route_share)
    examples = sft_examples(kept)
    if not examples:
        raise WorkbenchError("the teacher got no training claim right: nothing to "
                             "train the student on (more samples, or a stronger "
                             "teacher in agent.teacher.model)")
    write_jsonl(spath, examples)
    return {"runs": len(allruns), "kept": len(examples),
            "routes": {r: sum(route(k) == r for k in kept)
                       for r in ("parametric", "search")}}


def _train_student(ev: _Evaluation, spath: Path, adapter: Path) -> dict[str, Any]:
    s = ev.ac.student
    tc = TrainConfig(data=str(spath), max_steps=s.max_steps, batch_size=s.batch_size,
                     learning_rate=s.learning_rate, max_length=s.max_length,
                     lora=s.lora, eval_fraction=0.0)
    r = train_lora(tc, model_spec=ev.cfg.models.chat.spec, output=adapter,
                   seed=ev.cfg.seed, log=ev.ctx.log)
    losses = [m["loss"] for m in r.metrics if "loss" in m]
    return {"steps": r.steps, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None}


def _run_agent_grpo(ev: _Evaluation) -> tuple[dict[str, Any], list[AgentTrajectory]]:
    """The agent trained with GRPO on the training claims' rollouts against the pack's
    reward (a right verdict, less `SEARCH_COST` a search and `FORMAT_PENALTY` a mistake),
    the adapter chosen by the greedy reward on `agent.grpo.dev_share` of the training claims,
    then the agent with it on the dev claims: (the training's record, its runs)."""
    ac = ev.ac
    folder = ev.ctx.layout.artifact("agent", "kgv_grpo").parent
    claims = list(ev.train)
    random.Random(ev.cfg.seed).shuffle(claims)
    n_dev = round(len(claims) * ac.grpo.dev_share)
    choose, train = claims[:n_dev], claims[n_dev:]
    if len(train) < 2:
        raise ConfigError([f"agent.grpo: {len(claims)} training claims leave {len(train)} to "
                           f"train agent_grpo on after {n_dev} dev claims (raise "
                           "agent.train_limit or lower agent.grpo.dev_share)"])

    def setup(*, temperature: float, seed: int, max_tokens: int) -> AgentSetup:
        return make_setup(ev.agent, ac, "agent", temperature=temperature, seed=seed,
                          max_tokens=max_tokens)

    info = grpo.train(
        ev.cfg, ev.ctx, "kgv_grpo", folder,
        train_tasks=[ev.agent.task(c) for c in train],
        dev_tasks=[ev.agent.task(c) for c in choose],
        counts={"train_items": len(train), "dev_items": len(choose),
                "test_items": len(ev.dev)},
        items_key=([c.id for c in train], [c.id for c in choose]),
        agent_setup=setup, reward=reward,
        code=(ev.data_key, ev.pack_key, ac.calibrate, ev.agent_settings(), SEARCH_COST,
              FORMAT_PENALTY))
    path = ev.files.path(GRPO)
    key = (ev.data_key, ev.pack_key, ev.model_key, [c.id for c in ev.dev],
           file_hash(folder / "adapter_model.safetensors"), ac.calibrate, ac.chunk,
           ev.agent_settings())

    def go() -> dict[str, Any]:
        tuned = grpo.adapted_model(ev.cfg, folder)
        try:
            return {"n": len(ev.run_claims(tuned, ev.dev, make_setup(ev.agent, ac, "agent"),
                                           path, desc=GRPO, key=key))}
        finally:
            tuned.close()

    ev.stages.run(GRPO, key, go)
    return info, read_jsonl(path, AgentTrajectory.model_validate)


def _pipeline_result(ev: _Evaluation, report: KgvReport, results: dict[str, Any]):
    out = ev.out
    best = report.macro_f1()
    line = ", ".join(f"{c} {percent(v)}" for c, v in best.items())
    return PipelineResult(
        pipeline="agent", run_dir=str(ev.ctx.layout.root),
        outputs={"report": str(out / REPORT_MD), "report_json": str(out / REPORT_JSON),
                 **{c: str(ev.files.path(c)) for c in results}},
        figures={f"{c}_macro_f1": round(v, 4) for c, v in best.items()},
        message=f"{out / REPORT_MD}: macro-F1 on {len(ev.dev)} dev claims: {line} "
                f"(evidence: {ev.agent.source})")


def read_claim(text: str, agent: KgvAgent | SimpleNamespace) -> tuple[str, str, str] | None:
    """(subject, predicate, object) of a sentence written in one of the pack's wordings
    ("Oak is a kind of tree."), or None. `agent`: the agent, or a namespace with its
    `settings.predicates` (the wordings, before an agent is made)."""
    sentence = text.strip().rstrip(".").strip()
    for pred, w in agent.settings.predicates.items():
        for tpl in (w.verbal, *w.paraphrases):
            pattern = re.escape(tpl).replace(r"\{s\}", "(?P<s>.+?)").replace(r"\{o\}",
                                                                             "(?P<o>.+?)")
            m = re.fullmatch(pattern, sentence, flags=re.IGNORECASE)
            if m:
                return m.group("s").strip(), pred, m.group("o").strip()
    return None


def parse_input(text: str, claims: dict[str, KGClaim],
                agent: KgvAgent | SimpleNamespace | None = None) -> KGClaim:
    """A claim id from the data, `subject | predicate | object`, a sentence in one of the
    pack's wordings ("Oak is a kind of tree.", read as its triple), or any other sentence
    (verified as a whole)."""
    if text in claims:
        return claims[text]
    parts = [p.strip() for p in text.split("|")]
    form = "triple"
    if len(parts) != 3 and agent is not None and (triple := read_claim(text, agent)):
        parts, form = list(triple), "wording"
    if len(parts) == 3 and all(parts):
        return KGClaim.model_validate({"id": "input-" + "-".join(parts)[:40],
                                       "subject": {"id": "s", "label": parts[0]},
                                       "predicate": parts[1],
                                       "object": {"id": "o", "label": parts[2]},
                                       "form": form, **({"text": text} if form == "wording"
                                                        else {})})
    if len(text.split()) < 3 or "|" in text:
        raise WorkbenchError(f"{text!r}: give a claim id (e.g. kgv-0002), 'subject | "
                             "predicate | object', or a sentence of three words or more "
                             "('Oak is a kind of tree.')")
    slug = "-".join(re.findall(r"[a-z0-9]+", text.lower()))[:40]
    return KGClaim.model_validate({"id": f"input-{slug}", "text": text.strip(),
                                   "form": "sentence"})


def run_inputs(cfg, inputs: list[str], log=print) -> list[AgentTrajectory]:
    """Run the agent on a few claims (ids or triples) and return the trajectories."""
    kg = read_kg(cfg.agent.data, cfg.agent.pack, cfg.agent.index)
    by_id = {c.id: c for c in kg.claims}
    # every input is read before the index is built: a bad one writes nothing
    pack_words = settings(load_pack(cfg.agent.pack)).predicates
    wordings = SimpleNamespace(settings=SimpleNamespace(predicates={**kg.extra, **pack_words}))
    todo = [parse_input(x, by_id, wordings) for x in inputs]
    folder = RunLayout.of(cfg).folder("agent")
    agent = make_agent(cfg, folder, log=log, kg=kg)
    return [agent.annotate(t) for t in run_agents(_open(cfg), [agent.task(c) for c in todo],
                                                  make_setup(agent, cfg.agent, "agent"))]

