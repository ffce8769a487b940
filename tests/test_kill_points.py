"""Kill injection at every write site of a checkpoint save + rotation and of a GGUF conversion:
after a kill at any of them, the next start finds the old or the new version complete and
loadable (never neither, never a mixture), removes the leftovers, and a re-run finishes
(docs/reliability.md: the kill-injection rows of issue 10).

One runner process (`python tests/test_kill_points.py SCENARIO ROOT`) imports torch and peft
once and forks a child per kill point (a fork costs milliseconds, a fresh interpreter seconds).
The child counts calls to the file-system functions a writer uses (mkdir, open for writing,
safetensors writes, fsync, rename/replace, unlink, rmdir) and ends itself with `os._exit`, as a
SIGKILL would (no cleanup, no `finally`), just before the k-th call (or just after the last
one). A dry run counts the sites first; then every site is killed at: the disk a kill after
call k leaves is the one a kill before call k+1 leaves, so this is every state a kill can leave.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
VALUE = {"old": 0.25, "new": 0.75, "rerun": 0.5}  # adapter weights of each version


# ------------------------------------------------------------------ shared by runner and test

def tiny_session(folder: Path, *, step: int, version: str, keep: int) -> SimpleNamespace:
    """The parts of a TrainingSession that `save_checkpoint` uses: a 1-layer LoRA model whose
    adapter weights all equal VALUE[version], an AdamW with state, metrics naming the version."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=2, lora_alpha=4,
                                                             target_modules=["q_proj", "v_proj"]))
    # PEFT's model card (README.md) compiles a Jinja template on every save: half the time
    # of a save here; a plain write keeps the write site
    model.create_or_update_model_card = lambda out: Path(out, "README.md").write_text("tiny")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        for p in params:
            p.fill_(VALUE[version])
    # domain_eval.keep_best's adapter so far: one more file of the checkpoint, same version
    best = {"w": torch.full((4,), VALUE[version])}
    return SimpleNamespace(checkpoint_dir=folder, rank=0, step=step, model=model,
                           optimizer=opt, metrics=[{"version": version}], total=10,
                           best_step=step, best_score=VALUE[version], best_state=best,
                           cfg=SimpleNamespace(save_total_limit=keep))


def gguf_source(root: Path):
    """A GGUF file under `root/src`, made once: every trial of a scenario converts the same
    file (the conversion's folder name hashes its path), into its own WB_HOME."""
    from workbench.models.resolve import ModelSource

    if not (root / "src" / "tiny.gguf").exists():
        (root / "src").mkdir(parents=True, exist_ok=True)
        (root / "src" / "tiny.gguf").write_bytes(b"GGUF" + bytes(64))
    return ModelSource(kind="gguf", name="tiny", path=root / "src", gguf_file="tiny.gguf")


GGUF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja")  # what the real conversion writes


