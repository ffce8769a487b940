"""The files of a run's `agent/` folder, by the names the agent spec declares
(`agent_packs.spec`): the packs' code finds its outputs only here. One folder may hold several
packs' outputs (their names differ: KGV's `sft.messages.jsonl`, litsearch's
`litsearch_sft.messages.jsonl`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _declared(name: str) -> str:
    from workbench.agent_packs.spec import PIPELINE

    return PIPELINE.artifact(name).path


@dataclass(frozen=True)
class AgentFiles:
    root: Path  # the run's agent/ folder

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    def _file(self, name: str, value: str | None = None) -> Path:
        path = _declared(name)
        return self.root / (path.replace("{value}", value) if value is not None else path)

    # --- KGV
    @property
    def trajectories(self) -> Path:
        """The folder of the KGV conditions' trajectories (and the teacher's runs)."""
        return self._file("agent").parent

    def trajectory(self, condition: str) -> Path:
        """A KGV condition's trajectories (closed_book, rag, agent, agent_sft)."""
        return self._file(condition)

    def teacher_run(self, i: int) -> Path:
        return self.trajectories / f"teacher.{i}.jsonl"

    def timing(self, condition: str) -> Path:
        return self.trajectories / f"{condition}.timing.json"

    @property
    def teacher(self) -> Path:
        return self._file("teacher")

    @property
    def sft(self) -> Path:
        """KGV's turn-level SFT data from the teacher's trajectories."""
        return self._file("sft")

    @property
    def student(self) -> Path:
        """KGV's student adapter folder."""
        return self._file("adapter").parent

    # --- RF design
    def rf(self, condition: str) -> Path:
        return self._file("rf", condition)

    @property
    def rf_index(self) -> Path:
        return self._file("rf_index")

    # --- litsearch
    def litsearch(self, condition: str) -> Path:
        return self._file("litsearch", condition)

    @property
    def litsearch_teacher(self) -> Path:
        return self._file("litsearch_teacher")

    @property
    def litsearch_sft_data(self) -> Path:
        """The oracle teacher's dialogues as SFT data (the adapter is `litsearch_sft/`)."""
        return self._file("litsearch_sft_data")

    @property
    def litsearch_preferences(self) -> Path:
        return self._file("preferences")
