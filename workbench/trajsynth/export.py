"""Trajectories out of search trees, and the three exports.

Everything here reads saved trees (`trees/<task>.json`) and the task pool, so exports can be
redone without searching again:

- SFT: one `messages` conversation per verified trajectory in OpenAI's shape (the schema and
  question; assistant `tool_calls` to `run_sql`; `tool` results; the final answer) with the
  `tools` it may call. The train core masks everything but the assistant turns.
- ICL bank: one JSONL entry per verified trajectory (question, schema digest, compact
  trajectory), the text a retriever indexes to pick demonstrations.
- Preference pairs: the verified path (chosen) against its nearest failed sibling (rejected:
  the failed terminal sharing the longest prefix with it).

Every record carries provenance: environment hash, task id, generator, models, tree config
and the task's cost ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workbench.trajsynth.pool import Task
from workbench.trajsynth.trees import TaskTree, TreeNode

RUN_SQL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_sql",
        "description": "Run one read-only SQLite SELECT statement; returns the rows as text.",
        "parameters": {"type": "object",
                       "properties": {"sql": {"type": "string",
                                              "description": "One SELECT statement."}},
                       "required": ["sql"]},
    },
}
SYSTEM = ("You are a data analyst. Query the SQLite database with the run_sql tool, then "
          "give the answer in one line.")


class TrajStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sql: str
    observation: str


class Trajectory(BaseModel):
    """A path of a task's tree from the root to a terminal."""

    model_config = ConfigDict(extra="forbid")

    id: str
    task_id: str
    env_name: str
    env_hash: str
    question: str
    category: str
    difficulty: int
    split: str
    generator: str
    models: list[str]
    steps: list[TrajStep]
    answer: str
    verified: bool
    visits: int
    node_id: int
    plan: list[str] = Field(default_factory=list, description="The moves' texts.")
    config: str = Field("", description="The explore config's digest.")
    ledger: dict[str, Any] = Field(default_factory=dict)


def answer_text(observation: str) -> str:
    """The answer line for a terminal's observation (the table text `to_observation` wrote):
    one value for a 1x1 result, values joined by ", " for one column, rows by "; "."""
    lines = [ln for ln in observation.strip().splitlines() if ln.strip()]
    if not lines or lines[0].startswith("Error"):
        return observation.strip()
    header = lines[0].split(" | ")
    rows = [ln for ln in lines[1:] if not (ln.startswith("(") and ln.endswith(")"))]
    if len(header) == 1:
        return ", ".join(rows) if rows else "(no rows)"
    return "; ".join(rows) if rows else "(no rows)"


def _steps(tree: TaskTree, path: list[int]) -> list[TrajStep]:
    by_id = {n.id: n for n in tree.nodes}
    steps = []
    for nid in path:
        n = by_id[nid]
        if n.sql and (n.move is None or n.move.get("slot") in ("sql", "submit")):
            steps.append(TrajStep(sql=n.sql, observation=n.observation or ""))
    return steps


def trajectory(tree: TaskTree, task: Task, node: TreeNode, env_name: str) -> Trajectory:
    path = tree.node_path(node.id)
    by_id = {n.id: n for n in tree.nodes}
    steps = _steps(tree, path)
    return Trajectory(
        id=f"{task.id}-{node.id}", task_id=task.id, env_name=env_name, env_hash=tree.env_hash,
        question=task.question, category=task.category, difficulty=task.difficulty,
        split=task.split, generator=tree.generator, models=tree.models, steps=steps,
        answer=answer_text(steps[-1].observation) if steps else "", verified=bool(node.verified),
        visits=node.visits, node_id=node.id,
        plan=[by_id[i].move["text"] for i in path if by_id[i].move],
        config=tree.config.digest(), ledger=tree.ledger.model_dump(mode="json"))


def verified_trajectories(tree: TaskTree, task: Task, env_name: str) -> list[Trajectory]:
    by_id = {n.id: n for n in tree.nodes}
    return [trajectory(tree, task, by_id[p[-1]], env_name) for p in tree.verified_paths]


def near_miss(tree: TaskTree, verified_id: int) -> TreeNode | None:
    """The failed terminal (one that ran a statement) sharing the longest prefix with the
    verified node; ties go to the most visited, then the lowest id."""
    target = tree.node_path(verified_id)
    best, key = None, None
    for n in tree.nodes:
        if not n.terminal or n.verified or not n.sql:
            continue
        p = tree.node_path(n.id)
        shared = next((i for i, (a, b) in enumerate(zip(p, target, strict=False)) if a != b),
                      min(len(p), len(target)))
        k = (shared, n.visits, -n.id)
        if key is None or k > key:
            best, key = n, k
    return best


