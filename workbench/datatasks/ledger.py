"""What a task's search cost and what the caches saved (`Ledger`)."""

from __future__ import annotations

from typing import ClassVar

from workbench.records import StrictModel


class Ledger(StrictModel):
    """What a task's search cost and what the caches saved."""

    iterations: int = 0
    terminals: int = 0
    verified: int = 0
    executions: int = 0
    executions_saved: int = 0
    probes: int = 0
    model_calls: int = 0
    model_calls_saved: int = 0
    seeded_nodes: int = 0
    escalated_nodes: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    scored_tokens: int = 0
    sandbox_s: float = 0.0
    model_s: float = 0.0
    wall_s: float = 0.0

    TIMINGS: ClassVar[tuple[str, ...]] = ("sandbox_s", "model_s", "wall_s")  # not on disk

    def counts(self) -> dict:
        """The ledger without its timings, as JSON values."""
        return self.model_dump(mode="json", exclude=set(self.TIMINGS))

    def add(self, other: Ledger) -> None:
        for k, v in other.model_dump().items():
            setattr(self, k, getattr(self, k) + v)

    @property
    def hit_rate(self) -> float:
        total = self.executions + self.executions_saved
        return self.executions_saved / total if total else 0.0
