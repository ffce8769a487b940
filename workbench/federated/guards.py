"""The guards both tracks' rounds share, which Flower's strategies lack: a bounded wait for
enough sites (`wait_for_nodes`), the sorting of a round's replies into usable ones and
failures (`sort_replies`), the row every round log holds (`RoundBase`) and the abort
(`FedAbort`). The adapter rounds (`server.FedServer`) and the knowledge rounds
(`knowledge.server.KnowledgeServer`) each run their own loop with them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError
from workbench.federated.config import Guards

if TYPE_CHECKING:
    from flwr.serverapp import Grid


class FedAbort(WorkbenchError):
    """The run cannot go on (too few sites, too many failed rounds); exit non-zero."""

    exit_code = 4

    def __init__(self, message: str, **details: Any):
        super().__init__(message)
        self.details = details


@dataclass
class RoundBase:
    """What every round log row holds, in both tracks (`rounds.jsonl`)."""

    round: int
    kind: str  # train | evaluate | knowledge
    status: str = "ok"  # ok | failed
    sent: int = 0
    used: int = 0
    failures: list[dict] = field(default_factory=list)  # {node, code, reason}
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0
    sites: dict[str, dict[str, float]] = field(default_factory=dict)
    failed_streak: int = 0


def wait_for_nodes(grid: Grid, g: Guards, poll_s: float = 0.5) -> list[int]:
    """The connected nodes once `g.min_nodes` are; gives up after `g.wait_nodes_s` with the
    connected/required counts."""
    t0 = time.monotonic()
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= g.min_nodes:
            return nodes
        waited = time.monotonic() - t0
        if waited >= g.wait_nodes_s:
            raise FedAbort(f"{len(nodes)} of the {g.min_nodes} required sites connected "
                           f"after {waited:.0f} s (guards.min_nodes="
                           f"{g.min_nodes}, guards.wait_nodes_s={g.wait_nodes_s:g}); "
                           f"start more SuperNodes or lower guards.min_nodes",
                           connected=len(nodes), required=g.min_nodes, waited_s=waited)
        time.sleep(min(poll_s, g.wait_nodes_s - waited))


def sort_replies(replies: list, sent: int, check: Callable[[Any], tuple], log, timeout: float
                 ) -> list[tuple[int, Any, tuple]]:
    """(node, reply, check(reply)) for every usable reply, its metrics in `log.sites`; an
    error reply, a rejected one (check raised, or a site name already seen this round) and
    the sites that sent nothing go into `log.failures`. `check` returns (name, ..., metrics)."""
    good = []
    for r in replies:
        node = r.metadata.src_node_id
        if r.has_error():
            log.failures.append({"node": node, "code": r.error.code,
                                 "reason": (r.error.reason or "")[:200]})
            continue
        try:
            res = check(r)
            if res[0] and res[0] in log.sites:
                raise ValueError(f"site name {res[0]!r} already replied this round")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.failures.append({"node": node, "code": "rejected", "reason": str(e)[:200]})
            continue
        log.sites[res[0] or f"node-{node}"] = res[-1]
        good.append((node, r, res))
    if len(replies) < sent:
        log.failures.append({"node": None, "code": "timeout",
                             "reason": f"{sent - len(replies)} of {sent} sites sent no reply "
                                       f"within {timeout:g} s"})
    return good