def sft_record(traj: Trajectory, digest: str) -> dict[str, Any]:
    """A `ChatExample` (OpenAI messages + tools)."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{digest}\n\nQuestion: {traj.question}"}]
    for i, s in enumerate(traj.steps):
        call_id = f"call_{i}"
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "run_sql", "arguments": json.dumps({"sql": s.sql})}}]})
        msgs.append({"role": "tool", "tool_call_id": call_id, "name": "run_sql",
                     "content": s.observation})
    msgs.append({"role": "assistant", "content": traj.answer})
    return {"id": traj.id, "messages": msgs, "tools": [RUN_SQL_TOOL],
            "metadata": _provenance(traj)}


def _provenance(traj: Trajectory) -> dict[str, Any]:
    return {"source": "trajsynth", "task_id": traj.task_id, "env_name": traj.env_name,
            "env_hash": traj.env_hash, "category": traj.category,
            "difficulty": traj.difficulty, "split": traj.split, "generator": traj.generator,
            "models": traj.models, "config": traj.config, "ledger": traj.ledger}


def icl_entry(traj: Trajectory, digest: str) -> dict[str, Any]:
    """One demonstration: what a retriever matches (the question) and what a prompt shows."""
    lines = [f"Question: {traj.question}"]
    for s in traj.steps:
        lines.append(f"SQL: {s.sql}")
        obs = s.observation.splitlines()
        lines.append("Result: " + " / ".join(obs[:4]) + (" / ..." if len(obs) > 4 else ""))
    lines.append(f"Answer: {traj.answer}")
    return {"id": traj.id, "question": traj.question, "text": "\n".join(lines),
            "schema": digest, "metadata": _provenance(traj)}


def preference_pair(tree: TaskTree, task: Task, traj: Trajectory, env_name: str,
                    digest: str) -> dict[str, Any] | None:
    miss = near_miss(tree, traj.node_id)
    if miss is None:
        return None
    rejected = trajectory(tree, task, miss, env_name)
    chosen_msgs = sft_record(traj, digest)["messages"]
    rejected_msgs = sft_record(rejected, digest)["messages"]
    prompt = chosen_msgs[:2]
    return {"id": f"{traj.id}-vs-{miss.id}", "prompt": prompt, "chosen": chosen_msgs[2:],
            "rejected": rejected_msgs[2:], "tools": [RUN_SQL_TOOL],
            "metadata": {**_provenance(traj), "rejected_node": miss.id,
                         "rejected_reason": miss.reason}}


def icl_sections(entries: list[dict[str, Any]]) -> list:
    """The ICL bank as `Section`s for a retrieval index: the question and the compact
    trajectory are the text; the provenance rides along as metadata."""
    from workbench.io import sha256_text
    from workbench.records import Section

    out = []
    for i, e in enumerate(entries):
        doc = f"icl:{e['metadata']['env_name']}"
        heading = [e["metadata"]["category"], e["id"]]
        out.append(Section(id=Section.make_id(doc, heading, i), doc_id=doc,
                           source="icl_bank.jsonl", heading_path=heading, text=e["text"],
                           content_hash=sha256_text(e["text"])[:16], order=i,
                           metadata={"trajectory": e["id"], **e["metadata"]}))
    return out


def export_trees(trees: list[tuple[TaskTree, Task]], env_name: str, digest: str,
                 out_dir: str | Path, *, index: bool = False, log=print) -> dict[str, Any]:
    """Write sft.messages.jsonl, icl_bank.jsonl and preferences.jsonl (train-split tasks only
    for SFT and preferences; the ICL bank too: held-out tasks are for measuring); with
    `index`, also the ICL bank as a retrieval index (keyword + semantic + hybrid) in
    icl_index/, through the registry's `section_index` service."""
    from workbench.io import write_jsonl

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sft, icl, prefs = [], [], []
    for tree, task in trees:
        for traj in verified_trajectories(tree, task, env_name):
            if task.split != "train":
                continue
            sft.append(sft_record(traj, digest))
            icl.append(icl_entry(traj, digest))
            pair = preference_pair(tree, task, traj, env_name, digest)
            if pair:
                prefs.append(pair)
    write_jsonl(out / "sft.messages.jsonl", sft)
    write_jsonl(out / "icl_bank.jsonl", icl)
    write_jsonl(out / "preferences.jsonl", prefs)
    if index and icl:
        from workbench import services

        services.section_index()(icl_sections(icl), out / "icl_index", log=log)
    return {"sft": len(sft), "icl": len(icl), "preferences": len(prefs),
            "icl_index": str(out / "icl_index") if index and icl else None, "dir": str(out)}
