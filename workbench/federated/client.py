"""The site's side of a round, as Flower ClientApp handlers.

The site's data path comes from the node config (`data-path`), never from the app package or
the server; what goes back is the adapter tensors, allow-listed numbers and the site's name.
A node config `model` overrides the model spec the server names (a site that keeps its base
model elsewhere)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from workbench.federated.config import LocalTrain
from workbench.federated.server import METRIC_KEYS
from workbench.federated.sites import load_site
from workbench.federated.weights import from_record, to_record

if TYPE_CHECKING:
    from flwr.app import Context, Message


def site_errors(handler):
    """A site's exception goes to the server as its type and a fixed line; the message, which
    can quote the site's rows (a validation error shows the bad value), stays in the site's
    own log (the SuperNode's output)."""
    import sys
    import traceback

    @functools.wraps(handler)
    def wrapped(msg, context):
        try:
            return handler(msg, context)
        except Exception as e:  # noqa: BLE001 -- re-raised without its text
            traceback.print_exc(file=sys.stderr)
            raise RuntimeError(f"{type(e).__name__} at the site (details in the site's log)"
                               ) from None

    return wrapped


def _job(msg: Message, context: Context):
    cfg = msg.content["config"]
    path = context.node_config.get("data-path")
    if not path:
        raise ValueError("this SuperNode has no data-path in its node config "
                         "(--node-config 'data-path=\"/path/to/site\"')")
    site = load_site(str(path))
    model = str(context.node_config.get("model") or cfg["model"])
    local = LocalTrain.model_validate_json(str(cfg["local-json"]))
    return cfg, site, model, local


def _reply(msg: Message, site_name: str, metrics: dict, state=None) -> Message:
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    content = {"metrics": MetricRecord({k: float(v) for k, v in metrics.items()
                                        if k in METRIC_KEYS}),
               "site": ConfigRecord({"name": site_name})}
    if state is not None:
        content["arrays"] = to_record(state)
    return Message(RecordDict(content), reply_to=msg)


@site_errors
def handle_train(msg: Message, context: Context) -> Message:
    from workbench.federated.task import local_train

    cfg, site, model, local = _job(msg, context)
    res = local_train(site, from_record(msg.content["arrays"]), model=model, local=local,
                      aggregation=str(cfg["aggregation"]), seed=int(cfg["seed"]),
                      rnd=int(cfg["round"]))
    return _reply(msg, site.name, res.metrics, res.state)


@site_errors
def handle_evaluate(msg: Message, context: Context) -> Message:
    from workbench.federated.task import evaluate

    cfg, site, model, local = _job(msg, context)
    out = evaluate(site, from_record(msg.content["arrays"]), model=model, local=local,
                   mc=bool(cfg["mc"]))
    out["num-examples"] = float(len(site.eval) or len(site.train))
    return _reply(msg, site.name, {k: v for k, v in out.items() if isinstance(v, float)})


@site_errors
def handle_knowledge(msg: Message, context: Context) -> Message:
    """Track B at a site: work the local tasks with the view, propose operations, filter,
    gate, reply with operations and counts."""
    import json

    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    from workbench import services
    from workbench.federated.config import KnowledgeSettings
    from workbench.federated.knowledge import (
        PrivacyFilter,
        ab_gate,
        minilm,
        ops_to_record,
        review_candidates,
    )
    from workbench.records import KnowledgeOp

    cfg = msg.content["config"]
    path = context.node_config.get("data-path")
    if not path:
        raise ValueError("this SuperNode has no data-path in its node config")
    ks = KnowledgeSettings.model_validate_json(str(cfg["knowledge-json"]))
    view = json.loads(str(cfg["view-json"]))
    site = services.knowledge_site()(str(path), iterations=ks.learn_iterations,
                                      seed=int(cfg["seed"]), agent=ks.agent,
                                      agent_settings=ks.prompted)
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
    content = {"knowledge": ConfigRecord(ops_to_record(ops)),
               "families": ConfigRecord({k: int(v) for k, v in site.families.items()}),
               "metrics": MetricRecord({k: float(v) for k, v in metrics.items()}),
               "site": ConfigRecord({"name": site.name})}
    return Message(RecordDict(content), reply_to=msg)
