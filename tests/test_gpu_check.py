"""The GPU check (issue 31) at toy sizes on CPU, so it never rots before a GPU shows up: every
stage passes, the result file and table are written, and what travels fits in 64 MiB."""

import json
import os
import subprocess
import sys

from conftest import REPO


def test_the_gpu_check_passes_its_cpu_smoke_run(real_training, tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               # no proxy, no index: the check must not need the network
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               PIP_INDEX_URL="http://127.0.0.1:9/simple")
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--cpu-smoke",
                        "--out", str(out)], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=600)
    assert out.is_file(), r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    bad = {k: v for k, v in result["stages"].items() if v["status"] != "ok"}
    assert not bad, (bad, r.stderr[-2000:])
    stages = result["stages"]
    assert set(stages) == {"size", "build", "sft", "sft_resume", "dpo", "dpo_resume",
                           "scoring_parity", "constrained", "torchrun"}
    assert stages["sft"]["tokens_per_s"] > 0 and stages["dpo"]["tokens_per_s"] > 0
    assert stages["sft_resume"]["max_adapter_diff"] <= 1e-6
    assert stages["torchrun"]["processes"] == 2
    assert r.returncode == 0
    assert stages["constrained"]["valid_json"] == "8/8"
    assert stages["size"]["tree_mib"] + stages["size"]["wheels_mib"] <= 64
    assert "| sft | ok |" in r.stdout
    # a result path that is not a regular file is refused before any work
    (tmp_path / "folder").mkdir()
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--cpu-smoke",
                        "--out", str(tmp_path / "folder")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stdout


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vendored_wheels_add_only_what_the_interpreter_lacks(tmp_path, monkeypatch):
    """A wheel for a package the image lacks is unpacked onto the end of sys.path; a wheel of
    one it has (pydantic here) and a wheel for another platform are left alone."""
    import zipfile

    gc = _script()
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    for name, tag in [("wbprobe_pkg-1.0", "py3-none-any"), ("pydantic-0.1", "py3-none-any"),
                      ("wbother-1.0", "cp27-cp27m-win32")]:
        mod = name.split("-")[0]
        with zipfile.ZipFile(vendor / f"{name}-{tag}.whl", "w") as z:
            z.writestr(f"{mod}/__init__.py", f"WHERE = '{name}'\n")
    monkeypatch.setattr(gc, "VENDOR", vendor)
    path = list(__import__("sys").path)
    monkeypatch.setattr("sys.path", path)
    added, folder = gc.use_vendor()
    assert added == ["wbprobe-pkg"] and path[-1] == folder
    assert (tmp_path / folder / "wbprobe_pkg" / "__init__.py").is_file()
    assert not (tmp_path / folder / "pydantic").exists()
    __import__("shutil").rmtree(folder)
    # what travels is measured against the 64 MiB the device machine takes
    size = gc.travel_size()
    assert size["limit_mib"] == 64 and 0 < size["tree_mib"] < 64
