"""Kill injection at every write site of `replace_dir`: the final name always holds the old
complete folder or the new complete one after recovery, never neither (RELIABILITY T3/D8)."""

import json
import os
import random
import subprocess
import sys

from conftest import REPO

CHILD = r"""
import os, shutil, sys
from pathlib import Path
import workbench.io as io

root, kill_at = Path(sys.argv[1]), int(sys.argv[2])
calls = {"n": 0}
real_replace, real_rmtree = os.replace, shutil.rmtree

def step(fn):
    def wrapped(*a, **k):
        calls["n"] += 1
        if calls["n"] == kill_at:
            os._exit(137)  # as a SIGKILL would: no cleanup, no finally
        return fn(*a, **k)
    return wrapped

os.replace, shutil.rmtree = step(real_replace), step(real_rmtree)
tmp = root / ".out.tmp"
tmp.mkdir()
(tmp / "version.json").write_text('{"v": "new"}')
io.replace_dir(tmp, root / "out")
"""


def _version(folder):
    return json.loads((folder / "version.json").read_text())["v"]


def test_kill_at_every_step_of_replace_dir_leaves_old_or_new(tmp_path):
    from workbench.io import recover_dir

    rng = random.Random(0)
    points = [1, 2, 3, 4] + [rng.randint(1, 5) for _ in range(16)]  # 20 kills, every site
    seen = set()
    for i, kill_at in enumerate(points):
        root = tmp_path / f"r{i}"
        (root / "out").mkdir(parents=True)
        (root / "out" / "version.json").write_text('{"v": "old"}')
        r = subprocess.run([sys.executable, "-c", CHILD, str(root), str(kill_at)],
                           cwd=REPO, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode in (0, 137), r.stderr
        final = recover_dir(root / "out")
        assert final.is_dir(), f"kill at step {kill_at}: nothing under the final name"
        v = _version(final)
        assert v in ("old", "new")
        seen.add(v)
        assert not list(root.glob(".out.old-*"))  # leftovers cleaned by the recovery
    assert seen == {"old", "new"}  # the kills landed both before and after the switch
