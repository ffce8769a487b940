"""The files of a trajsynth folder: a run's `trajsynth/`, or the folder `workbench trajsynth
... -o OUT` names. The names are the spec's declared artifacts (`trajsynth.spec`); the
pipeline, its CLI, the downstream check and the app find them only through this class."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _declared(name: str) -> str:
    from workbench.trajsynth.spec import PIPELINE

    return PIPELINE.artifact(name).path


@dataclass(frozen=True)
class TrajsynthFiles:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def _file(self, name: str) -> Path:
        return self.root / _declared(name)

    @property
    def tasks(self) -> Path:
        """The verified task pool (`Task` rows)."""
        return self._file("tasks")

    @property
    def summary(self) -> Path:
        """explore.json: what the search found and what it cost."""
        return self._file("explore")

    @property
    def trie(self) -> Path:
        return self._file("trie")

    @property
    def trees(self) -> Path:
        return self._file("trees")

    def tree(self, task_id: str) -> Path:
        """One task's search tree."""
        return self.trees / f"{task_id}.json"

    @property
    def attempts(self) -> Path:
        return self._file("attempts")

    @property
    def sft(self) -> Path:
        return self._file("sft")

    @property
    def preferences(self) -> Path:
        return self._file("preferences")

    @property
    def icl_bank(self) -> Path:
        return self._file("icl_bank")

    @property
    def icl_index(self) -> Path:
        return self._file("icl_index")

    def adapter(self, name: str) -> Path:
        """The folder of a downstream adapter (`sft_adapter`, `sft_dpo_adapter`)."""
        return self._file(name).parent

    @property
    def step_pairs(self) -> Path:
        return self._file("step_pairs")

    @property
    def reference_cache(self) -> Path:
        return self._file("dpo_reference_cache")

    def downstream(self, condition: str) -> Path:
        """One condition's downstream rows."""
        return self.root / _declared("downstream").replace("{value}", condition)

    @property
    def downstream_report(self) -> Path:
        return self._file("downstream_report")
