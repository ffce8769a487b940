"""Progress bars that show on a terminal and stay silent in logs (CI, pipes, files)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def bars_enabled() -> bool:
    if os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        return False
    return sys.stderr.isatty()


def progress(items: Iterable[T], desc: str = "", total: int | None = None,
             unit: str = "it") -> Iterator[T]:
    if not bars_enabled():
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, desc=desc, total=total, unit=unit, dynamic_ncols=True)


def quiet_libraries() -> None:
    """Silence third-party progress bars and chatter unless a person is watching."""
    if not bars_enabled():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
