"""Watching a CTranslate2 generation token by token: a row stops once its text holds a stop
string, every row once the client has left; while streaming, text that may begin a stop
string is held back; a seeded call keeps the seed lock until its first draw.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from workbench.models.postprocess import cut_at_stop
from workbench.models.tools import strip_special_tokens

_SEED_LOCK = threading.Lock()  # set_random_seed is process-wide


class Watch:
    """The per-token callbacks of a call's batches: stop a row once its text holds a stop
    string, and every row once the cancel event is set. Decodes ids like the results."""

    def __init__(self, n: int, stops: Sequence[str], cancel: threading.Event | None, tok,
                 keep_markers: bool):
        self.stops, self.cancel, self.tok, self.keep = tuple(stops), cancel, tok, keep_markers
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.hit = [False] * n
        # a stop of k characters spans at most 4k tokens (byte-level pieces)
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 4

    def decode(self, ids: Sequence[int]) -> str:
        if self.keep:  # tool-call markers may be special tokens (Mistral, Llama 3)
            return strip_special_tokens(self.tok.decode(ids, skip_special_tokens=False),
                                        self.tok.all_special_tokens)
        return self.tok.decode(ids, skip_special_tokens=True)

    def of(self, rows: Sequence[int]):
        """The callback of one batch holding these rows (None when nothing is watched)."""
        if not self.stops and self.cancel is None:
            return None
        return lambda step: self._step(rows[step.batch_id], step.token_id)

    def _step(self, i: int, token_id: int) -> bool:
        if self.cancel is not None and self.cancel.is_set():
            return True
        if not self.stops:
            return False
        row = self.ids[i]
        row.append(token_id)
        tail = self.tok.decode(row[-self.window:], skip_special_tokens=not self.keep)
        if any(s in tail for s in self.stops) and cut_at_stop(self.decode(row), self.stops)[1]:
            self.hit[i] = True
            return True
        return False


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that begins some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class SeedGate:
    """`set_random_seed` under the process-wide seed lock, held until the fresh generator's
    worker thread has drawn its first number (it calls back with its first token), so that
    concurrent seeded calls each start from their own seed."""

    def __init__(self, seed: int):
        import ctranslate2

        _SEED_LOCK.acquire()
        self._held, self._mu = True, threading.Lock()
        try:
            ctranslate2.set_random_seed(seed & 0xFFFFFFFF)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        with self._mu:
            if self._held:
                self._held = False
                _SEED_LOCK.release()

    def wrap(self, callback):
        def first_draw_done(step) -> bool:
            self.release()
            return bool(callback(step)) if callback is not None else False

        return first_draw_done
