"""Track B at a site, as the Flower ClientApp's `query.knowledge` handler.

The site works its local tasks with the view the server sent, proposes operations, drops what
fails the privacy filter or lowers success on its gate slice, reviews other sites' candidates
on the same slice, and replies with operations and counts only. Its data path comes from the
node config (`data-path`), as in the adapter rounds."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from workbench.federated.client import site_errors
from workbench.federated.config import KnowledgeSettings
from workbench.federated.knowledge.site import DataAgentSite
from workbench.federated.knowledge.units import (
    PrivacyFilter,
    ab_gate,
    minilm,
    ops_to_record,
    review_candidates,
)
from workbench.records import KnowledgeOp

if TYPE_CHECKING:
    from flwr.app import Context, Message


@site_errors
def handle_knowledge(msg: Message, context: Context) -> Message:
    """Track B at a site: work the local tasks with the view, propose operations, filter,
    gate, reply with operations and counts."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    cfg = msg.content.config_records["config"]
    seed = cfg["seed"]
    if not isinstance(seed, int):
        raise ValueError("the round's config has no integer seed")
    path = context.node_config.get("data-path")
    if not path:
        raise ValueError("this SuperNode has no data-path in its node config")
    ks = KnowledgeSettings.model_validate_json(str(cfg["knowledge-json"]))
    view = json.loads(str(cfg["view-json"]))
    site = DataAgentSite(str(path), iterations=ks.learn_iterations, seed=seed,
                         agent=ks.agent, agent_settings=ks.prompted)
    dev = site.tasks("dev", 2 * ks.slice if ks.slice else None)
    gate_tasks, eval_tasks = dev[0::2], dev[1::2]
    learned = site.attempt(site.tasks("learn", ks.slice), view, boost=ks.boost)
    evals = site.attempt(eval_tasks, view, iterations=ks.eval_iterations, boost=ks.boost)
    metrics = {"learn-tasks": len(learned), "learn-success": sum(o.verified for o in learned),
               "eval-tasks": len(evals), "eval-success": sum(o.verified for o in evals),
               "eval-iterations": sum(o.iterations for o in evals)}
    ops: list[KnowledgeOp] = []
    if bool(site.meta.get("contribute", True)):
        proposed = site.propose(learned, view, min_support=ks.min_support)
        embed = minilm().embed if ks.max_similarity is not None else None
        filt = PrivacyFilter([t for o in learned for t in o.texts], site.identifiers,
                             site.canaries, n=ks.ngram, embed=embed,
                             max_similarity=ks.max_similarity or 0.9,
                             embed_texts=None if ks.embed_against == "all"
                             else [o.texts[0] for o in learned])  # the questions
        dropped = 0
        for op in proposed:
            if op.op in ("ADD", "EDIT"):
                text, _ = filt.check(op.text)
                rest, _ = filt.check(" ".join([op.family, *op.steps]))
                if text is None or rest is None or "<slot>" in rest:
                    dropped += 1
                    continue
                op = op.model_copy(update={"text": text})
            ops.append(op)
        metrics.update({"proposed": len(proposed), "dropped-privacy": dropped})
        def success(units, family):
            tasks = [t for t in gate_tasks if t.category == family]
            if not tasks:
                return 0.0
            r = site.attempt(tasks, units, iterations=ks.eval_iterations, boost=ks.boost)
            return sum(o.verified for o in r) / len(r)

        if ks.gate and not site.poison:
            before = len(ops)
            ops, _ = ab_gate(ops, view, success)
            metrics["dropped-gate"] = before - len(ops)
        if not site.poison:  # review what other sites proposed, on the same gate slice
            votes, _ = review_candidates(
                json.loads(str(cfg["candidates-json"])), view, success,
                lambda fam: sum(t.category == fam for t in gate_tasks))
            ops += votes
            metrics["reviewed"] = len(votes)
    metrics["sent-ops"] = len(ops)
    content: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {
        "knowledge": ConfigRecord(ops_to_record(ops)),
        "families": ConfigRecord({k: int(v) for k, v in site.families.items()}),
        "metrics": MetricRecord({k: float(v) for k, v in metrics.items()}),
        "site": ConfigRecord({"name": site.name})}
    return Message(RecordDict(content), reply_to=msg)
