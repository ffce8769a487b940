"""The files of an improvement loop's folder (a run's `loop/`). The names are the spec's
declared artifacts (`loop.spec`); the loop's modules and the app find them only here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _declared(name: str) -> str:
    from workbench.loop.spec import PIPELINE

    return PIPELINE.artifact(name).path


def round_name(index: int) -> str:
    """A round's folder name: 01, 02, ... (sorted by name is sorted by round)."""
    return f"{index:02d}"


@dataclass(frozen=True)
class RoundFiles:
    """One round's files (`rounds/NN/`)."""

    loop_root: Path
    index: int

    def __post_init__(self):
        object.__setattr__(self, "loop_root", Path(self.loop_root))

    def _file(self, name: str) -> Path:
        return self.loop_root / _declared(name).replace("{value}", round_name(self.index))

    @property
    def folder(self) -> Path:
        return self.record.parent

    @property
    def record(self) -> Path:
        """round.json: the plan, the steps done and what each recorded."""
        return self._file("round")

    @property
    def failures(self) -> Path:
        return self._file("failures")

    @property
    def synth(self) -> Path:
        return self._file("synth")

    @property
    def accepted(self) -> Path:
        return self._file("accepted")

    @property
    def dropped(self) -> Path:
        return self._file("dropped")

    @property
    def review(self) -> Path:
        return self._file("review")

    @property
    def mixture(self) -> Path:
        return self._file("mixture")

    @property
    def train(self) -> Path:
        return self._file("train")

    @property
    def candidate(self) -> Path:
        return self._file("candidate")

    @property
    def report(self) -> Path:
        return self._file("report")


@dataclass(frozen=True)
class LoopFiles:
    """The loop folder's own files; `round(n)` gives a round's."""

    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def _file(self, name: str) -> Path:
        return self.root / _declared(name)

    def round(self, index: int) -> RoundFiles:
        return RoundFiles(self.root, index)

    def round_records(self) -> list[Path]:
        """Every round's round.json, in round order."""
        pattern = _declared("round").replace("{value}", "*")
        return sorted(self.root.glob(pattern))

    @property
    def config(self) -> Path:
        return self._file("config")

    @property
    def state(self) -> Path:
        return self._file("state")

    @property
    def index(self) -> Path:
        return self._file("index")

    @property
    def evals(self) -> Path:
        return self._file("evals")

    @property
    def adapters(self) -> Path:
        return self._file("adapters")

    @property
    def deployed(self) -> Path:
        return self._file("deployed")

    @property
    def judge_ratings(self) -> Path:
        return self._file("judge_ratings")

    @property
    def history(self) -> Path:
        return self._file("history")

    @property
    def history_plot(self) -> Path:
        return self._file("history_plot")
