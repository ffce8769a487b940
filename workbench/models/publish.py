"""Cache folders published once: how a converted model lands under its final name.

A conversion is written into `.<name>.tmp-<pid>` next to the final folder, finished with its
marker file, fsynced and renamed in with `replace_dir`, so the final name only ever holds a
complete conversion (a previous one is removed only once the new one is in); a folder under
the final name that the caller's `complete` check refuses is converted again. Conversions of
one folder hold a lock (`.<name>.lock`): a second process waits and then uses the first one's
folder, and temp folders found while holding it are leftovers of a killed conversion. The
GGUF conversion (`local.convert_gguf`) and the CTranslate2 one (`ct2_convert.convert_ct2`)
both publish this way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from workbench.io import fsync_tree, recover_dir, replace_dir


def publish_once(target: Path, write: Callable[[Path], None], *,
                 complete: Callable[[Path], bool], force: bool = False) -> bool:
    """Make `target` a complete folder: keep it when `complete(target)` holds (unless
    `force`), else call `write(tmp)`, which fills a fresh temp folder and writes the finishing
    marker last, and publish that folder as `target`. Whether this call published one."""
    if complete(target) and not force:
        if _leftovers(target):  # of a killed conversion; unless one is running right now
            with _conversion_lock(target, wait=False) as held:
                if held:
                    _tidy(target)
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target):
        _tidy(target)
        if complete(target) and not force:  # converted meanwhile, or put back just now
            return False
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        try:
            write(tmp)
            fsync_tree(tmp)
            replace_dir(tmp, target, ours=True)  # the model cache
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return True


@contextlib.contextmanager
def _conversion_lock(target: Path, *, wait: bool = True) -> Iterator[bool]:
    """An exclusive lock on `.<name>.lock` next to `target`, released when the process ends
    however it ends. Yields whether it is held (always, with `wait`)."""
    import fcntl

    fd = os.open(target.parent / f".{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def _leftovers(target: Path) -> list[Path]:
    return [*target.parent.glob(f".{target.name}.tmp-*"),
            *target.parent.glob(f".{target.name}.old-*")]


def _tidy(target: Path) -> None:
    """With the lock held: put back a folder set aside by a `replace_dir` killed between its
    renames, and remove the temp folders of killed conversions."""
    recover_dir(target)
    for p in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
