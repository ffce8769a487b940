"""Checkpoints that a crash can never half-write, and resume that finds only complete ones.

A checkpoint is written into `.checkpoint-N.tmp`, completed with a `COMPLETE` marker, fsynced,
then renamed to `checkpoint-N` (`replace_dir`: a previous `checkpoint-N` is moved aside first
and removed only once the new one is in place). Rotation renames an old checkpoint out of the
`checkpoint-N` names before deleting it, and only after the newer ones are complete, so a kill
mid-deletion never leaves a half-deleted folder that looks complete. Resume (`latest_checkpoint`)
first undoes an interrupted replacement and removes leftovers (`recover`), then takes the newest
`checkpoint-N` that has the marker, so a crash at any point (even a folder named `checkpoint-N`
left by another tool) is never picked. Everything is safetensors or JSON: loading a checkpoint
never unpickles anything.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.io import fsync_dir, fsync_tree, recover_dir, replace_dir

MARKER = "COMPLETE"
_NAME = re.compile(r"^checkpoint-(\d+)$")
_ASIDE = re.compile(r"^\.(checkpoint-\d+)\.old-\d+$")  # set aside by an interrupted replace_dir


def _optimizer_tensors(opt) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors, meta = {}, {"param_groups": sd["param_groups"], "state_keys": {}}
    for idx, st in sd["state"].items():
        meta["state_keys"][str(idx)] = sorted(st)
        for k, v in st.items():
            tensors[f"state.{idx}.{k}"] = v.detach().cpu().contiguous()
    return tensors, meta


def save_checkpoint(folder: Path, step: int, *, model, optimizer, state: dict[str, Any],
                    fault: Callable[[str], None] | None = None,
                    extra: dict[str, dict[str, Any]] | None = None) -> Path:
    """`fault(stage)` is a test hook called between the writes (crash injection).
    `extra`: more safetensors files of the checkpoint ({file name: {name: tensor}}, e.g.
    GRPO's best adapter so far), written before the marker like the rest."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    fault = fault or (lambda stage: None)
    final = folder / f"checkpoint-{step}"
    tmp = folder / f".checkpoint-{step}.tmp"
    recover(folder)  # leftovers of an earlier process killed while saving (the tmp among them)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    fault("adapter")
    tensors, meta = _optimizer_tensors(optimizer)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "optimizer.json").write_text(json.dumps(meta))
    fault("optimizer")
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"cuda{i}"] = s
    save_file(rng, str(tmp / "rng.safetensors"))
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # legacy=True: MT19937's (name, keys, pos, ...)
    full_state = dict(state, step=step, python_rng=_jsonable(random.getstate()),
                      numpy_rng=[np_state[0], np_state[1].tolist(), *np_state[2:]])
    (tmp / "trainer_state.json").write_text(json.dumps(full_state))
    for name, group in (extra or {}).items():
        save_file({k: v.detach().cpu().contiguous() for k, v in group.items()},
                  str(tmp / name))
    fault("state")
    (tmp / MARKER).write_text("ok")
    fsync_tree(tmp)
    replace_dir(tmp, final, ours=True)  # a previous checkpoint-N goes only once this one is in
    fault("renamed")
    return final


def _jsonable(obj):
    if isinstance(obj, tuple):
        return [_jsonable(x) for x in obj]
    return obj


def _tupled(obj):
    if isinstance(obj, list):
        return tuple(_tupled(x) for x in obj)
    return obj


def complete_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    found = []
    for p in Path(folder).glob("checkpoint-*"):
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / MARKER).exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint (after `recover`), or None."""
    recover(folder)
    done = complete_checkpoints(folder)
    return done[-1] if done else None


def recover(folder: Path) -> None:
    """Clean up after a process killed while saving or rotating: a checkpoint set aside by an
    interrupted `replace_dir` is put back (or dropped when its successor is in place), and
    unfinished writes (`.checkpoint-N.tmp`) and half-deleted folders (`.checkpoint-N.del-*`)
    are removed. Only the process that writes checkpoints may call it (resume, save)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for p in list(folder.iterdir()):
        m = _ASIDE.match(p.name)
        if m:
            recover_dir(folder / m.group(1))
    for pattern in (".checkpoint-*.tmp", ".checkpoint-*.del-*"):
        for p in folder.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def rotate(folder: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints. Each older one is first renamed out of
    the `checkpoint-N` names (one atomic step), then deleted: a kill mid-deletion leaves a
    `.checkpoint-N.del-*` leftover for `recover`, never a half-deleted `checkpoint-N`."""
    folder = Path(folder)
    for p in complete_checkpoints(folder)[:-keep] if keep > 0 else []:
        doomed = folder / f".{p.name}.del-{os.getpid()}"
        os.replace(p, doomed)
        fsync_dir(folder)
        shutil.rmtree(doomed, ignore_errors=True)
    recover(folder)


def load_checkpoint(ckpt: Path, *, model, optimizer) -> dict[str, Any]:
    import numpy as np
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(ckpt / "adapter_model.safetensors"))
    set_peft_model_state_dict(model, weights)
    meta = json.loads((ckpt / "optimizer.json").read_text())
    tensors = load_file(str(ckpt / "optimizer.safetensors"))
    state = {int(idx): {k: tensors[f"state.{idx}.{k}"] for k in keys}
             for idx, keys in meta["state_keys"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    rng = load_file(str(ckpt / "rng.safetensors"))
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(rng) if k.startswith("cuda")]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    st = json.loads((ckpt / "trainer_state.json").read_text())
    random.setstate(_tupled(st["python_rng"]))
    ns = st["numpy_rng"]
    np.random.set_state((ns[0], np.array(ns[1], dtype=np.uint32), *ns[2:]))
    return st
