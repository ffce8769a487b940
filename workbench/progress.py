"""Progress a person can see: bars on a terminal, a line at least every 30 s in a log.

`progress(items)` shows a tqdm bar when stderr is a terminal. When it is not (CI, nohup, a
job's log file, a pipe), nothing is drawn; instead one daemon thread per process prints a
line to stderr every `WB_PROGRESS_SECONDS` (default 25) while any work is under way:

    [progress] distill/distill > model calls > generating 3/4: 2/7 chunk (29%), 0.02/s,
    1m40s, ETA 4m10s

naming every level of the work in flight (a stage, the loop inside it, the model's batches
inside that) with each counted level's done/total, and the rate, elapsed time and time left
of the outermost counted loop that has moved (its end is the stage's end). `stage(name)`
marks a piece of work without a count (the stage runner wraps every stage in one), so even
a stage whose loops are not counted prints that it is alive.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def bars_enabled() -> bool:
    if os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        return False
    return sys.stderr.isatty()


def _interval() -> float:
    try:
        return max(0.05, float(os.environ.get("WB_PROGRESS_SECONDS", "25")))
    except ValueError:
        return 25.0


class _Work:
    __slots__ = ("desc", "total", "unit", "done", "t0")

    def __init__(self, desc: str, total: int | None, unit: str):
        self.desc, self.total, self.unit = desc, total, unit
        self.done = 0
        self.t0 = time.monotonic()


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Ticker:
    """The work in flight, per thread, and the one thread that reports it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stacks: dict[int, list[_Work]] = {}
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()

    def push(self, w: _Work) -> None:
        with self.lock:
            self.stacks.setdefault(threading.get_ident(), []).append(w)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="wb-progress",
                                               daemon=True)
                self.thread.start()

    def pop(self, w: _Work) -> None:
        with self.lock:
            stack = self.stacks.get(threading.get_ident(), [])
            if w in stack:
                stack.remove(w)
            if not stack:
                self.stacks.pop(threading.get_ident(), None)

    def line(self) -> str | None:
        with self.lock:
            stacks = [list(s) for s in self.stacks.values() if s]
        if not stacks:
            return None
        stack = max(stacks, key=len)  # the deepest work in flight says the most
        # rate and time left come from the outermost counted loop that has moved (the one
        # whose end is the stage's end); every counted level shows its done/total
        counted = next((w for w in stack if w.total and w.done), None) or next(
            (w for w in reversed(stack) if w.total), None)
        names = " > ".join(f"{w.desc} {w.done}/{w.total}" if w.total and w is not counted
                           else w.desc for w in stack if w.desc) or "working"
        now = time.monotonic()
        if counted is None:
            return f"[progress] {names}: running, {_duration(now - stack[0].t0)}"
        el = now - counted.t0
        rate = counted.done / el if el > 0 else 0.0
        pct = 100 * counted.done / counted.total
        eta = _duration((counted.total - counted.done) / rate) if rate > 0 else "?"
        return (f"[progress] {names}: {counted.done}/{counted.total} {counted.unit} "
                f"({pct:.0f}%), {rate:.2g}/s, {_duration(el)}, ETA {eta}")

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(min(1.0, _interval() / 4))
            with self.lock:
                if not self.stacks:
                    self.thread = None
                    return
            if time.monotonic() - last >= _interval():
                last = time.monotonic()
                if (text := self.line()) is not None:
                    try:
                        print(text, file=sys.stderr, flush=True)
                    except (OSError, ValueError):  # stderr closed under us
                        pass


_ticker = _Ticker()


def progress(items: Iterable[T], desc: str = "", total: int | None = None,
             unit: str = "it", *, delay: float = 0.0) -> Iterator[T]:
    """Iterate `items` with a bar on a terminal (shown after `delay` seconds) or progress
    lines in a log."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if bars_enabled():
        from tqdm.auto import tqdm

        yield from tqdm(items, desc=desc, total=total, unit=unit, dynamic_ncols=True,
                        delay=delay, leave=delay == 0)
        return
    w = _Work(desc, total, unit)
    _ticker.push(w)
    try:
        for x in items:
            yield x
            w.done += 1
    finally:
        _ticker.pop(w)


@contextlib.contextmanager
def stage(desc: str) -> Iterator[None]:
    """Mark a piece of work without a count: in a log, the progress lines name it (and
    whatever counted loop runs inside it) until it ends."""
    if bars_enabled():
        yield
        return
    w = _Work(desc, None, "")
    _ticker.push(w)
    try:
        yield
    finally:
        _ticker.pop(w)


def quiet_libraries() -> None:
    """Silence third-party progress bars and chatter unless a person is watching; library
    warnings (deprecations, the ONNX exporter's tracer warnings, ...) never reach a user's
    output: they go to the `py.warnings` logger, which prints nothing unless a log file is
    configured for it."""
    import logging

    if not bars_enabled():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.captureWarnings(True)
    wlog = logging.getLogger("py.warnings")
    if not wlog.handlers:
        wlog.addHandler(logging.NullHandler())
    wlog.propagate = False
    for name in ("transformers", "torch", "onnx", "onnxruntime", "sentence_transformers",
                 "flwr", "datasets", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
