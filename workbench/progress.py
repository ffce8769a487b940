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
a stage whose loops are not counted prints that it is alive. `count(desc, total, unit)` is
a loop whose items are done in lumps (`add(n)`: texts embedded a batch at a time), counted in
its own unit:

    [progress] rag/index > embedding: 2048/30000 text (7%), 17/s, 2m00s, ETA 27m25s

A count that has not moved says nothing, and the first item of a slow loop (a batch of
replies) can take minutes; `tally(desc, unit)` keeps a figure that moves inside it (the
tokens an engine has generated so far), shown with its own rate:

    [progress] distill/distill > model calls > generating: 0/8 reply (0%), 1234 token
    (41/s), 30s, ETA ?

so two lines in a row differ while work is being done. A loop of one item shows no "0/1"
(it says nothing until the item is done): "model calls > generating: 1 batch under way, 30s"
when nothing inside it counts.

With a progress file set (`set_progress_file(path)`, else the `WB_PROGRESS_FILE` variable),
the same thread also keeps a small JSON snapshot of the work in flight in that file, every
`WB_PROGRESS_FILE_SECONDS` (default 2), replaced in one rename so a reader never sees half of
one, on a terminal too (the bars are drawn as before). A background job writes
`<job folder>/progress.json` this way; `workbench.jobs.job_progress` reads it:

    {"schema_version": 1, "pid": 4242, "updated_at": 1718000000.0,
     "label": "distill > model calls", "levels": [{"desc": "distill", "done": 0,
     "total": null, "unit": ""}, {"desc": "model calls", "done": 2, "total": 7,
     "unit": "chunk"}], "counted": 1, "done": 2, "total": 7, "unit": "chunk",
     "rate": 0.02, "elapsed": 100.0, "eta": 250.0}

(`done`, `total`, `rate`, `elapsed`, `eta`: the outermost counted level that has moved, as in
the log lines; `levels: []` once no work is in flight; a tally is a level without a total,
which `label` leaves out.)

`where_it_stood()` is the snapshot of the moment an error or a stop request left the work
(noted as it unwinds through the loops and stages); a job keeps it in `job.json` when it
ends unfinished, so a stopped job can say how far it got.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

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


SNAPSHOT_SCHEMA = 1
_progress_file: list[Path | None] = [None]  # set_progress_file's path (one per process)


def set_progress_file(path: str | os.PathLike | None) -> None:
    """Keep a JSON snapshot of the work in flight in `path` (None: back to
    `WB_PROGRESS_FILE`, if set). Only this process writes it: unlike the variable, the
    setting is not inherited by the processes it starts."""
    _progress_file[0] = Path(path) if path is not None else None


def progress_file() -> Path | None:
    """Where the snapshot goes: the path set here, else `WB_PROGRESS_FILE`, else nowhere."""
    if _progress_file[0] is not None:
        return _progress_file[0]
    env = os.environ.get("WB_PROGRESS_FILE", "").strip()
    return Path(env) if env else None


def _file_interval() -> float:
    try:
        return max(0.05, float(os.environ.get("WB_PROGRESS_FILE_SECONDS", "2")))
    except ValueError:
        return 2.0


def _tracked() -> bool:
    """Whether work is recorded for the ticker: for log lines (no bars) or a snapshot file."""
    return not bars_enabled() or progress_file() is not None