def fake_conversion(version: str):
    """Stands in for the heavy dequantise-and-save step: several files naming `version`."""
    def write(source, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in GGUF_FILES:
            (folder / name).write_text(json.dumps({"version": version, "file": name}))
    return write


# ------------------------------------------------------------------ the runner (child side)

WRITE_MODES = set("wax+")
REAL_OPEN = builtins.open


class KillAt:
    """Counts calls to the write functions; at call `k` ends the process before or after it."""

    def __init__(self, k: int, when: str):
        self.k, self.when, self.n, self.sites = k, when, 0, []

    def wrap(self, name: str, fn, counts=lambda *a, **kw: True):
        def wrapped(*a, **kw):
            if not counts(*a, **kw):
                return fn(*a, **kw)
            self.n += 1
            self.sites.append(name)
            if self.n == self.k and self.when == "before":
                os._exit(137)
            try:
                return fn(*a, **kw)
            finally:  # also when the call raised (a mkdir of a missing parent)
                if self.n == self.k and self.when == "after":
                    os._exit(137)
        return wrapped

    def install(self) -> None:
        import safetensors.torch as st

        for name in ("mkdir", "replace", "rename", "unlink", "rmdir", "fsync"):
            setattr(os, name, self.wrap(name, getattr(os, name)))
        st.serialize_file = self.wrap("safetensors", st.serialize_file)
        writing = self.wrap("open-w", builtins.open,
                            lambda file, mode="r", *a, **kw: bool(WRITE_MODES & set(mode)))
        builtins.open = io.open = writing


def _action(scenario: str):
    """The write under test, as a function of the trial's folder."""
    if scenario in ("rotate", "resave"):
        from workbench.train.session import save_checkpoint

        session = tiny_session(Path(), step=3, version="new",
                               keep=1 if scenario == "rotate" else 2)

        def save(root: Path) -> None:
            session.checkpoint_dir = root / "ckpts"
            save_checkpoint(session)
        return save
    from workbench.models import local

    local._write_conversion = fake_conversion("new")

    def convert(root: Path) -> None:
        os.environ["WB_HOME"] = str(root / "home")
        local.convert_gguf(gguf_source(root.parent), force=scenario == "gguf-force")
    return convert


def _prepare(template: Path, scenario: str) -> None:
    """The state before the write: the old version in place (none for a first conversion)."""
    from workbench.train.session import save_checkpoint

    if scenario in ("rotate", "resave"):
        for step in (2, 3) if scenario == "resave" else (2,):
            save_checkpoint(tiny_session(template / "ckpts", step=step, version="old", keep=2))
        return
    template.mkdir(parents=True)
    gguf_source(template.parent)  # the GGUF file, shared by every trial
    if scenario == "gguf-force":
        from workbench.models import local

        os.environ["WB_HOME"] = str(template / "home")
        local._write_conversion = fake_conversion("old")
        local.convert_gguf(gguf_source(template.parent))


def _start(root: Path, action, k: int, when: str) -> int:
    """Fork a child that runs `action(root)` and is killed at call `k` (k=0: never); its pid.
    A child that finishes writes the sites it called to `root/sites.json`."""
    pid = os.fork()
    if pid:
        return pid
    code = 0  # the child: never returns
    try:
        kill = KillAt(k, when)
        kill.install()
        action(root)
        with REAL_OPEN(root / "sites.json", "w") as fh:  # not a site of the write under test
            json.dump(kill.sites, fh)
    except BaseException:  # noqa: BLE001 - reported as the child's exit code
        traceback.print_exc()
        code = 1
    os._exit(code)


def runner(scenario: str, root: Path, parallel: int = 0) -> dict:
    """Every kill point of one scenario, `parallel` children at a time (default: a CPU each)."""
    parallel = parallel or os.cpu_count() or 2
    template = root / "template"
    _prepare(template, scenario)
    action = _action(scenario)
    dry = root / "dry"
    shutil.copytree(template, dry, symlinks=True)
    _, status = os.waitpid(_start(dry, action, 0, "never"), 0)
    rc = os.waitstatus_to_exitcode(status)
    assert rc == 0 and (dry / "sites.json").exists(), f"the write itself failed (exit {rc})"
    sites = json.loads((dry / "sites.json").read_text())
    shutil.rmtree(dry)
    # the disk after call k is the disk before call k+1: "before" every call, and "after" the
    # last one, covers every state a kill can leave
    todo = [(k, "before") for k in range(1, len(sites) + 1)] + [(len(sites), "after")]
    running: dict[int, dict] = {}
    trials = []
    while todo or running:
        while todo and len(running) < parallel:
            k, when = todo.pop(0)
            trial = root / f"k{k:03d}-{when}"
            shutil.copytree(template, trial, symlinks=True)
            running[_start(trial, action, k, when)] = {
                "dir": str(trial), "k": k, "when": when, "site": sites[k - 1]}
        pid, status = os.wait()
        t = running.pop(pid)
        t["rc"] = os.waitstatus_to_exitcode(status)
        (Path(t["dir"]) / "sites.json").unlink(missing_ok=True)
        trials.append(t)
    return {"sites": sites, "trials": sorted(trials, key=lambda t: (t["k"], t["when"]))}


def run_scenarios(scenarios: list[str], root: Path) -> dict[str, dict]:
    """The runner in its own process (so the kills never touch this one)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, ",".join(scenarios), str(root)], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "PYTHONPATH": str(REPO), "WB_HOME": str(root)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for res in out.values():
        assert all(t["rc"] in (0, 137) for t in res["trials"]), r.stderr[-3000:]
    print(f"runner for {', '.join(scenarios)}: {time.perf_counter() - t0:.1f} s")
    return out


# ------------------------------------------------------------------ the checks (test side)

_SESSIONS: dict[str, SimpleNamespace] = {}


def _session(role: str) -> SimpleNamespace:
    """One session per role for all trials (building a model costs more than a trial)."""
    if role not in _SESSIONS:
        _SESSIONS[role] = tiny_session(Path(), step=4 if role == "rerun" else 0,
                                       version="rerun", keep=1)
    return _SESSIONS[role]


def _loaded_version(ckpt: Path) -> str:
    """Load `ckpt` into a session; its adapter, optimizer and state must agree."""
    import torch

    from workbench.train import checkpoint as ck

    fresh = _session("probe")
    state = ck.load_checkpoint(ckpt, model=fresh.model, optimizer=fresh.optimizer)
    version = state["metrics"][0]["version"]
    for p in (p for p in fresh.model.parameters() if p.requires_grad):
        assert torch.all(p == VALUE[version]), f"{ckpt.name}: adapter of another version"
    assert state["step"] == int(ckpt.name.split("-")[1])
    from safetensors.torch import load_file

    from workbench.train.session import BEST

    assert state["best_score"] == VALUE[version], f"{ckpt.name}: best score of another version"
    assert torch.all(load_file(str(ckpt / BEST))["w"] == VALUE[version]), \
        f"{ckpt.name}: best adapter of another version"
    return version


def _check_checkpoints(trial: dict, scenario: str) -> str:
    from workbench.train import checkpoint as ck
    from workbench.train.session import save_checkpoint

    folder = Path(trial["dir"]) / "ckpts"
    where = f"kill {trial['when']} call {trial['k']} ({trial['site']})"
    latest = ck.latest_checkpoint(folder)  # what resume takes; it recovers first
    assert latest is not None, f"{where}: no complete checkpoint left (neither old nor new)"
    versions = {p.name: _loaded_version(p) for p in ck.complete_checkpoints(folder)}
    assert all(re.fullmatch(r"checkpoint-\d+", p.name) for p in folder.iterdir()), \
        f"{where}: leftovers after recovery: {sorted(p.name for p in folder.iterdir())}"
    if scenario == "rotate":  # checkpoint-2 (old) or checkpoint-3 (new)
        assert versions[latest.name] == ("new" if latest.name == "checkpoint-3" else "old")
        seen = "new" if latest.name == "checkpoint-3" else "old"
    else:  # checkpoint-3 re-saved over an old checkpoint-3; checkpoint-2 stays
        assert latest.name == "checkpoint-3" and "checkpoint-2" in versions, where
        seen = versions["checkpoint-3"]
    # the next save after the kill finishes and rotates as usual
    keep = 1 if scenario == "rotate" else 2
    rerun = _session("rerun")
    rerun.checkpoint_dir, rerun.cfg.save_total_limit = folder, keep
    save_checkpoint(rerun)
    left = sorted(p.name for p in folder.iterdir())
    assert left == (["checkpoint-4"] if keep == 1 else ["checkpoint-3", "checkpoint-4"]), where
    return seen


def _check_gguf(trial: dict, scenario: str, monkeypatch) -> str:
    from workbench.models import local

    root = Path(trial["dir"])
    where = f"kill {trial['when']} call {trial['k']} ({trial['site']})"
    monkeypatch.setenv("WB_HOME", str(root / "home"))
    redone = []
    monkeypatch.setattr(local, "_write_conversion",
                        lambda s, f: (redone.append(1), fake_conversion("rerun")(s, f)))
    folder = local.convert_gguf(gguf_source(root.parent))  # the next start
    seen = {json.loads((folder / n).read_text())["version"] for n in GGUF_FILES}
    assert len(seen) == 1, f"{where}: a mixture of versions {seen}"
    version = seen.pop()
    assert (folder / "workbench-source.json").is_file()
    assert (version == "rerun") == bool(redone), where
    if scenario == "gguf-force":
        assert version in ("old", "new"), f"{where}: neither the old nor the new conversion"
    lock = f".{folder.name}.lock"  # kept: removing a lock file others may wait on is a race
    leftovers = [p.name for p in folder.parent.iterdir() if p.name not in (folder.name, lock)]
    assert leftovers == [], f"{where}: leftovers after the re-run: {leftovers}"
    return version


def _report(name: str, out: dict, seen: dict[str, int]) -> None:
    print(f"{name}: {len(set(out['sites']))} kinds of site, {len(out['sites'])} write sites, "
          f"{len(out['trials'])} kill points, 0 with neither version; outcomes {seen}")


def test_kill_at_every_write_site_of_checkpoint_save_and_rotation(tmp_path, kill_injection):
    runs = run_scenarios(["rotate", "resave"], tmp_path)
    for scenario, out in runs.items():
        assert len(out["trials"]) >= 20
        assert {"open-w", "safetensors", "fsync", "replace", "unlink", "rmdir"} <= \
            set(out["sites"])
        seen: dict[str, int] = {}
        for trial in out["trials"]:
            v = _check_checkpoints(trial, scenario)
            seen[v] = seen.get(v, 0) + 1
        assert set(seen) == {"old", "new"}  # kills landed both before and after the switch
        _report(scenario, out, seen)


def test_kill_at_every_write_site_of_gguf_conversion(tmp_path, monkeypatch, kill_injection):
    runs = run_scenarios(["gguf-first", "gguf-force"], tmp_path)
    for scenario, out in runs.items():
        assert len(out["trials"]) >= 20
        seen: dict[str, int] = {}
        for trial in out["trials"]:
            v = _check_gguf(trial, scenario, monkeypatch)
            seen[v] = seen.get(v, 0) + 1
        want = {"rerun", "new"} if scenario == "gguf-first" else {"old", "new"}
        assert set(seen) == want, seen
        _report(scenario, out, seen)


def test_unfinished_conversion_under_the_final_name_is_redone(tmp_path, monkeypatch,
                                                             kill_injection):
    """A folder under the final name without the finishing file (a copy cut short, an older
    non-atomic writer) is never taken as a conversion; temp folders of killed conversions go."""
    from workbench.models import local

    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    source = gguf_source(tmp_path)
    target = local.gguf_cache_dir(source)
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("half")
    stale = target.parent / f".{target.name}.tmp-999999"
    stale.mkdir()
    (stale / "model.safetensors").write_text("half")
    monkeypatch.setattr(local, "_write_conversion", fake_conversion("new"))
    assert local.convert_gguf(source) == target
    assert json.loads((target / "model.safetensors").read_text())["version"] == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == [f".{target.name}.lock",
                                                               target.name]


def test_a_second_conversion_waits_for_the_first_and_uses_its_folder(tmp_path, monkeypatch,
                                                                    kill_injection):
    import threading

    from workbench.models import local

    monkeypatch.setenv("WB_HOME", str(tmp_path / "home"))
    source = gguf_source(tmp_path)
    started, release, calls = threading.Event(), threading.Event(), []

    def slow(src, folder):
        calls.append(folder.name)
        started.set()
        release.wait(10)
        fake_conversion("first")(src, folder)

    monkeypatch.setattr(local, "_write_conversion", slow)
    first = threading.Thread(target=local.convert_gguf, args=(source,))
    first.start()
    assert started.wait(10)
    results = []
    second = threading.Thread(target=lambda: results.append(local.convert_gguf(source)))
    second.start()
    time.sleep(0.2)
    assert second.is_alive()  # waiting on the lock, not converting a second time
    release.set()
    first.join(10)
    second.join(10)
    assert len(calls) == 1 and results == [local.gguf_cache_dir(source)]
    assert json.loads((results[0] / "config.json").read_text())["version"] == "first"


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    print(json.dumps({sc: runner(sc, Path(sys.argv[2]) / sc) for sc in sys.argv[1].split(",")}))
