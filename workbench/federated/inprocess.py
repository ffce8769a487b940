"""Flower's Grid in this process: the real ClientApp and server loop, no SuperLink.

`InProcessGrid` hands each message to the ClientApp with that node's Context (its node config
holds the site's data path), one node after another, and turns an exception into the error
reply a SuperNode would send (code 2, CLIENT_APP_RAISED_EXCEPTION). Nothing listens on a
socket, which keeps development runs and most tests fast; the deployment path
(`workbench.federated.deploy`) runs the same apps under real SuperLink/SuperNode processes.
The ClientApp it runs is the caller's (`flower_app.client_app()`, which serves both tracks).
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid


class InProcessGrid(Grid):
    def __init__(self, client_app: Any, node_configs: list[dict[str, Any]], *,
                 run_config: dict[str, Any] | None = None, run_id: int = 1,
                 wire: Callable[[Message], None] | None = None):
        from flwr.common.constant import SUPERLINK_NODE_ID
        from flwr.supercore.task_identity import TaskIdentity

        self.client_app = client_app
        self._run_id = run_id
        # this process plays the server task (Message() reads its identity from here)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = \
            run_id, SUPERLINK_NODE_ID, 1
        ids = itertools.count(1001)
        self.contexts = {next(ids): Context(run_id=run_id, node_id=0, node_config=dict(nc),
                                            state=RecordDict(), run_config=run_config or {})
                         for nc in node_configs}
        for nid, ctx in self.contexts.items():
            ctx.node_id = nid
        self.offline: set[int] = set()
        self._pending: dict[str, Message] = {}
        self.wire = wire  # sees every reply that leaves a site

    # Grid's abstract interface
    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return getattr(self, "_run", None)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, ttl=ttl,
                       group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for m in messages:
            mid = str(uuid4())
            m.metadata.__dict__["_message_id"] = mid
            m.metadata.__dict__["_run_id"] = self._run_id
            self._pending[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = []
        for mid in message_ids:
            m = self._pending.pop(mid, None)
            if m is None or m.metadata.dst_node_id in self.offline:
                continue
            ctx = self.contexts[m.metadata.dst_node_id]
            try:
                reply = self.client_app(m, ctx)
            except Exception as e:  # noqa: BLE001 -- a site failure is data for the server
                reason = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=reason), reply_to=m)
            if self.wire:
                self.wire(reply)
            replies.append(reply)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def site_node_configs(sites: list[Path], model: str | None = None) -> list[dict[str, Any]]:
    return [{"data-path": str(Path(s).resolve()), **({"model": model} if model else {})}
            for s in sites]
