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
from workbench.federated.task import evaluate, local_train
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
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    content: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {
        "metrics": MetricRecord({k: float(v) for k, v in metrics.items() if k in METRIC_KEYS}),
        "site": ConfigRecord({"name": site_name})}
    if state is not None:
        content["arrays"] = to_record(state)
    return Message(RecordDict(content), reply_to=msg)


@site_errors
def handle_train(msg: Message, context: Context) -> Message:
    cfg, site, model, local = _job(msg, context)
    state = from_record(msg.content.array_records["arrays"])
    res = local_train(site, state, model=model, local=local,
                      aggregation=str(cfg["aggregation"]), seed=int(cfg["seed"]),
                      rnd=int(cfg["round"]))
    return _reply(msg, site.name, res.metrics, res.state)


@site_errors
def handle_evaluate(msg: Message, context: Context) -> Message:
    cfg, site, model, local = _job(msg, context)
    state = from_record(msg.content.array_records["arrays"])
    out = evaluate(site, state, model=model, local=local, mc=bool(cfg["mc"]))
    out["num-examples"] = float(len(site.eval) or len(site.train))
    return _reply(msg, site.name, {k: v for k, v in out.items() if isinstance(v, float)})
