"""A persistent cache of model calls (SQLite in WAL mode).

The key is the model's identity + the conversation + the generation parameters (+ the tools
offered and the tool choice, when there are tools), hashed; batch size and concurrency are
not part of it, so re-batching a job never misses. Failures are
stored as failures: they are never served as hits, and the next run retries them. Safe for
several processes writing at once (WAL + busy timeout; one row per key). A cache file that
SQLite finds corrupt or not a database at all is moved aside (`calls.sqlite.corrupt-<UTC time>`,
with its `-wal`/`-shm`) with a warning, and a fresh cache starts: the cache only saves calls,
so losing it costs time, never a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.models.base import (
    Capabilities,
    ChatModel,
    ContinuationScore,
    Conversation,
    Generation,
    GenerationParams,
    ScoreRequest,
    TokenLogprobs,
    Tools,
)
from workbench.models.messages import (
    ToolChoice,
    ToolSpec,
    as_tool_choice,
    as_tool_specs,
    plain_conversation,
)

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    ok INTEGER NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
);
"""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def generation_key(model: str, conversation: Conversation, params: GenerationParams,
                   tools: list[ToolSpec] | None = None, tool_choice: ToolChoice = "auto") -> str:
    payload: dict[str, Any] = {"kind": "generate", "model": model,
                               "messages": plain_conversation(conversation),
                               "params": params.model_dump(mode="json")}
    if tools:  # absent otherwise, so keys made before tools existed still hit
        payload["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in tools]
        payload["tool_choice"] = tool_choice if isinstance(tool_choice, str) else \
            tool_choice.model_dump(mode="json")
    return hashlib.sha256(_canonical(payload).encode()).hexdigest()


def score_key(model: str, prompt: str | Conversation, continuation: str) -> str:
    if not isinstance(prompt, str):
        prompt = plain_conversation(prompt)
    payload = {"kind": "score", "model": model, "prompt": prompt, "continuation": continuation}
    return hashlib.sha256(_canonical(payload).encode()).hexdigest()


class CallCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._generation = 0  # bumped when the file is replaced: every thread reconnects
        self.moved_aside: list[Path] = []
        self._run(lambda c: c.executescript(SCHEMA))
        self.hits = self.misses = 0

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.generation != self._generation:
            conn.close()
            conn = None
        if conn is None:
            if os.path.lexists(self.path) and not _regular(self.path):
                self._recover(sqlite3.DatabaseError("not a regular file (a folder, link or "
                                                    "device)"), any_file=True)
            self._local.inode = _inode(self.path)
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=60000")
            except BaseException:
                conn.close()
                raise
            self._local.conn, self._local.generation = conn, self._generation
            self._local.inode = _inode(self.path)
        return conn

    def _run(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        """`op(connection)`; a corrupt file is moved aside and `op` retried once on a fresh
        cache."""
        try:
            return op(self._conn())
        except sqlite3.DatabaseError as e:
            if not _corrupt(e):
                raise
            self._recover(e)
            return op(self._conn())

    def _recover(self, error: sqlite3.DatabaseError, *, any_file: bool = False) -> None:
        """Move the corrupt file (and its -wal/-shm) aside, unless another thread or process
        already did (the file under the name is no longer the one this thread opened)."""
        import fcntl

        seen = getattr(self._local, "inode", None)
        self.close()
        with self._lock:
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # one process at a time moves it
                now = _inode(self.path)
                if any_file and os.path.lexists(self.path) and not _regular(self.path):
                    now, seen = -1, -1  # a folder, link or device under the name: aside
                if now is not None and (seen is None or now == seen):
                    aside = self._aside_name()
                    os.replace(self.path, aside)
                    for ext in ("-wal", "-shm"):
                        with contextlib.suppress(FileNotFoundError):
                            os.replace(f"{self.path}{ext}", f"{aside}{ext}")
                    self.moved_aside.append(aside)
                    log.warning("call cache %s is unreadable (%s): moved aside to %s; starting "
                                "a fresh cache", self.path, error, aside.name)
                self._generation += 1
            finally:
                os.close(fd)  # releases the lock

    def _aside_name(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        return aside

    def get(self, key: str) -> Any | None:
        """The stored value of a successful call, or None (absent or failed)."""
        row = self._run(lambda c: c.execute("SELECT ok, value FROM calls WHERE key=?",
                                            (key,)).fetchone())
        if row is None or not row[0]:
            self.misses += 1
            return None
        try:
            value = json.loads(row[1])
        except (TypeError, ValueError):
            self.forget(key, "its stored value is not JSON")
            return None
        self.hits += 1
        return value

    def forget(self, key: str, why: str) -> None:
        """Drop one damaged row (logged once per row), so the call is made again."""
        log.warning("call cache %s: dropped a damaged entry (%s); the call is made again",
                    self.path, why)
        self._run(lambda c: c.execute("DELETE FROM calls WHERE key=?", (key,)))
        self.misses += 1

    def put(self, key: str, kind: str, model: str, value: Any, ok: bool = True) -> None:
        row = (key, kind, model, int(ok), _canonical(value), time.time())
        self._run(lambda c: c.execute(
            "INSERT OR REPLACE INTO calls (key, kind, model, ok, value, created) "
            "VALUES (?, ?, ?, ?, ?, ?)", row))

    def stats(self) -> dict[str, int]:
        rows = self._run(lambda c: c.execute(
            "SELECT ok, COUNT(*) FROM calls GROUP BY ok").fetchall())
        counts = dict(rows)
        return {"ok": counts.get(1, 0), "failed": counts.get(0, 0)}

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _regular(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _corrupt(e: sqlite3.DatabaseError) -> bool:
    """SQLite says the file is damaged or not a database (not: locked, busy, read-only)."""
    name = getattr(e, "sqlite_errorname", None)
    if name:
        return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    return type(e) is sqlite3.DatabaseError


CONCURRENT_CHUNKS = 4  # batches handed at once to a continuously batching backend


class CachedModel(ChatModel):
    """Wraps any backend: answers from the cache, calls the backend only for misses, and
    stores each chunk of results as soon as it is back (a kill loses at most one chunk)."""

    def __init__(self, model: ChatModel, cache: CallCache, *, chunk_size: int | None = None):
        self.inner = model
        self.cache = cache
        # a backend that batches continuously (a freed slot takes the next conversation) is
        # handed several batches at once: cut into lockstep chunks of its batch size, each
        # chunk waited for its longest reply while freed slots idled, and in a lockstep
        # agent turn of more dialogues than slots each chunk evicted the other's dialogues
        # from the slots' caches (BENCHMARKS.md, "Litsearch's free policy on llama.cpp")
        # (one slot, llama.cpp's deterministic mode, gains nothing and keeps chunks of one)
        self.chunk_size = chunk_size or model.batch_size * (
            CONCURRENT_CHUNKS if model.capabilities.concurrent and model.batch_size > 1 else 1)
        self.backend_name = model.backend_name
        self.calls_made = 0

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def score_identity(self) -> str:
        return self.inner.score_identity

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return self.inner.capabilities

    @property
    def max_positions(self) -> int | None:
        return self.inner.max_positions

    @property
    def chat_template(self) -> str | None:
        return self.inner.chat_template

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    def generate(self, conversations: Sequence[Conversation],
                 params: GenerationParams | None = None, tools: Tools | None = None,
                 tool_choice: ToolChoice | None = None) -> list[Generation]:
        params = params or GenerationParams()
        specs = as_tool_specs(tools)
        choice = as_tool_choice(tool_choice, specs)
        keys = [generation_key(self.identity, c, params, specs, choice) for c in conversations]
        out: list[Generation | None] = []
        for k in keys:
            hit = self.cache.get(k)
            out.append(self._parsed(k, hit, lambda v: Generation.from_json(v, cached=True)))
        todo = [i for i, g in enumerate(out) if g is None]
        # identical prompts in one batch are generated once
        unique: dict[str, list[int]] = {}
        for i in todo:
            unique.setdefault(keys[i], []).append(i)
        firsts = [idxs[0] for idxs in unique.values()]
        for s in range(0, len(firsts), self.chunk_size):
            part = firsts[s:s + self.chunk_size]
            convs = [conversations[i] for i in part]
            # only backends that take tools are asked with them (third-party ones may not)
            gens = self.inner.generate(convs, params, tools=specs, tool_choice=choice) \
                if specs else self.inner.generate(convs, params)
            self.calls_made += len(part)
            for i, g in zip(part, gens, strict=True):
                self.cache.put(keys[i], "generate", self.identity, g.to_json(), ok=g.ok)
                for j in unique[keys[i]]:
                    out[j] = g
        return [g for g in out if g is not None]

    def _parsed(self, key: str, hit: Any, parse: Callable[[Any], Any]) -> Any:
        """`parse(hit)`, or None (a miss) when the stored value has the wrong shape."""
        if hit is None:
            return None
        try:
            return parse(hit)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            self.cache.hits -= 1
            self.cache.forget(key, f"not a stored call ({type(e).__name__})")
            return None

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[ContinuationScore]]:
        results: list[list[ContinuationScore | None]] = []
        missing: list[tuple[int, int, str]] = []
        for ri, req in enumerate(requests):
            row: list[ContinuationScore | None] = []
            for ci, cont in enumerate(req.continuations):
                key = score_key(self.score_identity, req.prompt, cont)
                hit = self._parsed(key, self.cache.get(key), lambda v: ContinuationScore(**v))
                row.append(hit)
                if hit is None:
                    missing.append((ri, ci, key))
            results.append(row)
        if missing:
            # keep each request's missing continuations together (backends share the prompt)
            by_req: dict[int, list[tuple[int, str]]] = {}
            for ri, ci, key in missing:
                by_req.setdefault(ri, []).append((ci, key))
            order = list(by_req)
            sub = [ScoreRequest(requests[ri].prompt,
                                [requests[ri].continuations[ci] for ci, _ in by_req[ri]])
                   for ri in order]
            scored = self.inner.score(sub)
            self.calls_made += len(missing)
            for ri, fresh in zip(order, scored, strict=True):
                for (ci, key), sc in zip(by_req[ri], fresh, strict=True):
                    self.cache.put(key, "score", self.score_identity,
                                   {"logprob": sc.logprob, "n_tokens": sc.n_tokens,
                                    "n_chars": sc.n_chars, "is_greedy": sc.is_greedy})
                    results[ri][ci] = sc
        return [[s for s in row if s is not None] for row in results]

    def stream(self, conversation, params=None):
        return self.inner.stream(conversation, params)

    # not cached: these serve HTTP prompt scoring and rendering, answered from the model
    def token_logprobs(self, text: str, top: int = 0) -> TokenLogprobs:
        return self.inner.token_logprobs(text, top)

    def complete(self, prompts, params=None):
        return self.inner.complete(prompts, params)

    def tokenize(self, prompt, **kw):
        return self.inner.tokenize(prompt, **kw)

    def detokenize(self, ids):
        return self.inner.detokenize(ids)

    def info(self):
        return self.inner.info()

    def close(self) -> None:
        self.inner.close()
