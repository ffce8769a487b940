"""Adapter tensors on the wire and on disk: ArrayRecord conversion, FedAvg / FFA-LoRA
aggregation, and the server's per-round global adapter (atomic, hash-checked, resumable).

Tensors are NumPy float32 here; the training library speaks torch, and `to_torch` /
`from_torch` are the only crossings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.io import atomic_path, atomic_write_json

if TYPE_CHECKING:
    from flwr.app import ArrayRecord

State = dict[str, np.ndarray]


def from_torch(state: Mapping[str, Any]) -> State:
    return {k: v.detach().cpu().float().numpy().copy() for k, v in state.items()}


def to_torch(state: Mapping[str, np.ndarray]) -> dict:
    import torch

    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def to_record(state: Mapping[str, np.ndarray]) -> ArrayRecord:
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({k: Array.from_numpy_ndarray(np.ascontiguousarray(v))
                        for k, v in sorted(state.items())})


def from_record(record: ArrayRecord) -> State:
    return {k: record[k].numpy() for k in record}


def state_bytes(state: Mapping[str, np.ndarray]) -> int:
    return int(sum(v.nbytes for v in state.values()))


def state_hash(state: Mapping[str, np.ndarray]) -> str:
    """sha256 over names, shapes, dtypes and bytes, in name order."""
    h = hashlib.sha256()
    for k in sorted(state):
        v = np.ascontiguousarray(state[k])
        h.update(f"{k}|{v.dtype.str}|{v.shape}\n".encode())
        h.update(v.tobytes())
    return h.hexdigest()


def is_a(name: str) -> bool:
    return ".lora_A." in name


def aggregate(states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float], *,
              method: str = "fedavg", previous: Mapping[str, np.ndarray] | None = None
              ) -> State:
    """The weighted mean of the sites' adapters (weights: their example counts).

    fedavg averages every tensor, A and B separately; ffa averages only the B tensors and
    keeps A from `previous` (the global adapter every site started the round from): with A
    shared and frozen, mean(B)·A is exactly mean(B·A). Accumulates in float64.
    """
    if not states:
        raise WorkbenchError("nothing to aggregate: no replies")
    if len(states) != len(weights):
        raise WorkbenchError(f"{len(states)} states but {len(weights)} weights")
    total = float(sum(weights))
    if total <= 0:
        raise WorkbenchError(f"example counts sum to {total}: cannot weight the average")
    names = set(states[0])
    for i, s in enumerate(states[1:], 1):
        if set(s) != names:
            diff = sorted(names ^ set(s))[:3]
            raise WorkbenchError(f"reply {i} carries different tensors than reply 0: {diff}")
    if method == "ffa" and previous is None:
        raise WorkbenchError("ffa keeps A from the previous global adapter: pass previous=")
    out: State = {}
    kept = previous if method == "ffa" else None  # ffa: A as it was
    for k in sorted(names):
        if kept is not None and is_a(k):
            out[k] = np.asarray(kept[k], dtype=np.float32).copy()
            continue
        acc = np.zeros(states[0][k].shape, dtype=np.float64)
        for s, w in zip(states, weights, strict=True):
            acc += np.asarray(s[k], dtype=np.float64) * (w / total)
        out[k] = acc.astype(np.float32)
    return out


def product_gap(states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float],
                merged: Mapping[str, np.ndarray]) -> float:
    """How far the aggregated adapter's update is from the average of the sites' updates:
    max over modules of ‖B̄Ā − mean(B_i A_i)‖_F / ‖mean(B_i A_i)‖_F. 0 for FFA-LoRA."""
    total = float(sum(weights))
    worst = 0.0
    for a_name in (k for k in merged if is_a(k)):
        b_name = a_name.replace(".lora_A.", ".lora_B.")
        if b_name not in merged:
            continue
        mean_ba = sum((w / total) * (s[b_name].astype(np.float64) @ s[a_name].astype(np.float64))
                      for s, w in zip(states, weights, strict=True))
        ba = merged[b_name].astype(np.float64) @ merged[a_name].astype(np.float64)
        norm = float(np.linalg.norm(mean_ba))
        if norm > 0:
            worst = max(worst, float(np.linalg.norm(ba - mean_ba)) / norm)
    return worst


# --- the server's global adapter, one folder per round ---------------------------------------

class GlobalStore:
    """`<folder>/round-0003/adapter.safetensors` + `round.json` for every round that ended,
    written atomically; `state.json` points at the last one. Round 0 is the initial adapter.
    A folder without a matching hash is not a saved round (a crash mid-write)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def round_dir(self, rnd: int) -> Path:
        return self.folder / f"round-{rnd:04d}"

    def save(self, rnd: int, state: Mapping[str, np.ndarray], info: dict) -> str:
        from safetensors.numpy import save_file

        d = self.round_dir(rnd)
        d.mkdir(parents=True, exist_ok=True)
        digest = state_hash(state)
        with atomic_path(d / "adapter.safetensors") as tmp:
            save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(tmp))
        atomic_write_json(d / "round.json", {**info, "round": rnd, "sha256": digest})
        atomic_write_json(self.folder / "state.json", {"round": rnd, "sha256": digest,
                                                        "failed_streak":
                                                            info.get("failed_streak", 0)})
        return digest

    def load(self, rnd: int) -> State:
        from safetensors.numpy import load_file

        d = self.round_dir(rnd)
        info = json.loads((d / "round.json").read_text())
        state = load_file(str(d / "adapter.safetensors"))
        if state_hash(state) != info["sha256"]:
            raise WorkbenchError(f"{d}: adapter.safetensors does not match round.json's "
                                 f"sha256 (a torn write?); delete the folder to resume from "
                                 f"the round before")
        return state

    def latest(self) -> tuple[int, State, dict] | None:
        """The last round saved completely: (round, state, its round.json), or None."""
        rounds = sorted((int(p.name.split("-")[1]) for p in self.folder.glob("round-*")
                         if p.name.split("-")[1].isdigit()), reverse=True)
        for rnd in rounds:
            d = self.round_dir(rnd)
            if (d / "round.json").exists() and (d / "adapter.safetensors").exists():
                from safetensors import SafetensorError

                try:
                    state = self.load(rnd)
                except (WorkbenchError, OSError, ValueError, SafetensorError):
                    continue
                return rnd, state, json.loads((d / "round.json").read_text())
        return None
