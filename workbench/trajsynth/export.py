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

A verified path is an `AgentTrajectory`, the type every agent run is (its steps the run_sql
calls and their results, the conversation ready for SFT), with the tree's facts in
`metadata["path"]` (`PathFacts`).

Every record carries provenance: environment hash, task id, generator, models, tree config
and the task's cost ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from workbench.agents.steps import AgentStep, AgentTrajectory
from workbench.datatasks.pool import Task
from workbench.datatasks.trees import TaskTree, TreeNode
from workbench.io import sha256_text
from workbench.records import Section, StrictModel
from workbench.runs import outputs_at

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


class PathFacts(StrictModel):
    """What a search tree's path adds to the agent trajectory it is (kept in the
    trajectory's `metadata["path"]`): where it was searched, and how it ended."""

    model_config = ConfigDict(frozen=True)

    env_name: str
    env_hash: str
    question: str
    category: str
    difficulty: int
    split: str
    generator: str
    models: list[str]
    verified: bool
    visits: int
    node_id: int
    plan: list[str] = Field(default_factory=list, description="The moves' texts.")
    config: str = Field("", description="The explore config's digest.")
    ledger: dict[str, Any] = Field(default_factory=dict)


def facts(traj: AgentTrajectory) -> PathFacts:
    return PathFacts.model_validate(traj.metadata["path"])


def sql_steps(traj: AgentTrajectory) -> list[tuple[str, str]]:
    """(statement, observation) of every run_sql call, in order."""
    seen = {s.call_id: s.content for s in traj.steps if s.kind == "observation"}
    return [(s.arguments["sql"], seen.get(s.call_id, "")) for s in traj.steps
            if s.kind == "tool_call" and s.tool == "run_sql" and isinstance(s.arguments, dict)]


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


def _statements(tree: TaskTree, path: list[int]) -> list[tuple[str, str]]:
    by_id = {n.id: n for n in tree.nodes}
    out = []
    for nid in path:
        n = by_id[nid]
        if n.sql and (n.move is None or n.move.get("slot") in ("sql", "submit")):
            out.append((n.sql, n.observation or ""))
    return out


def trajectory(tree: TaskTree, task: Task, node: TreeNode, env_name: str,
               digest: str) -> AgentTrajectory:
    """The tree's path to `node` as the agent run it stands for: the schema digest and the
    question, a run_sql call and its result per statement, the answer its last result
    gives; the tree's facts in `metadata["path"]`."""
    path = tree.node_path(node.id)
    by_id = {n.id: n for n in tree.nodes}
    statements = _statements(tree, path)
    answer = answer_text(statements[-1][1]) if statements else ""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{digest}\n\nQuestion: {task.question}"}]
    steps: list[AgentStep] = []
    for i, (sql, obs) in enumerate(statements):
        call_id = f"call_{i}"
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "run_sql", "arguments": json.dumps({"sql": sql})}}]})
        msgs.append({"role": "tool", "tool_call_id": call_id, "name": "run_sql",
                     "content": obs})
        steps += [AgentStep(index=2 * i, turn=i, kind="tool_call", tool="run_sql",
                            arguments={"sql": sql}, call_id=call_id),
                  AgentStep(index=2 * i + 1, turn=i, kind="observation", tool="run_sql",
                            content=obs, call_id=call_id)]
    msgs.append({"role": "assistant", "content": answer})
    steps.append(AgentStep(index=len(steps), turn=len(statements), kind="final",
                           content=answer))
    path_facts = PathFacts(
        env_name=env_name, env_hash=tree.env_hash, question=task.question,
        category=task.category, difficulty=task.difficulty, split=task.split,
        generator=tree.generator, models=tree.models, verified=bool(node.verified),
        visits=node.visits, node_id=node.id,
        plan=[move["text"] for i in path if (move := by_id[i].move)],
        config=tree.config.digest(), ledger=tree.ledger.model_dump(mode="json"))
    return AgentTrajectory(
        id=f"{task.id}-{node.id}", task_id=task.id, pack="trajsynth", scaffold="tree_search",
        model=",".join(tree.models), messages=msgs, tools=[RUN_SQL_TOOL], steps=steps,
        final={"answer": answer}, tool_calls=len(statements), model_turns=len(statements) + 1,
        metadata={"path": path_facts.model_dump(mode="json")})


