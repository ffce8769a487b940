"""Kill injection at every write site of `replace_dir`: the final name always holds the old
complete folder or the new complete one after recovery, never neither (RELIABILITY T3/D8)."""

import json
import os
import random
import subprocess
import sys

import pytest

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
(tmp / "manifest.json").write_text("{}")  # an output of the workbench's, like the old one
io.replace_dir(tmp, root / "out")
"""


def _version(folder):
    return json.loads((folder / "version.json").read_text())["v"]


def test_kill_at_every_step_of_replace_dir_leaves_old_or_new(tmp_path, kill_injection):
    from workbench.io import recover_dir

    rng = random.Random(0)
    points = [1, 2, 3, 4] + [rng.randint(1, 5) for _ in range(16)]  # 20 kills, every site
    seen = set()
    for i, kill_at in enumerate(points):
        root = tmp_path / f"r{i}"
        (root / "out").mkdir(parents=True)
        (root / "out" / "version.json").write_text('{"v": "old"}')
        (root / "out" / "manifest.json").write_text("{}")
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


def test_an_atomic_write_never_replaces_what_is_not_a_regular_file(tmp_path):
    """A device, FIFO, socket or folder (or a link to one) under the target name is refused
    before anything is written; it is still there, unchanged, and no temp file is left."""
    import socket
    import stat

    from workbench.errors import DataError
    from workbench.io import atomic_write_text, write_jsonl

    targets = {"fifo": tmp_path / "fifo", "folder": tmp_path / "folder",
               "socket": tmp_path / "sock", "link": tmp_path / "link"}
    os.mkfifo(targets["fifo"])
    targets["folder"].mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(targets["socket"]))
    targets["link"].symlink_to(targets["fifo"])
    if os.geteuid() == 0:  # a character device like /dev/full, made where the test may write
        targets["device"] = tmp_path / "full"
        os.mknod(targets["device"], 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    before = {k: os.lstat(p) for k, p in targets.items()}
    for name, target in targets.items():
        for write in (lambda p: atomic_write_text(p, "x"), lambda p: write_jsonl(p, [{"a": 1}])):
            with pytest.raises(DataError, match="not a regular file") as e:
                write(target)
            assert str(target) in str(e.value)
        after = os.lstat(target)
        assert (after.st_mode, after.st_ino) == (before[name].st_mode, before[name].st_ino)
    sock.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in
                                                                targets.values())


def test_replace_dir_replaces_only_a_folder_the_workbench_made(tmp_path):
    """A user's folder (or a file, or a link) under the final name is refused and left as it
    was; an empty folder or an earlier output of the same kind is replaced."""
    from workbench.errors import WorkbenchError
    from workbench.io import replace_dir

    def new(name="manifest.json"):
        t = tmp_path / f".new-{len(list(tmp_path.iterdir()))}"
        t.mkdir()
        (t / name).write_text("{}")
        return t

    user = tmp_path / "thesis"
    user.mkdir()
    (user / "chapter1.tex").write_text("precious")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "manifest.json").write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    afile = tmp_path / "afile"
    afile.write_text("x")
    other_kind = tmp_path / "adapter"
    other_kind.mkdir()
    (other_kind / "adapter_config.json").write_text("{}")
    for target in (user, link, afile, other_kind):
        t = new()
        with pytest.raises(WorkbenchError, match="refusing to replace"):
            replace_dir(t, target)
        assert t.is_dir()  # the caller's temp folder is the caller's to remove
    assert (user / "chapter1.tex").read_text() == "precious"
    assert link.is_symlink() and (elsewhere / "manifest.json").exists()
    assert afile.read_text() == "x" and (other_kind / "adapter_config.json").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    replace_dir(new(), empty)
    assert (empty / "manifest.json").exists()
    earlier = tmp_path / "index"
    replace_dir(new(), earlier)
    replace_dir(new(), earlier)  # an earlier output of the same kind: replaced
    assert (earlier / "manifest.json").exists()
    assert not list(tmp_path.glob(".index.old-*"))


def test_rag_build_refuses_a_users_folder_before_any_work(tmp_path, cli):
    user = tmp_path / "victim"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    r = cli("rag", "build", str(REPO / "datasets" / "rf"), "--out", str(user))
    assert r.returncode == 1 and "not made by the workbench" in r.stderr
    assert "chunks" not in r.stderr  # refused before reading the corpus
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]
