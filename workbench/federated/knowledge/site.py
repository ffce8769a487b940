"""Data-agent know-how that can leave a site: workflows abstracted from verified plans.

A verified plan is a sequence of grammar moves (operation, table, measure, grouping, literal
conditions...). Its *workflow* keeps what transfers and drops what identifies: the operation,
the aggregate, the grouping kind, the ranking direction, the shape of each literal condition
(comparison, how many joins away) — never a table, column or value. A workflow is keyed by
the task family (the task's category), e.g.

    group_rank: op=top -> group=column -> measure=count -> direction=desc

`WorkflowGuide` reweights the grammar's options toward the next step of the workflows that
match the plan so far, so a site that holds good workflows verifies with fewer iterations.
`DataAgentSite` is one site: its own environment (a SQLite file or table folder), its task
pool, its scaffold (a search strategy over the same grammar and model), and the ExpeL-style
operations it proposes after a round (ADD / AGREE / EDIT / REMOVE with counts). Its task
pool and search come from `workbench.datatasks`, its environment from `workbench.dataenv`.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.dataenv.env import open_env, sample_environment
from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.generators import GrammarGenerator
from workbench.datatasks.grammar import Move
from workbench.datatasks.poolfiles import load_pool, save_pool
from workbench.datatasks.priors import UniformPrior
from workbench.datatasks.tasks import build_pool
from workbench.errors import WorkbenchError
from workbench.federated.config import parse_agent_settings
from workbench.federated.knowledge.agent import DataAgent
from workbench.federated.knowledge.workflows import (
    Outcome,
    abstract_step,
    step_text,
    workflow_of,
    workflow_text,
)
from workbench.io import atomic_write_json
from workbench.models.backends import load_model
from workbench.records import KnowledgeOp

# a site's scaffold (site.json's "scaffold") -> its search strategy over the same grammar, prior
# and environment (the prompted agent runs the scaffold of the same name instead:
# agent.LOOP_SCAFFOLD, agents.runner.SCAFFOLDS)
SEARCH_STRATEGIES: dict[str, dict[str, Any]] = {
    "react": {"strategy": "greedy"},  # one step at a time, best option first, no lookahead
    "plan": {"strategy": "sample"},  # whole plans sampled from the prior, best kept
    "reflexion": {"strategy": "mcts", "reflection_penalty": 0.5},  # failures steer the tree
}


# the experiments' harmful workflow: answer a lookup by counting rows (never right)
POISON = ("op=count", "lit=conds:gt")


def contrast_insight(family: str, wins: Sequence[Sequence[str]],
                     fails: Sequence[Sequence[str]], margin: float = 0.5) -> str | None:
    """ExpeL's comparison of successes with failures, without an LLM: the step found in the
    largest share of the family's verified plans beyond its share in the failed ones (and
    the reverse), when the gap is at least `margin`; None when nothing separates them."""
    def share(step: str, flows: Sequence[Sequence[str]]) -> float:
        return sum(step in f for f in flows) / len(flows)

    steps = sorted({s for f in [*wins, *fails] for s in f})
    gap = {s: share(s, wins) - share(s, fails) for s in steps}
    use = max(steps, key=lambda s: (gap[s], s), default=None)
    avoid = min(steps, key=lambda s: (gap[s], s), default=None)
    if use is None or gap[use] < margin:
        return None
    text = f"For {family.replace('_', ' ')} questions, right plans: " \
           f"{step_text(use, wire=True)}."
    if avoid is not None and -gap[avoid] >= margin:
        text += f" Wrong plans: {step_text(avoid, wire=True)}."
    return text[:200]


class WorkflowGuide:
    """Multiplies the prior of options that continue a known workflow of the task's family
    by `boost` (the plan so far must match the workflow's first steps)."""

    def __init__(self, units: Sequence[dict], boost: float = 8.0):
        self.by_family: dict[str, list[tuple[str, ...]]] = defaultdict(list)
        for u in units:
            if u.get("kind") == "workflow" and u.get("steps"):
                self.by_family[u["family"]].append(tuple(u["steps"]))
        self.boost = boost

    def __call__(self, search, path: tuple, moves: list[Move], w: list[float]) -> list[float]:
        flows = self.by_family.get(search.task.category)
        if not flows:
            return w
        done = workflow_of(search.moves(path))
        expected = {f[len(done)] for f in flows if len(f) > len(done) and f[:len(done)] == done}
        if not expected:
            return w
        return [x * (self.boost if abstract_step(m) in expected else 1.0)
                for x, m in zip(w, moves, strict=True)]


# --- a site -----------------------------------------------------------------------------------

class DataAgentSite:
    """One site of the knowledge track. `folder/site.json` names the environment, the
    scaffold and, for experiments, canaries planted in the data and a `poison` flag."""

    def __init__(self, folder: str | Path, *, iterations: int = 8, seed: int = 0,
                 agent: str = "grammar", agent_settings: dict | None = None):
        self.folder = Path(folder)
        try:
            self.meta = json.loads((self.folder / "site.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise WorkbenchError(f"{self.folder / 'site.json'}: {e}") from None
        self.name = self.meta.get("name", self.folder.name)
        self.scaffold = self.meta.get("scaffold", "reflexion")
        if self.scaffold not in SEARCH_STRATEGIES:
            raise WorkbenchError(f"{self.folder / 'site.json'}: scaffold "
                                 f"{self.scaffold!r}; use {', '.join(SEARCH_STRATEGIES)}")
        self.env = open_env(str(self.meta["env"]))
        pool_file = self.folder / "tasks.jsonl"
        if not pool_file.exists():
            save_pool(build_pool(self.env), pool_file)
        self.pool = load_pool(pool_file)
        self.iterations, self.seed = iterations, seed
        self.canaries = list(self.meta.get("canaries", []))
        self.poison = bool(self.meta.get("poison", False))
        # grammar: the scaffold is a search strategy over the grammar, units reweight its
        # prior; prompted: a chat model runs the scaffold with the units in its prompt
        if agent not in ("grammar", "prompted"):
            raise WorkbenchError(f"knowledge agent {agent!r}: use grammar or prompted")
        self.agent = agent
        self.agent_settings = parse_agent_settings(agent_settings)
        self._agents: dict[str, Any] = {}

    @property
    def families(self) -> dict[str, int]:
        return dict(Counter(t.category for t in self.pool.tasks))

    def tasks(self, part: str, limit: int | None = None) -> list:
        """learn: training tasks the site works on each round; dev: the slice its A/B gate
        measures on; test: held-out tasks for the report."""
        train = self.pool.split("train")
        if part == "learn":
            out = train[::2]
        elif part == "dev":
            out = train[1::2]
        elif part == "test":
            out = self.pool.split("held_out") or train[1::2]
        else:
            raise ValueError(part)
        return out[:limit] if limit else out

    @property
    def identifiers(self) -> list[str]:
        """Names of this site's data that must never leave it in a unit's text."""
        p = self.env.profile
        names = list(p.table_names)
        for t in p.tables:
            names += [c.name for c in t.columns]
        return names + [e for t in self.pool.tasks for e in t.entities]

    def attempt(self, tasks: Sequence, units: Sequence[dict], *, scaffold: str | None = None,
                iterations: int | None = None, boost: float = 8.0) -> list[Outcome]:
        if self.agent == "prompted":
            return self.prompted(scaffold or self.scaffold).attempt(tasks, units)
        from workbench.datatasks.explore import explore_task

        cfg = ExploreConfig(prior="uniform", iterations=iterations or self.iterations,
                            stop_after=1, seed=self.seed,
                            **SEARCH_STRATEGIES[scaffold or self.scaffold])
        guide = WorkflowGuide(units, boost=boost)
        gen = GrammarGenerator(UniformPrior(), cfg, guide=guide)
        out = []
        for t in tasks:
            _tree, search = explore_task(t, self.env, gen, config=cfg)
            paths = list(search.verified_sql.values())
            flow = workflow_of(search.moves(paths[0])) if paths else ()
            texts = [t.question, t.program] + [r.get("sql") or "" for r in search.reflections]
            out.append(Outcome(t.id, t.category, bool(paths), search.ledger.iterations,
                               search.ledger.executions, flow,
                               guided=t.category in guide.by_family, texts=texts))
        return out

    def prompted(self, scaffold: str):
        """The site's prompted agent for a scaffold (its outcomes cached in the site folder:
        the same prompt is never run twice, across rounds and runs)."""
        if scaffold not in self._agents:
            self._agents[scaffold] = DataAgent(
                self.env, chat_model(self.agent_settings.model), scaffold,
                self.agent_settings, seed=self.seed,
                cache=self.folder / "agent_outcomes.jsonl")
        return self._agents[scaffold]

    def propose(self, outcomes: Sequence[Outcome], view: Sequence[dict], *,
                min_support: int = 2) -> list[KnowledgeOp]:
        """ExpeL-style operations from this round's outcomes against the current view:
        AGREE with a unit its verified plans followed; ADD a workflow seen verified at least
        `min_support` times that no unit holds; EDIT a unit of the family when another
        workflow with the same operation won more often; REMOVE a unit whose family failed
        under guidance at least `min_support` times with no verified plan following it."""
        by_fam: dict[str, Counter] = defaultdict(Counter)
        failed: Counter = Counter()
        for o in outcomes:
            if o.verified:
                by_fam[o.family][o.workflow] += 1
            elif o.guided:
                failed[o.family] += 1
        held = {(u["family"], tuple(u["steps"])): u for u in view if u.get("kind") == "workflow"}
        ops: list[KnowledgeOp] = []
        for fam, flows in sorted(by_fam.items()):
            for flow, n in flows.most_common():
                if (fam, flow) in held:
                    ops.append(KnowledgeOp(op="AGREE", target=held[(fam, flow)]["id"], count=n))
                elif n >= min_support:
                    rival = next((u for (f, s), u in held.items() if f == fam and s
                                  and s[0] == flow[0] and flows[s] < n), None)
                    unit = {"kind": "workflow", "family": fam, "steps": list(flow),
                            "text": workflow_text(fam, flow)}
                    ops.append(KnowledgeOp(op="EDIT", target=rival["id"], count=n, **unit)
                               if rival else KnowledgeOp(op="ADD", count=n, **unit))
        for (fam, steps), u in held.items():
            if failed[fam] >= min_support and not by_fam[fam][steps]:
                ops.append(KnowledgeOp(op="REMOVE", target=u["id"], count=failed[fam]))
        held_insights = {(u["family"], u["text"]): u for u in view if u.get("kind") == "insight"}
        for fam in sorted({o.family for o in outcomes}):
            wins = [o.workflow for o in outcomes if o.family == fam and o.verified]
            fails = [o.tried for o in outcomes if o.family == fam and not o.verified and o.tried]
            if len(wins) < min_support or len(fails) < min_support:
                continue
            text = contrast_insight(fam, wins, fails)
            if text is None:
                continue
            if (fam, text) in held_insights:
                ops.append(KnowledgeOp(op="AGREE", target=held_insights[(fam, text)]["id"],
                                       count=len(wins)))
            else:
                ops.append(KnowledgeOp(op="ADD", count=len(wins), kind="insight", family=fam,
                                       text=text))
        if self.poison:  # an experiment's adversary: counting rows to answer lookups
            ops.append(KnowledgeOp(op="ADD", count=50, kind="workflow", family="lookup",
                                   steps=list(POISON), text=workflow_text("lookup", POISON)))
        return ops


_MODELS: dict[str, Any] = {}


def chat_model(spec: str):
    """One model per spec per process (a site's rounds and scaffolds share it)."""
    if spec not in _MODELS:
        _MODELS[spec] = load_model(spec)
    return _MODELS[spec]


# --- experiment sites ---------------------------------------------------------------------

def make_data_sites(out: str | Path, *, chinook_parts: int = 2, extra: Sequence[str] = (
        "sklearn_classic",), scaffolds: Sequence[str] = ("react", "plan", "reflexion"),
        canaries: int = 2, poison: int | None = None, seed: int = 0) -> list[Path]:
    """Sites for the knowledge track: Chinook split by customer (same schema, different
    customers, invoices and answers at each site), plus whole shipped environments of other
    schemas. Canary strings (fixed by `seed`) are planted in each Chinook part's customer
    data."""
    import hashlib

    out = Path(out)
    folders = []
    src = sample_environment("chinook")
    specs: list[tuple[str, Any]] = [("chinook", i) for i in range(chinook_parts)]
    specs += [(name, None) for name in extra]
    for i, (env_name, part) in enumerate(specs):
        d = out / f"site-{i}"
        d.mkdir(parents=True, exist_ok=True)
        planted = []
        if part is not None:
            db = d / "env.sqlite"
            if not (db.exists() and (d / "site.json").exists()):  # both, or build again
                tmp = d / "env.sqlite.tmp"
                shutil.copyfile(src, tmp)
                con = sqlite3.connect(tmp)
                keep = f"CustomerId % {chinook_parts} = {part}"
                con.execute("DELETE FROM InvoiceLine WHERE InvoiceId IN (SELECT InvoiceId FROM "
                            f"Invoice WHERE CustomerId IN (SELECT CustomerId FROM Customer "
                            f"WHERE NOT ({keep})))")
                con.execute("DELETE FROM Invoice WHERE CustomerId IN (SELECT CustomerId FROM "
                            f"Customer WHERE NOT ({keep}))")
                con.execute(f"DELETE FROM Customer WHERE NOT ({keep})")
                for k, (cid,) in enumerate(con.execute(
                        "SELECT CustomerId FROM Customer ORDER BY CustomerId "
                        f"LIMIT {canaries}").fetchall()):
                    digest = hashlib.sha256(f"{seed}:{i}:{k}".encode()).hexdigest()[:12]
                    token = f"CANARY-{digest}"
                    planted.append(token)
                    con.execute("UPDATE Customer SET Company = ? WHERE CustomerId = ?",
                                (token, cid))
                con.commit()
                con.execute("VACUUM")
                con.close()
                tmp.replace(db)
            else:
                planted = json.loads((d / "site.json").read_text()).get("canaries", [])
            env = str(db.resolve())
        else:
            env = env_name
        atomic_write_json(d / "site.json", {
            "name": f"site-{i}", "env": env, "scaffold": scaffolds[i % len(scaffolds)],
            "canaries": planted, "poison": poison == i})
        folders.append(d)
    return folders