def write_snapshot(path: Path, snap: dict[str, Any]) -> bool:
    """Replace `path` with the snapshot in one rename (a reader sees the old one or the new
    one, never half). A `path` that exists and is not a regular file (a link, a folder, a
    device) is left alone. Returns whether it was written; never raises."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(snap, fh, ensure_ascii=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return True
    except (OSError, ValueError, TypeError):
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False


class _Work:
    __slots__ = ("desc", "done", "probe", "t0", "tally", "total", "unit")

    def __init__(self, desc: str, total: int | None, unit: str, *, tally: bool = False):
        self.desc, self.total, self.unit = desc, total, unit
        self.done = 0
        self.t0 = time.monotonic()
        self.tally = tally  # a figure without a total that moves inside the work (`tally`)
        self.probe: Any = None  # Tally.current, read when the figure is shown


def duration(s: float) -> str:
    """Seconds as a person reads them: 42s, 3m05s, 2h10m."""
    s = round(float(s))  # an int (numpy 1.x scalars round to a float of their own)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


_duration = duration


class _Ticker:
    """The work in flight, per thread, and the one thread that reports it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stacks: dict[int, list[_Work]] = {}
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.unwound: dict[str, Any] | None = None  # where work stood when an error left it

    def note_unwound(self) -> None:
        """An exception is leaving a piece of work: keep the snapshot of where the work stood
        (the innermost level notes first, the levels it passes through keep that one)."""
        if self.unwound is None:
            snap = self.snapshot(probe=False)  # no probe's request while an error unwinds
            with self.lock:
                if self.unwound is None and snap["levels"]:
                    self.unwound = snap

    def push(self, w: _Work) -> None:
        with self.lock:
            self.unwound = None  # work goes on: an earlier error was handled
            self.stacks.setdefault(threading.get_ident(), []).append(w)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="wb-progress",
                                               daemon=True)
                self.thread.start()
            else:  # the reporter may be asleep on an earlier, longer interval: wake it
                self.wake.set()

    def pop(self, w: _Work) -> None:
        with self.lock:
            stack = self.stacks.get(threading.get_ident(), [])
            if w in stack:
                stack.remove(w)
            if not stack:
                self.stacks.pop(threading.get_ident(), None)

    def _focus(self) -> tuple[list[_Work], _Work | None] | None:
        """The deepest work in flight (it says the most) and the level whose rate and time
        left stand for it: the outermost counted loop that has moved (the one whose end is
        the stage's end), else the innermost counted one; None when nothing runs."""
        with self.lock:
            stacks = [list(s) for s in self.stacks.values() if s]
        if not stacks:
            return None
        stack = max(stacks, key=len)
        counted = next((w for w in stack if w.total and w.done), None) or next(
            (w for w in reversed(stack) if w.total), None)
        return stack, counted

    @staticmethod
    def _moving(stack: list[_Work]) -> _Work | None:
        """The innermost tally in `stack` that has moved (its probe read first)."""
        for w in reversed(stack):
            if w.tally:
                if w.probe is not None:
                    w.probe()
                if w.done:
                    return w
        return None

    def line(self) -> str | None:
        focus = self._focus()
        if focus is None:
            return None
        stack, counted = focus
        moving = self._moving(stack)
        # every counted level shows its done/total, but for a loop of one item (its 0/1
        # says nothing until it ends); tallies show as the figure, not as names
        names = " > ".join(f"{w.desc} {w.done}/{w.total}" if w.total and w.total > 1
                           and w is not counted else w.desc
                           for w in stack if w.desc and not w.tally) or "working"
        now = time.monotonic()
        if counted is None and moving is None:
            return f"[progress] {names}: running, {_duration(now - stack[0].t0)}"
        figure = []
        total = counted.total or 0 if counted is not None else 0  # counted: a total is set
        if counted is not None and (counted.done or total > 1):
            pct = 100 * counted.done / total
            figure.append(f"{counted.done}/{total} {counted.unit} ({pct:.0f}%)")
            if counted.done or moving is None:  # "0/s" only when nothing else moves
                el = now - counted.t0
                figure.append(f"{counted.done / el if el > 0 else 0.0:.2g}/s")
        if moving is not None:
            el = now - moving.t0
            r = moving.done / el if el > 0 else 0.0
            figure.append(f"{moving.done} {moving.unit} ({r:.0f}/s)" if r >= 10 else
                          f"{moving.done} {moving.unit} ({r:.2g}/s)")
        elif counted is not None and not figure:
            figure.append(f"1 {counted.unit} under way".rstrip())
        if counted is None:
            return f"[progress] {names}: {', '.join(figure)}, {_duration(now - stack[0].t0)}"
        el = now - counted.t0
        rate = counted.done / el if el > 0 else 0.0
        eta = _duration((total - counted.done) / rate) if rate > 0 else "?"
        figure.append(_duration(el))
        if counted.done or total > 1:
            figure.append(f"ETA {eta}")
        return f"[progress] {names}: {', '.join(figure)}"

    def snapshot(self, probe: bool = True) -> dict[str, Any]:
        """The work in flight as JSON-ready data (the format in the module's docstring);
        `levels` is empty when nothing runs. `probe`: read the tallies' probes first."""
        snap: dict[str, Any] = {
            "schema_version": SNAPSHOT_SCHEMA, "pid": os.getpid(), "updated_at": time.time(),
            "label": "", "levels": [], "counted": None, "done": None, "total": None,
            "unit": "", "rate": None, "elapsed": None, "eta": None}
        focus = self._focus()
        if focus is None:
            return snap
        stack, counted = focus
        if probe:
            self._moving(stack)  # a tally's probe is read before its count is copied
        now = time.monotonic()
        snap["levels"] = [{"desc": w.desc, "done": w.done, "total": w.total, "unit": w.unit}
                          for w in stack]
        snap["label"] = " > ".join(w.desc for w in stack if w.desc and not w.tally) or \
            "working"
        snap["elapsed"] = round(now - stack[0].t0, 3)
        if counted is not None:
            el = now - counted.t0
            rate = counted.done / el if el > 0 else 0.0
            snap.update(counted=stack.index(counted), done=counted.done,
                        total=counted.total, unit=counted.unit, elapsed=round(el, 3),
                        rate=rate if rate > 0 else None,
                        eta=round(((counted.total or 0) - counted.done) / rate, 3) if rate > 0
                        else None)
        return snap

    def write_file(self) -> bool:
        """Write the snapshot to the progress file now (when one is set)."""
        path = progress_file()
        return path is not None and write_snapshot(path, self.snapshot())

    def _run(self) -> None:
        last = time.monotonic()
        last_file = float("-inf")  # the first tick writes the snapshot
        while True:
            every = _interval()
            file_every = _file_interval() if progress_file() is not None else every
            self.wake.wait(min(1.0, every / 4, file_every / 4))
            self.wake.clear()
            with self.lock:
                idle = not self.stacks
            if idle:
                self.write_file()  # nothing in flight: say so, not the last loop's state
                with self.lock:
                    if not self.stacks:
                        self.thread = None
                        return
                continue
            now = time.monotonic()
            if progress_file() is not None and now - last_file >= file_every:
                last_file = now
                self.write_file()
            if now - last >= every:
                last = now
                if not bars_enabled() and (text := self.line()) is not None:
                    try:
                        print(text, file=sys.stderr, flush=True)
                    except (OSError, ValueError):  # stderr closed under us
                        pass