def verified_trajectories(tree: TaskTree, task: Task, env_name: str,
                          digest: str) -> list[AgentTrajectory]:
    by_id = {n.id: n for n in tree.nodes}
    return [trajectory(tree, task, by_id[p[-1]], env_name, digest)
            for p in tree.verified_paths]


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


def sft_record(traj: AgentTrajectory) -> dict[str, Any]:
    """A `ChatExample` (OpenAI messages + tools)."""
    return {"id": traj.id, "messages": [m.model_dump(mode="json", exclude_none=True)
                                        for m in traj.messages],
            "tools": [RUN_SQL_TOOL], "metadata": _provenance(traj)}


def _provenance(traj: AgentTrajectory) -> dict[str, Any]:
    f = facts(traj)
    return {"source": "trajsynth", "task_id": traj.task_id, "env_name": f.env_name,
            "env_hash": f.env_hash, "category": f.category,
            "difficulty": f.difficulty, "split": f.split, "generator": f.generator,
            "models": f.models, "config": f.config, "ledger": f.ledger}


def icl_entry(traj: AgentTrajectory, digest: str) -> dict[str, Any]:
    """One demonstration: what a retriever matches (the question) and what a prompt shows."""
    question = facts(traj).question
    lines = [f"Question: {question}"]
    for sql, observation in sql_steps(traj):
        lines.append(f"SQL: {sql}")
        obs = observation.splitlines()
        lines.append("Result: " + " / ".join(obs[:4]) + (" / ..." if len(obs) > 4 else ""))
    if traj.final is None:  # every path_trajectory ends in one
        raise ValueError(f"trajectory {traj.id} has no final answer to demonstrate")
    lines.append(f"Answer: {traj.final['answer']}")
    return {"id": traj.id, "question": question, "text": "\n".join(lines),
            "schema": digest, "metadata": _provenance(traj)}


def preference_pair(tree: TaskTree, task: Task, traj: AgentTrajectory, env_name: str,
                    digest: str) -> dict[str, Any] | None:
    miss = near_miss(tree, facts(traj).node_id)
    if miss is None:
        return None
    rejected = trajectory(tree, task, miss, env_name, digest)
    chosen_msgs = sft_record(traj)["messages"]
    rejected_msgs = sft_record(rejected)["messages"]
    prompt = chosen_msgs[:2]
    return {"id": f"{traj.id}-vs-{miss.id}", "prompt": prompt, "chosen": chosen_msgs[2:],
            "rejected": rejected_msgs[2:], "tools": [RUN_SQL_TOOL],
            "metadata": {**_provenance(traj), "rejected_node": miss.id,
                         "rejected_reason": miss.reason}}


def icl_sections(entries: list[dict[str, Any]]) -> list:
    """The ICL bank as `Section`s for a retrieval index: the question and the compact
    trajectory are the text; the provenance rides along as metadata."""
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
    icl_index/, through `retrieval.search.index_sections`."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sft, icl, prefs = [], [], []
    for tree, task in trees:
        for traj in verified_trajectories(tree, task, env_name, digest):
            if task.split != "train":
                continue
            sft.append(sft_record(traj))
            icl.append(icl_entry(traj, digest))
            pair = preference_pair(tree, task, traj, env_name, digest)
            if pair:
                prefs.append(pair)
    files = outputs_at("trajsynth", out)
    files.write("sft", sft)
    files.write("icl_bank", icl)
    files.write("preferences", prefs)
    if index and icl:
        from workbench.retrieval.search import index_sections

        index_sections(icl_sections(icl), files.path("icl_index"), log=log)
    return {"sft": len(sft), "icl": len(icl), "preferences": len(prefs),
            "icl_index": str(files.path("icl_index")) if index and icl else None,
            "dir": str(out)}
