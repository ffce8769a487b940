"""Running a request's work off the event loop: admitted through the gate (429 when it is
full), in worker threads whose cancel event is set when the client leaves or the server
stops (then the reply is a 503), streamed as SSE one event at a time."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator

from starlette.requests import Request

from workbench.models.base import cancel_context
from workbench.serve.limits import Ticket
from workbench.serve.replies import ApiError
from workbench.serve.state import ServerState


def admit(s: ServerState) -> Ticket:
    ticket = s.gate.admit()
    if ticket is None:
        raise ApiError(429, f"the server is busy ({s.gate.active} requests running or "
                            "queued); retry later", kind="rate_limit_error")
    return ticket


class Work:
    """One request's work, run in worker threads inside a context whose cancel event
    is set when the client disconnects (or the request is cancelled)."""

    def __init__(self, s: ServerState, request: Request):
        self.s, self.request, self.cancel = s, request, threading.Event()
        self.context = cancel_context(self.cancel)

    async def run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.s.workers, functools.partial(self.context.run, fn, *args,
                                                           **kwargs))
        stopping = self.s.stopping
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=self.s.limits.disconnect_poll_s)
                if done:
                    break
                if stopping.is_set() or (not self.cancel.is_set()
                                         and await self.request.is_disconnected()):
                    self.cancel.set()
        except BaseException:
            self.cancel.set()
            raise
        if stopping.is_set():  # a reply cut short by the shutdown is not a reply
            fut.exception()  # retrieved, so asyncio does not log it
            raise ApiError(503, "the server is shutting down; retry later",
                           kind="server_error")
        return fut.result()


async def run_once(s: ServerState, request: Request, fn, *args, **kwargs):
    ticket = admit(s)
    try:
        return await Work(s, request).run(fn, *args, **kwargs)
    finally:
        ticket.release()


def streamed(s: ServerState, request: Request, ticket: Ticket, pieces: Iterator[str]):
    """SSE from a sync iterator of events, each `next` in a worker thread; generation
    stops when the client leaves (seen between events, or by polling while one is being
    made), and the ticket is released then."""
    from fastapi.responses import StreamingResponse
    from starlette.background import BackgroundTask

    work, end = Work(s, request), object()

    async def events():
        try:
            while True:
                piece = await work.run(next, pieces, end)
                if piece is end:
                    break
                yield piece
                if await request.is_disconnected():
                    break
        finally:
            work.cancel.set()
            ticket.release()

    return StreamingResponse(events(), media_type="text/event-stream",
                             background=BackgroundTask(ticket.release))
