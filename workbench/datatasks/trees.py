"""A searched task's tree as a file: `TaskTree` (JSON, never pickle), its bytes without
timings (same seed → same bytes), saving and loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from workbench.datatasks.exploreconfig import ExploreConfig
from workbench.datatasks.ledger import Ledger
from workbench.errors import DataError
from workbench.io import atomic_write_bytes, describe_validation_error
from workbench.records import StrictModel

TREE_VERSION = 1


class TreeNode(StrictModel):
    id: int
    parent: int | None
    action: int | None
    move: dict[str, Any] | None
    prior: float
    visits: int
    wins: float
    terminal: bool = False
    sql: str | None = None
    verified: bool | None = None
    observation: str | None = None
    scorer: str | None = None  # prior=choose: which scorer gave this node's children priors
    scorer_why: str | None = None
    reason: str | None = None


class TaskTree(StrictModel):
    """One task's tree, saved as JSON (never pickle)."""

    version: int = TREE_VERSION
    task_id: str
    env_hash: str
    arm: str = Field("", description="The arm (generator + model + settings) that searched.")
    generator: str
    models: list[str]
    config: ExploreConfig
    nodes: list[TreeNode]
    verified_paths: list[list[int]] = Field(default_factory=list)
    reflections: list[dict[str, Any]] = Field(default_factory=list)
    ledger: Ledger

    def node_path(self, node_id: int) -> list[int]:
        """Node ids from the root to `node_id`."""
        return node_path(self.nodes, node_id)


def node_path(nodes: list[TreeNode], node_id: int) -> list[int]:
    by_id = {n.id: n for n in nodes}
    out = [node_id]
    while (parent := by_id[out[-1]].parent) is not None:
        out.append(parent)
    return out[::-1]


def tree_bytes(tree: TaskTree) -> bytes:
    """The tree file's bytes, without timings (same seed → same bytes)."""
    data = tree.model_dump(mode="json")
    data["ledger"] = tree.ledger.counts()
    return (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


def save_tree(tree: TaskTree, path: str | Path) -> Path:
    path = Path(path)
    atomic_write_bytes(path, tree_bytes(tree))
    return path


def load_tree(path: str | Path) -> TaskTree:
    try:
        return TaskTree.model_validate_json(Path(path).read_bytes())
    except OSError as e:
        raise DataError(f"cannot read the tree: {e.strerror}", path=str(path)) from None
    except ValueError as e:
        raise DataError(f"not a search tree: {describe_validation_error(e)}",
                        path=str(path)) from None
