"""Track A's server: FedAvg / FFA-LoRA rounds of a LoRA adapter over a Flower `Grid`.

Flower's `FedAvg.start` waits for ever for `min_available_nodes`, waits an hour for replies by
default, aggregates whatever arrives (no minimum), and cannot resume. `FedServer` is a track
of the guarded round loop (`guards.run_rounds`: bounded waits, a minimum of good replies, an
abort after failed rounds, resume), and adds the adapter's own guards:

- a reply is used only when it carries allow-listed keys and finite numbers of the right
  shapes (`check_reply`; anything else is counted as rejected);
- a failed round keeps the previous global adapter (same sha256);
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
from workbench.federated.guards import (
    RoundBase,
    exchange,
    run_rounds,
)
from workbench.federated.sites import SITE_NAME
from workbench.federated.task import initial_state
from workbench.federated.weights import (
    GlobalStore,
    State,
    aggregate,
    from_record,
    product_gap,
    state_hash,
    to_record,
)
from workbench.io import append_line, atomic_path, atomic_write_json
from workbench.runs import outputs_at

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
            for k, t in state.items():
                if t.shape != global_state[k].shape:
                    raise ValueError(f"{k}: shape {t.shape}, global {global_state[k].shape}")
                import numpy as np

                if not np.isfinite(t).all():
                    raise ValueError(f"{k}: non-finite values")
        if metrics.get("num-examples", 0) <= 0:
            raise ValueError("num-examples must be positive")
    return name, state, metrics


class FedServer:
    """Track A's rounds (a `guards.Track`): FedAvg-LoRA over any Flower Grid, under the
    guarded round loop (`guards.run_rounds`); everything lands in `out`: `global/round-NNNN/`
    (adapters), `rounds.jsonl` (one RoundLog per round), `summary.json`."""

    def __init__(self, cfg: FederatedConfig, out: str | Path, *,
                 log: Callable[[str], None] = print,
                 on_round: Callable[[int], None] | None = None,
                 poll_s: float = 0.5):
        self.cfg, self.out, self.log = cfg, Path(out), log
        self.files = outputs_at("fed", self.out, under="federation")
        self.store = GlobalStore(self.files.path("global"))
        self.on_round = on_round
        self.poll_s = poll_s
        self.state: State = {}
        self._initial: State | None = None
        self._t_run = 0.0

    def run(self, grid: Grid, *, initial: State | None = None) -> dict[str, Any]:
        self._initial = initial
        return run_rounds(self, grid, self.cfg.guards, self.cfg.rounds,
                          on_round=self.on_round, poll_s=self.poll_s)

    # -- the track ----------------------------------------------------------------------------
    def resume(self) -> tuple[int, int]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        latest = self.store.latest()
        if latest is not None:
            start, self.state, info = latest
            streak = int(info.get("failed_streak", 0))
            self.log(f"resuming after round {start} (global sha256 {info['sha256'][:12]})")
        else:
            initial = self._initial
            if initial is None:
                initial = initial_state(cfg.model, cfg.local, cfg.seed)
            start, self.state, streak = 0, initial, 0
            self.store.save(0, self.state, {"status": "initial"})
        self._t_run = time.monotonic()
        return start, streak

    def _messages(self, nodes: list[int], kind: str, rnd: int) -> tuple[RoundLog, list]:
        from flwr.app import ConfigRecord, Message, RecordDict

        record = to_record(self.state)
        timeout = self.cfg.guards.round_timeout_s
        msgs = [Message(RecordDict({"arrays": record,
                                    "config": ConfigRecord(config_record(self.cfg, rnd))}),
                        dst_node_id=n, message_type=kind, group_id=f"{kind}-{rnd}",
                        ttl=timeout + 30) for n in nodes]
        return RoundLog(round=rnd, kind=kind, sent=len(msgs),
                        bytes_down=record.count_bytes() * len(msgs)), msgs

    def configure(self, rnd: int, nodes: list[int], *, waited: float
                  ) -> tuple[RoundLog, list]:
        row, msgs = self._messages(nodes, "train", rnd)
        row.wait_seconds = waited
        return row, msgs

    def check(self, reply: Message) -> tuple[str, State, dict[str, float]]:
        name, state, metrics = check_reply(reply, self.state)
        if state is None:  # check_reply asks a reply for arrays when there is a global state
            raise ValueError("a train reply without arrays")
        return name, state, metrics

    @staticmethod
    def _received(row: RoundLog, replies: list, good: list
                  ) -> list[tuple[str, State, dict[str, float]]]:
        """(site, tensors, metrics) of each good reply; the bytes they brought in `row`."""
        row.replies = len(replies)
        out = []
        for node, r, (name, st, metrics) in good:
            if "arrays" in r.content:
                row.bytes_up += r.content["arrays"].count_bytes()
            out.append((name or f"node-{node}", st, metrics))
        return out

    def update(self, rnd: int, row: RoundLog, replies: list, good: list, *, ok: bool) -> None:
        cfg = self.cfg
        got = self._received(row, replies, good)
        if not ok:
            self.log(f"round {rnd}: {len(got)} good replies of {row.sent} (need "
                     f"{cfg.guards.min_replies}); the global adapter stays as it was")
            return
        states = [st for _, st, _ in got]
        weights = [m["num-examples"] for _, _, m in got]
        if cfg.keep_replies:
            self._keep(rnd, got)
        self.state = aggregate(states, weights, method=cfg.aggregation, previous=self.state)
        row.num_examples = float(sum(weights))
        row.product_gap = product_gap(states, weights, self.state)
        self.log(f"round {rnd}: aggregated {len(got)} of {row.sent} sites "
                 f"({row.num_examples:.0f} examples) in {row.seconds:.1f} s")

    def save(self, rnd: int, row: RoundLog, streak: int) -> None:
        row.sha256 = self.store.save(rnd, self.state, {"status": row.status,
                                                       "failed_streak": streak})
        append_line(self.files.path("rounds"), json.dumps(asdict(row)))

    def finish(self, grid: Grid, nodes: Callable[[], list[int]]) -> dict[str, Any]:
        """The final adapter, evaluated where the data is."""
        cfg = self.cfg
        ev, msgs = self._messages(nodes(), "evaluate", cfg.rounds)
        replies, good = exchange(grid, ev, msgs, lambda r: check_reply(r, None),
                                 cfg.guards.round_timeout_s)
        self._received(ev, replies, good)
        ev.sha256 = state_hash(self.state)
        append_line(self.files.path("rounds"), json.dumps(asdict(ev)))
        summary = {"rounds": cfg.rounds, "sha256": state_hash(self.state),
                   "seconds": time.monotonic() - self._t_run, "final": ev.sites,
                   "aggregation": cfg.aggregation}
        atomic_write_json(self.files.path("summary"), summary)
        return summary

    def _keep(self, rnd: int, good) -> None:
        from safetensors.numpy import save_file

        d = self.files.path("replies") / f"round-{rnd:04d}"
        d.mkdir(parents=True, exist_ok=True)
        for name, st, m in good:
            with atomic_path(d / f"{name}.safetensors") as tmp:
                save_file(st, str(tmp), metadata={"num-examples": str(m["num-examples"])})


def read_rounds(out: str | Path) -> list[dict]:
    """The round log; a torn last line (a crash mid-append) is skipped."""
    p = outputs_at("fed", Path(out), under="federation").path("rounds")
    rows = []
    for line in p.read_text().splitlines() if p.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
