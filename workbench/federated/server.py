"""The server's round loop over a Flower `Grid`, with the guards Flower's strategies lack.

Flower's `FedAvg.start` waits for ever for `min_available_nodes`, waits an hour for replies by
default, aggregates whatever arrives (no minimum), and cannot resume. Here:

- `wait_for_nodes` gives up after `guards.wait_nodes_s` with the connected/required counts;
- every round waits at most `guards.round_timeout_s`;
- a reply is used only when it carries allow-listed keys and finite numbers of the right
  shapes (anything else is counted as rejected);
- a round with fewer than `guards.min_replies` good replies keeps the previous global adapter
  (same sha256) and is logged as failed; `guards.max_failed_rounds` in a row abort the run;
- the global adapter is saved atomically after every round (`GlobalStore`), and a restarted
  server resumes after the last saved round.

The same loop runs inside the Flower ServerApp (deployment) and on `InProcessGrid`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.federated.config import FederatedConfig
from workbench.federated.guards import FedAbort, RoundBase, sort_replies, wait_for_nodes
from workbench.federated.results import FederationFiles
from workbench.federated.sites import SITE_NAME
from workbench.federated.weights import (
    GlobalStore,
    State,
    aggregate,
    from_record,
    product_gap,
    state_hash,
    to_record,
)
from workbench.io import append_line, atomic_write_json

if TYPE_CHECKING:
    from flwr.app import Message
    from flwr.serverapp import Grid

# what a client may send back: tensors, numbers under these names, and its site name
REPLY_KEYS = {"arrays", "metrics", "site"}
METRIC_KEYS = {"num-examples", "train-loss", "eval-loss", "eval-loss-before", "steps",
               "seconds", "mc-correct", "mc-n"}


@dataclass
class RoundLog(RoundBase):
    replies: int = 0
    num_examples: float = 0.0
    wait_seconds: float = 0.0
    sha256: str = ""
    product_gap: float | None = None


def config_record(cfg: FederatedConfig, rnd: int) -> dict[str, Any]:
    """What a site needs to do the round's work: numbers and the model spec."""
    return {"round": rnd, "model": cfg.model, "aggregation": cfg.aggregation,
            "seed": cfg.seed, "local-json": cfg.local.model_dump_json(), "mc": cfg.mc_eval}


def check_reply(msg: Message, global_state: State | None) -> tuple[str, State | None,
                                                                      dict[str, float]]:
    """(site name, tensors or None, metrics) of a good reply; raises ValueError saying what
    is wrong with a bad one."""
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

    content = msg.content
    keys = set(content.keys())
    if extra := keys - REPLY_KEYS:
        raise ValueError(f"keys outside the allow-list: {sorted(extra)}")
    metrics_rec = content.get("metrics")
    if not isinstance(metrics_rec, MetricRecord):
        raise ValueError("no metrics record")
    metrics: dict[str, float] = {}
    for k, v in metrics_rec.items():
        if k not in METRIC_KEYS:
            raise ValueError(f"metric {k!r} is not allow-listed")
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise ValueError(f"metric {k!r} is not a finite number")
        metrics[k] = float(v)
    site = content.get("site")
    name = ""
    if site is not None:
        if not isinstance(site, ConfigRecord) or set(site.keys()) != {"name"} \
                or not isinstance(site["name"], str) or not SITE_NAME.match(site["name"]):
            raise ValueError("site record must be {name: 1-32 of a-z 0-9 _ -}")
        name = site["name"]
    state = None
    if global_state is not None and "arrays" not in content:
        raise ValueError("a train reply without arrays")
    if "arrays" in content:
        rec = content["arrays"]
        if not isinstance(rec, ArrayRecord):
            raise ValueError("arrays is not an ArrayRecord")
        try:
            state = from_record(rec)
        except (TypeError, ValueError) as e:
            raise ValueError(f"arrays do not decode as NumPy tensors ({e})") from None
        if any(v.dtype.kind != "f" for v in state.values()):
            raise ValueError("arrays must be floating point")
        if global_state is not None:
            if set(state) != set(global_state):
                raise ValueError("tensor names differ from the global adapter's")
            for k, v in state.items():
                if v.shape != global_state[k].shape:
                    raise ValueError(f"{k}: shape {v.shape}, global {global_state[k].shape}")
                import numpy as np

                if not np.isfinite(v).all():
                    raise ValueError(f"{k}: non-finite values")
        if metrics.get("num-examples", 0) <= 0:
            raise ValueError("num-examples must be positive")
    return name, state, metrics


