"""The learned cost model: fitted on the explorer's own attempt log.

Each attempt (one task searched by one arm) is a row: the task's category and difficulty,
the schema's size, the arm, how many arms already failed on the task, and what happened
(verified or not, model tokens, sandbox executions, seconds). Three scikit-learn gradient
boosting models predict, per arm, the probability of a verified trajectory, the cost in
tokens and the seconds. They give the bandit its priors and the explorer its stop rule (skip
a task whose expected cost per verified trajectory is over the cap). Calibration is reported
as the Brier score on held-out tasks next to the base rate's Brier score.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from workbench.records import StrictModel

CATEGORIES = ("lookup", "filter", "aggregation", "join", "group_rank", "time_series",
              "comparison", "composed")


class Attempt(StrictModel):
    """One task searched by one arm (a row of `attempts.jsonl`)."""

    task_id: str
    env_name: str
    category: str
    difficulty: int
    n_tables: int
    n_columns: int
    arm: str
    attempt: int = Field(0, description="0: the first arm tried on the task, 1: the next...")
    prev_errors: int = Field(0, description="Arms that already failed on this task.")
    verified: bool
    tokens: int = Field(0, description="Model tokens (prompt, completion and scored).")
    executions: int = 0
    model_calls: int = 0
    seconds: float = 0.0
    predicted_success: float | None = None
    reason: str = Field("", description="Why this arm was chosen (the escalation log).")

    def cost_units(self, exec_weight: float) -> float:
        return self.tokens + exec_weight * self.executions


def features(category: str, difficulty: int, n_tables: int, n_columns: int, prev_errors: int,
             arm: str, arms: Sequence[str]) -> list[float]:
    row = [float(category == c) for c in CATEGORIES]
    row += [float(difficulty), float(n_tables), float(n_columns), float(prev_errors)]
    row += [float(arm == a) for a in arms]
    return row


class CostModel:
    """Success probability, tokens and seconds per (task context, arm)."""

    def __init__(self, arms: Sequence[str], *, exec_weight: float = 10.0, seed: int = 0) -> None:
        self.arms = list(arms)
        self.exec_weight = exec_weight
        self.seed = seed
        self.fitted = False
        self.rows = 0
        # fitted scikit-learn estimators (untyped), None until `fit` has rows enough
        self._success: Any = None
        self._cost: Any = None
        self._seconds: Any = None
        self._constant: float | None = None

    def fit(self, attempts: Sequence[Attempt]) -> CostModel:
        import numpy as np
        from sklearn.ensemble import GradientBoostingClassifier, GradientBoostingRegressor

        rows = [a for a in attempts if a.arm in self.arms]
        self.rows = len(rows)
        if len(rows) < 8:
            self.fitted = False
            return self
        X = np.array([self._x(a) for a in rows])
        y = np.array([int(a.verified) for a in rows])
        if len(set(y.tolist())) < 2:
            self._constant = float(y[0])
        else:
            self._constant = None
            self._success = GradientBoostingClassifier(n_estimators=60, max_depth=2,
                                                       learning_rate=0.1,
                                                       random_state=self.seed).fit(X, y)
        self._cost = GradientBoostingRegressor(n_estimators=60, max_depth=2,
                                               random_state=self.seed).fit(
            X, np.array([a.cost_units(self.exec_weight) for a in rows]))
        self._seconds = GradientBoostingRegressor(n_estimators=60, max_depth=2,
                                                  random_state=self.seed).fit(
            X, np.array([a.seconds for a in rows]))
        self.fitted = True
        return self

    def _x(self, a: Attempt) -> list[float]:
        return features(a.category, a.difficulty, a.n_tables, a.n_columns, a.prev_errors,
                        a.arm, self.arms)

    def predict(self, context: dict[str, Any], arm: str) -> dict[str, float] | None:
        """{"success", "cost", "seconds"} for a context (category, difficulty, n_tables,
        n_columns, prev_errors) and an arm; None before the model is fitted."""
        if not self.fitted:
            return None
        x = [features(context["category"], context["difficulty"], context["n_tables"],
                      context["n_columns"], context.get("prev_errors", 0), arm, self.arms)]
        p = self._constant if self._constant is not None else \
            float(self._success.predict_proba(x)[0][1])
        return {"success": min(max(p, 0.0), 1.0),
                "cost": max(float(self._cost.predict(x)[0]), 0.0),
                "seconds": max(float(self._seconds.predict(x)[0]), 0.0)}


def held_out_brier(attempts: Sequence[Attempt], arms: Sequence[str], *, folds: int = 5,
                   seed: int = 0) -> dict[str, Any]:
    """Brier score of the success model on held-out tasks (k folds by task id), with the
    base rate's Brier score (predicting the training share) to compare against."""
    rows = [a for a in attempts if a.arm in arms]
    if len(rows) < 2 * folds:
        return {"rows": len(rows), "brier": None, "base_brier": None,
                "note": f"{len(rows)} attempts: too few to fit and hold out"}

    def fold(a: Attempt) -> int:
        return int(hashlib.sha256(a.task_id.encode()).hexdigest(), 16) % folds

    sq, base_sq, n = 0.0, 0.0, 0
    for k in range(folds):
        train = [a for a in rows if fold(a) != k]
        test = [a for a in rows if fold(a) == k]
        if not test or not train:
            continue
        cm = CostModel(arms, seed=seed).fit(train)
        rate = sum(a.verified for a in train) / len(train)
        for a in test:
            pred = cm.predict(a.model_dump(), a.arm)
            p = pred["success"] if pred else rate
            sq += (p - a.verified) ** 2
            base_sq += (rate - a.verified) ** 2
            n += 1
    return {"rows": len(rows), "held_out": n, "brier": round(sq / n, 4) if n else None,
            "base_brier": round(base_sq / n, 4) if n else None}
