"""One guarded round loop for both tracks, with the guards Flower's strategies lack.

`run_rounds` drives a `Track` (in the style of Flower's `Strategy`: resume, configure, check,
update, save, finish) over any Flower `Grid`:

- `wait_for_nodes` gives up after `guards.wait_nodes_s` with the connected/required counts;
- every round waits at most `guards.round_timeout_s` for replies;
- a reply is used only when the track's `check` passes it and its site has not replied this
  round (`sort_replies`; anything else is counted as a failure, with the sites that sent
  nothing);
- a round with fewer than `guards.min_replies` good replies keeps the track's state as it was
  and is logged as failed; `guards.max_failed_rounds` in a row abort the run (`FedAbort`);
- the track saves its state atomically after every round, and `resume` starts a restarted
  server after the last saved round.

The adapter rounds (`server.FedServer`) and the knowledge rounds
(`knowledge.server.KnowledgeServer`) are the two tracks; neither knows the other."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from workbench.errors import WorkbenchError
from workbench.federated.config import Guards

if TYPE_CHECKING:
    from flwr.app import Message
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


def exchange(grid: Grid, row: RoundBase, msgs: list[Message], check: Callable[[Any], tuple],
             timeout: float) -> tuple[list[Message], list[tuple[int, Any, tuple]]]:
    """Send `msgs`, wait at most `timeout` for the replies, sort them (`sort_replies`) into
    `row`; (every reply, the usable ones as (node, reply, check(reply)))."""
    t0 = time.monotonic()
    replies = list(grid.send_and_receive(msgs, timeout=timeout))
    row.seconds = time.monotonic() - t0
    good = sort_replies(replies, len(msgs), check, row, timeout)
    row.used = len(good)
    return replies, good


Row = TypeVar("Row", bound=RoundBase)  # a track's log row


class Track(Protocol[Row]):
    """One track's side of a round, as `run_rounds` asks for it (`Row`: its log row)."""

    def resume(self) -> tuple[int, int]:
        """(the last round saved, the failed streak it ended with); a fresh run saves its
        round 0 first."""
        ...

    def configure(self, rnd: int, nodes: list[int], *, waited: float
                  ) -> tuple[Row, list[Message]]:
        """Round `rnd`'s log row and one message per node (`waited`: seconds spent waiting
        for the nodes)."""
        ...

    def check(self, reply: Message) -> tuple:
        """(site name, ..., metrics) of a usable reply; raises ValueError saying what is wrong
        with a bad one."""
        ...

    def update(self, rnd: int, row: Row, replies: list[Message],
               good: list[tuple[int, Any, tuple]], *, ok: bool) -> None:
        """Fold the good replies into the track's state (`ok`: enough of them), or keep it as
        it was (the row already says failed)."""
        ...

    def save(self, rnd: int, row: Row, streak: int) -> None:
        """Save the state after round `rnd` (atomically) and append its row to the log."""
        ...

    def finish(self, grid: Grid, nodes: Callable[[], list[int]]) -> dict[str, Any]:
        """After the last round: the summary (`nodes()` waits for the sites again)."""
        ...


def run_rounds(track: Track[Row], grid: Grid, g: Guards, rounds: int, *,
               on_round: Callable[[int], None] | None = None,
               poll_s: float = 0.5) -> dict[str, Any]:
    """Rounds 1..`rounds` of `track` over `grid` under the guards `g` (resuming after the
    last saved round); returns the track's summary."""
    start, streak = track.resume()
    for rnd in range(start + 1, rounds + 1):
        t0 = time.monotonic()
        nodes = wait_for_nodes(grid, g, poll_s)
        row, msgs = track.configure(rnd, nodes, waited=time.monotonic() - t0)
        replies, good = exchange(grid, row, msgs, track.check, g.round_timeout_s)
        ok = len(good) >= g.min_replies
        if ok:
            streak = 0
        else:
            streak += 1
            row.status, row.failed_streak = "failed", streak
        track.update(rnd, row, replies, good, ok=ok)
        track.save(rnd, row, streak)
        if on_round:
            on_round(rnd)
        if streak >= g.max_failed_rounds:
            raise FedAbort(f"{streak} rounds in a row had fewer than {g.min_replies} good "
                           f"replies (guards.max_failed_rounds={g.max_failed_rounds}); "
                           f"last failures: {row.failures[:3]}")
    return track.finish(grid, lambda: wait_for_nodes(grid, g, poll_s))
