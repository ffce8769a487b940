"""Track B's server: each round sends every site its view of the active units and the
candidates it should review, checks each reply against an allow-list, and folds the
operations that come back into the knowledge base (`units.apply_round`), saved atomically per
round so a restarted server resumes. It is a track of the guarded round loop
(`guards.run_rounds`), as the adapter rounds are: a bounded wait for sites, replies sorted into
usable ones and failures, a failed round when too few are usable, an abort after too many."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.federated.config import FederatedConfig
from workbench.federated.guards import RoundBase, run_rounds
from workbench.federated.knowledge.units import (
    KnowledgeBase,
    apply_round,
    load_latest_kb,
    log_round,
    minilm,
    ops_from_record,
    ops_to_record,
    record_bytes,
    save_kb,
)
from workbench.federated.sites import SITE_NAME
from workbench.io import atomic_write_json
from workbench.runs import outputs_at

if TYPE_CHECKING:
    from flwr.app import Message
    from flwr.serverapp import Grid


@dataclass
class KnowledgeRound(RoundBase):
    kind: str = "knowledge"
    ops: dict[str, int] = field(default_factory=dict)
    active: int = 0
    candidates: int = 0


class KnowledgeServer:
    """Track B's rounds (a `guards.Track`): send each site its view of the active units, fold the operations that
    come back into the knowledge base (saved atomically per round; a restart resumes), with
    the same guards as the adapter rounds. Everything lands in `out`: `kb/round-NNNN.json`,
    `rounds.jsonl` (one KnowledgeRound per round), `summary.json`."""

    REPLY_KEYS = frozenset({"knowledge", "families", "metrics", "site"})
    METRICS = frozenset({"learn-tasks", "learn-success", "eval-tasks", "eval-success",
                         "eval-iterations", "proposed", "dropped-privacy", "dropped-gate",
                         "reviewed", "sent-ops"})

    def __init__(self, cfg: FederatedConfig, out: str | Path, *,
                 log: Callable[[str], None] = print,
                 on_round: Callable[[int], None] | None = None,
                 poll_s: float = 0.5):
        self.cfg, self.out, self.log = cfg, Path(out), log
        self.files = outputs_at("fed", self.out, under="federation")
        self.on_round = on_round
        self.poll_s = poll_s
        self.kb = KnowledgeBase()
        self.families: dict[str, list[str]] = {}

    def check(self, msg: Message) -> tuple[str, list, dict[str, int], dict[str, float]]:
        from flwr.app import ConfigRecord, MetricRecord

        c = msg.content
        if extra := set(c.keys()) - self.REPLY_KEYS:
            raise ValueError(f"keys outside the allow-list: {sorted(extra)}")
        if not isinstance(c.get("knowledge"), ConfigRecord) \
                or not isinstance(c.get("metrics"), MetricRecord):
            raise ValueError("a knowledge reply needs knowledge and metrics records")
        ops = ops_from_record(dict(c["knowledge"].items()))
        if extra := set(c["metrics"].keys()) - self.METRICS:
            raise ValueError(f"metrics outside the allow-list: {len(extra)}")
        metrics = {k: float(v) for k, v in c["metrics"].items()
                   if isinstance(v, int | float) and not isinstance(v, bool)
                   and math.isfinite(v)}
        if len(metrics) != len(c["metrics"]):
            raise ValueError("metrics must be finite numbers")
        fams = {}
        if "families" in c:
            fams = {str(k): int(v) for k, v in c["families"].items() if isinstance(v, int)}
            if len(fams) > 64 or any(not re.fullmatch(r"[a-z0-9_]{1,40}", k) for k in fams):
                raise ValueError("families must be up to 64 short a-z0-9_ names")
        name = c["site"]["name"] if "site" in c else ""
        if name and not SITE_NAME.match(str(name)):
            raise ValueError("bad site name")
        return str(name), ops, fams, metrics

    def run(self, grid: Grid) -> dict[str, Any]:
        return run_rounds(self, grid, self.cfg.guards, self.cfg.rounds,
                          on_round=self.on_round, poll_s=self.poll_s)

    # -- the track ----------------------------------------------------------------------------
    def resume(self) -> tuple[int, int]:
        self.out.mkdir(parents=True, exist_ok=True)
        kb = load_latest_kb(self.out)
        if kb is not None:
            self.log(f"resuming after round {kb.round} ({len(kb.active())} active units)")
        else:
            kb = KnowledgeBase()
            save_kb(self.out, kb)
        self.kb = kb
        self.families = kb.families  # node -> its task families (saved with the KB)
        return kb.round, kb.failed_streak

    def configure(self, rnd: int, nodes: list[int], *, waited: float
                  ) -> tuple[KnowledgeRound, list]:
        """Each site's view of the active units and the candidates it should review."""
        from flwr.app import ConfigRecord, Message, RecordDict

        cfg, kb, families = self.cfg, self.kb, self.families
        row = KnowledgeRound(round=rnd, sent=len(nodes))
        msgs = []
        for n in nodes:
            view = json.dumps(kb.view(families.get(str(n))))
            review = json.dumps(kb.candidates_for(f"node-{n}", families.get(str(n)), rnd=rnd))
            row.bytes_down += len(view.encode()) + len(review.encode())
            msgs.append(Message(RecordDict({"config": ConfigRecord({
                "round": rnd, "seed": cfg.seed, "view-json": view,
                "candidates-json": review,
                "knowledge-json": cfg.knowledge.model_dump_json()})}), dst_node_id=n,
                message_type="query.knowledge", group_id=f"knowledge-{rnd}",
                ttl=cfg.guards.round_timeout_s + 30))
        return row, msgs

    def update(self, rnd: int, row: KnowledgeRound, replies: list, good: list, *,
               ok: bool) -> None:
        """The operations of the good replies folded into the knowledge base (votes,
        `k_min`); a failed round only moves the base's round on."""
        ks = self.cfg.knowledge
        updates = []
        for node, _, (_, ops, fams, _) in good:
            self.families[str(node)] = sorted(fams)
            row.bytes_up += record_bytes(ops_to_record(ops)) + record_bytes(fams)
            updates.append((f"node-{node}", ops))
        if ok:
            row.ops = apply_round(self.kb, updates, k_min=ks.k_min, rnd=rnd,
                                  embed=_embed_insights, threshold=ks.merge_similarity)
        else:
            self.kb.round = rnd

    def save(self, rnd: int, row: KnowledgeRound, streak: int) -> None:
        kb = self.kb
        row.active = len(kb.active())
        row.candidates = sum(u.status == "candidate" for u in kb.units.values())
        kb.failed_streak = streak
        save_kb(self.out, kb)
        log_round(self.out, row)
        self.log(f"round {rnd}: {row.used}/{row.sent} sites, {row.active} active units, "
                 f"ops {row.ops}")

    def finish(self, grid: Grid, nodes) -> dict[str, Any]:
        kb = self.kb
        summary = {"rounds": self.cfg.rounds, "track": "knowledge",
                   "active": [u.public() for u in kb.active()],
                   "units": len(kb.units)}
        atomic_write_json(self.files.path("summary"), summary)
        return summary


def _embed_insights(texts: list[str]):
    """MiniLM vectors for free-text units (loaded on the first insight, once per process)."""
    return minilm().embed(texts)