class FedServer:
    """Rounds of FedAvg-LoRA over any Flower Grid; everything lands in `out`:
    `global/round-NNNN/` (adapters), `rounds.jsonl` (one RoundLog per round), `summary.json`.
    """

    def __init__(self, cfg: FederatedConfig, out: str | Path, *,
                 log: Callable[[str], None] = print,
                 on_round: Callable[[int], None] | None = None,
                 poll_s: float = 0.5):
        self.cfg, self.out, self.log = cfg, Path(out), log
        self.files = FederationFiles(self.out)
        self.store = GlobalStore(self.files.global_store)
        self.on_round = on_round
        self.poll_s = poll_s

    # -- guards -------------------------------------------------------------------------------
    def wait_for_nodes(self, grid: Grid) -> list[int]:
        return wait_for_nodes(grid, self.cfg.guards, self.poll_s)

    # -- one exchange -------------------------------------------------------------------------
    def _exchange(self, grid: Grid, nodes: list[int], kind: str, rnd: int, state: State
                  ) -> tuple[RoundLog, list[tuple[str, State | None, dict[str, float]]]]:
        from flwr.app import ConfigRecord, Message, RecordDict

        record = to_record(state)
        timeout = self.cfg.guards.round_timeout_s
        msgs = [Message(RecordDict({"arrays": record,
                                    "config": ConfigRecord(config_record(self.cfg, rnd))}),
                        dst_node_id=n, message_type=kind, group_id=f"{kind}-{rnd}",
                        ttl=timeout + 30) for n in nodes]
        log = RoundLog(round=rnd, kind=kind, sent=len(msgs),
                       bytes_down=record.count_bytes() * len(msgs))
        t0 = time.monotonic()
        replies = list(grid.send_and_receive(msgs, timeout=timeout))
        log.seconds = time.monotonic() - t0
        log.replies = len(replies)
        good = []
        for node, r, (name, st, metrics) in sort_replies(
                replies, len(msgs), lambda r: check_reply(r, state if kind == "train" else None),
                log, timeout):
            if "arrays" in r.content:
                log.bytes_up += r.content["arrays"].count_bytes()
            good.append((name or f"node-{node}", st, metrics))
        log.used = len(good)
        return log, good

    def _keep(self, rnd: int, good) -> None:
        from safetensors.numpy import save_file

        from workbench.io import atomic_path

        d = self.files.replies / f"round-{rnd:04d}"
        d.mkdir(parents=True, exist_ok=True)
        for name, st, m in good:
            with atomic_path(d / f"{name}.safetensors") as tmp:
                save_file(st, str(tmp), metadata={"num-examples": str(m["num-examples"])})

    # -- the run ------------------------------------------------------------------------------
    def run(self, grid: Grid, *, initial: State | None = None) -> dict[str, Any]:
        cfg, g = self.cfg, self.cfg.guards
        self.out.mkdir(parents=True, exist_ok=True)
        latest = self.store.latest()
        if latest is not None:
            start, state, info = latest
            streak = int(info.get("failed_streak", 0))
            self.log(f"resuming after round {start} (global sha256 {info['sha256'][:12]})")
        else:
            if initial is None:
                from workbench.federated.task import initial_state

                initial = initial_state(cfg.model, cfg.local, cfg.seed)
            start, state, streak = 0, initial, 0
            self.store.save(0, state, {"status": "initial"})
        t_run = time.monotonic()
        for rnd in range(start + 1, cfg.rounds + 1):
            t0 = time.monotonic()
            nodes = self.wait_for_nodes(grid)
            waited = time.monotonic() - t0
            log, good = self._exchange(grid, nodes, "train", rnd, state)
            log.wait_seconds = waited
            if len(good) < g.min_replies:
                streak += 1
                log.status, log.failed_streak = "failed", streak
                self.log(f"round {rnd}: {len(good)} good replies of {log.sent} (need "
                         f"{g.min_replies}); the global adapter stays as it was")
            else:
                streak = 0
                states = [st for _, st, _ in good]
                weights = [m["num-examples"] for _, _, m in good]
                if cfg.keep_replies:
                    self._keep(rnd, good)
                previous = state
                state = aggregate(states, weights, method=cfg.aggregation, previous=previous)
                log.num_examples = float(sum(weights))
                log.product_gap = product_gap(states, weights, state)
                self.log(f"round {rnd}: aggregated {len(good)} of {log.sent} sites "
                         f"({log.num_examples:.0f} examples) in {log.seconds:.1f} s")
            log.sha256 = self.store.save(rnd, state, {"status": log.status,
                                                      "failed_streak": streak})
            append_line(self.files.rounds, json.dumps(asdict(log)))
            if self.on_round:
                self.on_round(rnd)
            if streak >= g.max_failed_rounds:
                raise FedAbort(f"{streak} rounds in a row had fewer than {g.min_replies} good "
                               f"replies (guards.max_failed_rounds={g.max_failed_rounds}); "
                               f"last failures: {log.failures[:3]}")
        # the final adapter, evaluated where the data is
        nodes = self.wait_for_nodes(grid)
        ev, _ = self._exchange(grid, nodes, "evaluate", cfg.rounds, state)
        ev.sha256 = state_hash(state)
        append_line(self.files.rounds, json.dumps(asdict(ev)))
        summary = {"rounds": cfg.rounds, "sha256": state_hash(state),
                   "seconds": time.monotonic() - t_run, "final": ev.sites,
                   "aggregation": cfg.aggregation}
        atomic_write_json(self.files.summary, summary)
        return summary


def read_rounds(out: str | Path) -> list[dict]:
    """The round log; a torn last line (a crash mid-append) is skipped."""
    p = FederationFiles(Path(out)).rounds
    rows = []
    for line in p.read_text().splitlines() if p.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