_ticker = _Ticker()


def write_progress_file() -> bool:
    """Write the snapshot of the work in flight to the progress file now (a job does at its
    end, so the file never outlives the work it describes); False when none is set."""
    return _ticker.write_file()


def where_it_stood() -> dict[str, Any] | None:
    """Where the work stood when an exception (an error, a stop request) last left it, as a
    snapshot (the format above, rate and time left included as they were then); else the
    work in flight now; None when there is neither. A job records this when it ends
    unfinished, so a stopped job can say how far it got."""
    if _ticker.unwound is not None:
        return _ticker.unwound
    snap = _ticker.snapshot()
    return snap if snap["levels"] else None


def progress(items: Iterable[T], desc: str = "", total: int | None = None,
             unit: str = "it", *, delay: float = 0.0) -> Iterator[T]:
    """Iterate `items` with a bar on a terminal (shown after `delay` seconds) or progress
    lines in a log; counted in the progress file's snapshot when one is set."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bars = bars_enabled()
    if bars:
        from tqdm.auto import tqdm

        bar = tqdm(items, desc=desc, total=total, unit=unit, dynamic_ncols=True,
                   delay=delay, leave=delay == 0)
        if not _tracked():
            yield from bar
            return
        items = bar
    w = _Work(desc, total, unit)
    _ticker.push(w)
    try:
        for x in items:
            yield x
            w.done += 1
    except BaseException:
        # an error or a stop request in the loop's body reaches a generator as GeneratorExit
        # when the unwinding lets it go (as does a `break`; work that goes on forgets it)
        _ticker.note_unwound()
        raise
    finally:
        _ticker.pop(w)
        if bars:
            items.close()  # type: ignore[attr-defined]


class Counter:
    """A counted level whose items come in lumps (`count`): `add(n)` after each lump."""

    def __init__(self, work: _Work | None, bar: Any = None):
        self._work, self._bar = work, bar

    def add(self, n: int = 1) -> None:
        if n <= 0:
            return
        if self._work is not None:
            self._work.done += n
        if self._bar is not None:
            self._bar.update(n)

    def expect(self, total: int | None) -> None:
        """The loop's total once it is known (a file's records, counted before they are
        parsed), so the lines and the bar say how far it is and how long is left."""
        if self._work is not None:
            self._work.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()


@contextlib.contextmanager
def count(desc: str, total: int | None, unit: str = "it", *,
          delay: float = 0.0) -> Iterator[Counter]:
    """A loop whose items are done in lumps (texts embedded a batch at a time, records read
    a file at a time): `add(n)` counts n more. Shown as `progress` shows a loop: a bar on a
    terminal (after `delay` seconds), else done/total with rate and ETA in the log lines and
    the progress file's snapshot, in the loop's own unit (30,000 texts, not 30 blocks)."""
    bar = None
    if bars_enabled():
        from tqdm.auto import tqdm

        bar = tqdm(desc=desc, total=total, unit=unit, dynamic_ncols=True, delay=delay,
                   leave=delay == 0)
    w = _Work(desc, total, unit) if _tracked() else None
    if w is not None:
        _ticker.push(w)
    try:
        yield Counter(w, bar)
    except BaseException:
        if w is not None:
            _ticker.note_unwound()
        raise
    finally:
        if w is not None:
            _ticker.pop(w)
        if bar is not None:
            bar.close()


@contextlib.contextmanager
def stage(desc: str) -> Iterator[None]:
    """Mark a piece of work without a count: in a log, the progress lines name it (and
    whatever counted loop runs inside it) until it ends."""
    if not _tracked():
        yield
        return
    w = _Work(desc, None, "")
    _ticker.push(w)
    try:
        yield
    except BaseException:
        _ticker.note_unwound()  # work without a counted loop inside, or one that was not
        raise
    finally:
        _ticker.pop(w)


class Tally:
    """A figure that moves inside a piece of work (`tally`): `add(n)` from any thread, or a
    `probe` that reads it from where the work happens (a server's count of tokens decoded
    so far, say), asked only when a line or a snapshot is made."""

    def __init__(self, work: _Work | None, probe: Any = None):
        self._work, self._probe, self._lock = work, probe, threading.Lock()
        self.added = 0  # what `add` counted
        if work is not None:
            work.probe = self.current if probe is not None else None

    @property
    def live(self) -> bool:
        """Whether anyone reads the figure (a log or a progress file); else `add` is free
        and a caller may skip counting."""
        return self._work is not None

    def add(self, n: int = 1) -> None:
        if self._work is None or not n:
            return
        with self._lock:
            self.added += n
            self._work.done = max(self._work.done, self.added)

    def current(self) -> int:
        """`added` plus what the probe reads now (a probe that fails, or returns None, reads
        0); the figure shown never goes back."""
        extra = 0
        if self._probe is not None:
            try:
                extra = int(self._probe() or 0)
            except Exception:  # noqa: BLE001  a figure for a person: never worth failing work
                extra = 0
        with self._lock:
            if self._work is not None:
                self._work.done = max(self._work.done, self.added + extra)
                return self._work.done
            return self.added + extra


@contextlib.contextmanager
def tally(desc: str, unit: str, *, probe: Any = None) -> Iterator[Tally]:
    """A figure that moves inside the work in flight, with no total (the tokens generated
    so far inside a batch of replies): the log lines and the snapshot show it with its rate
    while it runs, so a line says work is being done before a counted loop moves. `probe`,
    a callable, is read (from the reporting thread) when a line or snapshot is made and
    added to what `add` counted. Not tracked (bars on a terminal, no progress file): a
    Tally whose `add` does nothing and whose probe is never called."""
    if not _tracked():
        yield Tally(None)
        return
    w = _Work(desc, None, unit, tally=True)
    t = Tally(w, probe)
    _ticker.push(w)
    try:
        yield t
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
