"""Atomic file writes and strict JSONL reading with line-numbered errors."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from workbench.errors import DataError, WorkbenchError

if TYPE_CHECKING:
    from pydantic import BaseModel

T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")
_UMASK = os.umask(0)
os.umask(_UMASK)

# A JSONL line longer than this is refused: a runaway generation or a binary file, not a record.
MAX_LINE_BYTES = 16 * 1024 * 1024


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it replaces `path` in one rename.

    On any exception the temporary file is removed and `path` is left as it was. A `path`
    that exists and is not a regular file (a device, FIFO, socket or folder, or a link to
    one) is refused before anything is written: a rename would put a file in its place.
    """
    path = Path(path)
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f"{suffix}.tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; keep the usual permissions
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def check_replaceable(path: str | os.PathLike) -> None:
    """Refuse (DataError naming it) a path that exists and is not a regular file."""
    import stat

    try:
        st = os.stat(path)  # follows a link: a link to a device is refused too
    except FileNotFoundError:
        return
    except OSError as e:
        raise DataError(f"cannot check the file to write ({e.strerror})", path=str(path),
                        code="not_a_file") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a device" if stat.S_ISCHR(
            st.st_mode) or stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(
            st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise DataError(f"is {kind}, not a regular file; nothing written", path=str(path),
                        code="not_a_file")


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in `folder` durable (the folder's entry table reaches the disk)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on folders; the rename still happened
        pass
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flush every file under `folder` (and the folders), so the rename that publishes the
    folder never reaches the disk before its contents (checkpoints, model conversions)."""
    folder = Path(folder)
    for p in [folder, *folder.rglob("*")]:
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif p.is_dir():
            fsync_dir(p)


def atomic_savefig(fig, path: str | os.PathLike, **kwargs) -> None:
    """Save a matplotlib figure through a temporary file and one rename."""
    path = Path(path)
    with atomic_path(path, suffix=path.suffix) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **kwargs)


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike, *, ours: bool = False
                ) -> None:
    """Put a completed folder `tmp` under the name `final`, replacing any previous one.

    The previous folder is moved aside (`.<name>.old-<pid>`), the new one renamed in, then the
    old one removed; nothing is deleted before its replacement is in place. A kill between
    the two renames leaves the old folder aside and the final name empty for a moment:
    `recover_dir` (called here and by readers) puts it back, so `final` is always the old
    complete folder or the new complete one, never a mixture and never nothing.

    Only a folder the workbench made is ever replaced (`check_made_here`): a user's folder,
    a file or a link under the name `final` is refused before anything moves. `ours=True`
    is for names inside a folder only the workbench writes (its model caches, a run's
    checkpoint folder), where an unfinished earlier attempt must be replaced too.
    """
    import shutil

    tmp, final = Path(tmp), Path(final)
    recover_dir(final)
    if not ours:
        check_made_here(final, tmp)
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
        fsync_dir(final.parent)


# The file each kind of folder the workbench writes finishes with (an index's manifest, an
# adapter's manifest, a checkpoint's or conversion's completion mark, a merge's report, an
# ONNX export's record, a PEFT adapter's config): a folder is replaced only when it holds the
# same one as its replacement, that is, when it is an earlier output of the same kind.
MADE_HERE = ("manifest.json", "COMPLETE", "workbench-source.json", "merge_report.json",
             "export.json", "adapter_config.json")


def check_made_here(final: str | os.PathLike, new: str | os.PathLike | tuple[str, ...]
                    ) -> None:
    """Refuse (WorkbenchError naming it) to replace `final` unless it is absent, an empty
    folder, or a folder holding the same finishing file (MADE_HERE) as `new` (the folder
    that will replace it, or the names of its finishing files, to check before any work)."""
    final = Path(final)
    markers = new if isinstance(new, tuple) else tuple(
        m for m in MADE_HERE if (Path(new) / m).is_file())
    if not os.path.lexists(final):
        return
    if final.is_symlink() or not final.is_dir():
        raise WorkbenchError(f"{final}: exists and is not a folder the workbench made (a file "
                             "or a link); refusing to replace it. Name a new folder.")
    try:
        if not any(final.iterdir()):
            return
    except OSError as e:
        raise WorkbenchError(f"{final}: cannot be read ({e.strerror}); not replaced") from None
    ours = [m for m in markers if (final / m).is_file() and not (final / m).is_symlink()]
    if not ours:
        raise WorkbenchError(f"{final}: exists and was not made by the workbench (it holds "
                             "none of the files an earlier output of this kind would); "
                             "refusing to replace it. Name a new folder, or remove it "
                             "yourself.")


def recover_dir(final: str | os.PathLike) -> Path:
    """Undo an interrupted `replace_dir`: with `final` missing, the newest folder set aside
    under `.<name>.old-*` is renamed back; with `final` present, leftovers are removed."""
    import shutil

    final = Path(final)
    if not final.parent.is_dir():
        return final
    aside = sorted(final.parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside and not final.exists():
        os.replace(aside.pop(), final)
        fsync_dir(final.parent)
    for p in aside:
        shutil.rmtree(p, ignore_errors=True)
    return final


def pid_alive(pid: int | None) -> bool:
    """Whether a process exists and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> int:
    """Write rows (dicts or pydantic models) as JSONL, atomically. Returns the row count."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            if hasattr(row, "model_dump"):
                row = row.model_dump(mode="json", exclude_none=True)
            fh.write(json.dumps(row, ensure_ascii=False))
            fh.write("\n")
            n += 1
    return n


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line to a log with a single write (O_APPEND), then fsync: concurrent
    appenders never interleave within a line, and a crash leaves at most a torn last line,
    which readers skip with `iter_jsonl_raw(..., torn_tail=...)`."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def iter_jsonl_raw(path: str | os.PathLike, *, collect: bool = False,
                   torn_tail: Callable[[DataError], None] | None = None,
                   max_line_bytes: int | None = None) -> Iterator[tuple[int, Any]]:
    """Yield (1-based line number, parsed JSON) for each non-blank line.

    Accepts a UTF-8 BOM and CRLF line ends. Bad UTF-8, bad JSON or an over-long line raise a
    DataError naming the file and line (and the column for bad JSON); with `collect=True` the
    DataError is yielded in place of the value and reading goes on. Lines are read in bounded
    pieces, so an over-long line costs at most the cap in memory. With `torn_tail`, an
    unparsable LAST line without its newline (an append cut short by a crash) is passed to
    `torn_tail` and skipped instead of raised.
    """
    path = Path(path)
    cap = max_line_bytes or MAX_LINE_BYTES
    if not path.exists():
        raise DataError("file not found", path=str(path), code="not_found")
    if not path.is_file():
        raise DataError("not a file", path=str(path), code="not_a_file")
    with open(path, "rb") as fh:
        lineno = 0
        while True:
            raw = fh.readline(cap + 1)
            if not raw:
                break
            lineno += 1
            if len(raw) > cap:
                while raw and not raw.endswith(b"\n"):  # skip the rest, a piece at a time
                    raw = fh.readline(1 << 20)
                value: Any = DataError(f"line is over the {cap}-byte cap", path=str(path),
                                       line=lineno, code="line_too_long")
            else:
                value = _parse_line(raw, lineno, str(path))
            if value is _BLANK:
                continue
            if isinstance(value, DataError) and torn_tail is not None \
                    and not raw.endswith(b"\n") and not fh.peek(1):
                torn_tail(value)
                return
            if isinstance(value, DataError) and not collect:
                raise value
            yield lineno, value


_BLANK = object()


def _parse_line(raw: bytes, lineno: int, path: str) -> Any:
    if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        return DataError(f"invalid UTF-8 byte at column {e.start + 1}", path=path, line=lineno,
                         code="bad_encoding")
    if not text:
        return _BLANK
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return DataError(f"bad JSON at column {e.colno}: {e.msg}", path=path, line=lineno,
                         code="bad_json")
    except RecursionError:  # a line of arrays nested thousands deep: one line, no traceback
        return DataError("JSON nested too deeply to read", path=path, line=lineno,
                         code="bad_json")


@overload
def read_jsonl(path: str | os.PathLike, parse: None = None) -> list[Any]: ...
@overload
def read_jsonl(path: str | os.PathLike, parse: Callable[[Any], T]) -> list[T]: ...


def read_jsonl(path: str | os.PathLike, parse: Callable[[Any], T] | None = None) -> list[Any]:
    """Read a whole JSONL file, converting each row with `parse`.

    `parse` may raise ValueError (or pydantic's ValidationError); it becomes a DataError with
    the file and line. The file is read completely before anything is returned, so a caller
    that writes only after reading never writes on bad input.
    """
    out: list[Any] = []
    for lineno, obj in iter_jsonl_raw(path):
        if parse is None:
            out.append(obj)
            continue
        try:
            out.append(parse(obj))
        except DataError as e:
            raise DataError(_strip_where(e), path=str(path), line=lineno, code=e.code) from None
        except ValueError as e:
            raise DataError(describe_validation_error(e), path=str(path), line=lineno,
                            code=_error_code(e)) from None
    return out


def _strip_where(e: DataError) -> str:
    return str(e.args[0]) if e.path is None else str(e).split(": ", 1)[-1]


def describe_validation_error(e: Exception) -> str:
    """One line from a pydantic ValidationError (every problem, field path first)."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return str(e)
    parts = []
    for err in errors():
        loc = ".".join(s if (s := str(x)).isprintable() else repr(s) for x in err.get("loc", ()))
        msg = err.get("msg", "invalid")
        if err.get("type") == "missing":
            msg = "missing field"
        elif "input" in err and err.get("type") != "value_error":
            msg = f"{msg} (got {json.dumps(err['input'], default=str)[:60]})"
        msg = msg.removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _error_code(e: Exception) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):
        for err in errors():
            ctx = err.get("ctx") or {}
            inner = ctx.get("error")
            if isinstance(inner, DataError):
                return inner.code
            code = getattr(inner, "code", None)
            if code:
                return code
            if err.get("type") == "missing":
                return "missing_field"
            if err.get("type", "").endswith("_type") or err.get("type") == "string_type":
                return "wrong_type"
        return "invalid"
    return getattr(e, "code", "invalid")


def read_regular_file(path: str | os.PathLike, *, cap: int, what: str = "file",
                      missing: str = "no such file") -> bytes:
    """The bytes of `path` when it is a regular file (never through a link, never a device,
    FIFO or folder) of at most `cap` bytes; anything else is a DataError of one line naming
    the file (`missing`: what to say when there is none)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise DataError(missing, path=str(path), code="not_found") from None
    except OSError as e:
        why = f"is a link; a {what} is read only as a regular file" if os.path.islink(path) \
            else f"cannot be read ({e.strerror})"
        raise DataError(f"{why}; not read", path=str(path), code="not_a_file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DataError("is not a regular file (a folder, device or FIFO); not read",
                            path=str(path), code="not_a_file")
        if st.st_size > cap:
            raise DataError(f"{st.st_size} bytes, over {cap}; not a {what}", path=str(path),
                            code="too_large")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(cap + 1)
    finally:
        os.close(fd)


def read_json_object(path: str | os.PathLike, *, cap: int, what: str, missing: str,
                     rerun: str) -> dict[str, Any]:
    """The JSON object in the regular file `path` (`read_regular_file`); bad UTF-8, bad JSON
    or another JSON type is a DataError of one line naming the file and what to do
    (`rerun`, e.g. "re-run the evaluation")."""
    raw = read_regular_file(path, cap=cap, what=what, missing=missing)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"invalid UTF-8 byte at offset {e.start}; not a {what}",
                        path=str(path), code="bad_encoding") from None
    except json.JSONDecodeError as e:
        raise DataError(f"bad JSON at line {e.lineno} column {e.colno}: {e.msg}; not a "
                        f"{what} ({rerun})", path=str(path), code="bad_json") from None
    if not isinstance(data, dict):
        raise DataError(f"holds a JSON {type(data).__name__}, not a {what}", path=str(path),
                        code="wrong_type")
    return data


def validate_versioned(data: dict[str, Any], model: type[M], path: str | os.PathLike, *,
                       what: str, rerun: str, version: int = 1) -> M:
    """`data` (a report's JSON object) as `model`. A file without `schema_version` (written
    before it existed) reads as `version`; another version, or a field that does not fit, is
    a DataError of one line naming the file."""
    got = data.get("schema_version", version)
    if got != version:
        raise DataError(f"schema_version {json.dumps(got)[:20]} is not {version}, the one "
                        f"this workbench reads; use the workbench version that wrote it or "
                        f"{rerun}", path=str(path), code="schema_version")
    try:
        return model.model_validate(data)
    except ValueError as e:
        problems = " ".join(describe_validation_error(e).split())  # one line, always
        raise DataError(f"not a {what} of this workbench version ({problems[:300]}); {rerun}",
                        path=str(path), code="old_schema") from None


def sha256_file(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_child(cmd: list[str], *, grace_s: float = 8.0, **popen) -> int:
    """Run a child process in its own process group and pass SIGTERM / SIGINT on to the whole
    group; a group that has not exited `grace_s` seconds later is killed. Returns the child's
    exit code, so stopping the parent never orphans the child (or the child's children)."""
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, start_new_session=True, **popen)

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = proc.wait()
        return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention
    finally:
        for s, h in old.items():
            signal.signal(s, h)
