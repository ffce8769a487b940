"""The rounds of a loop's folder on disk: `state.json` (the current and earlier adapters),
each round's `round.json`, and the config its plans were made with. What a verb reads and
writes about rounds goes through here; the models and suites are the evaluator's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workbench.config import dump_config
from workbench.errors import DataError, WorkbenchError
from workbench.io import atomic_write_json, atomic_write_text
from workbench.loop.records import LoopState, Round, round_name
from workbench.runs import outputs_at


class RoundStore:
    """One loop's folder: its state and its rounds, each read and written whole."""

    def __init__(self, root: Path, *, log: Callable[[str], None] = print):
        self.root = Path(root)
        self.files = outputs_at("loop", self.root)
        self.log = log

    def save_config(self, cfg) -> None:
        """The config the loop's plans are made with (`Loop.at` reads it back)."""
        import yaml

        atomic_write_text(self.files.path("config"),
                          yaml.safe_dump(dump_config(cfg), sort_keys=False))

    def state(self) -> LoopState:
        p = self.files.path("state")
        if not p.exists():
            return LoopState()
        try:
            return LoopState.model_validate_json(p.read_bytes())
        except ValueError as e:
            raise DataError(f"not a loop state file ({str(e)[:160]})", path=str(p)) from None

    def save_state(self, st: LoopState) -> None:
        atomic_write_json(self.files.path("state"), st.model_dump(mode="json"))

    def folder(self, index: int) -> Path:
        return self.files.path("round", round_name(index)).parent

    def rounds(self) -> list[Round]:
        return [self._read_round(p) for p in self.files.find("round").values()]

    def _read_round(self, p: Path) -> Round:
        try:
            return Round.model_validate_json(p.read_bytes())
        except ValueError as e:
            raise DataError(f"not a round record ({str(e)[:160]})", path=str(p)) from None

    def round(self, index: int | None = None) -> Round:
        rs = self.rounds()
        if not rs:
            raise WorkbenchError("no rounds yet: run `workbench loop plan CONFIG` first")
        if index is None:
            return rs[-1]
        for r in rs:
            if r.index == index:
                return r
        raise WorkbenchError(f"no round {index} (rounds: {', '.join(str(r.index) for r in rs)})")

    def save(self, r: Round) -> Round:
        atomic_write_json(self.files.path("round", round_name(r.index)),
                          r.model_dump(mode="json"))
        return r
