"""The pipeline registry: a pipeline from outside the package plugs into the config, the CLI,
the jobs and the stage runner without a core file changing."""

import json
import sys
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError

from conftest import REPO

TESTS = Path(__file__).parent
PLUGIN_ENV = {"WB_PLUGINS": "toy_pipeline", "PYTHONPATH": str(TESTS)}


def test_builtin_pipelines_are_registered():
    from workbench import registry

    names = registry.names()
    for name in ("distill", "rag", "train", "eval", "compare"):
        assert name in names
    assert registry.get("compare").kind == "experiment"


def test_toy_pipeline_shows_in_help_schema_and_jobs(tmp_path, cli_process):
    """Plugins are found when the CLI process starts (WB_PLUGINS): a process test."""
    run_cli = cli_process
    r = run_cli("--help", env=PLUGIN_ENV)
    assert r.returncode == 0 and "toy" in r.stdout and "counts words" in r.stdout
    r = run_cli("toy", "--help", env=PLUGIN_ENV)
    assert r.returncode == 0 and "run" in r.stdout
    r = run_cli("jobs", "start", "--help", env=PLUGIN_ENV)
    assert "toy" in r.stdout
    r = run_cli("config", "schema", env=PLUGIN_ENV)
    schema = json.loads(r.stdout)
    assert "toy" in schema["properties"] and "ToyConfig" in schema["$defs"]
    # without the plugin, none of it is there
    assert "toy" not in json.loads(run_cli("config", "schema").stdout)["properties"]


def test_toy_pipeline_runs_from_cli_with_stages(tmp_path, cli_process):
    run_cli = cli_process
    args = ("toy", "run", "-s", f"output_dir={tmp_path}", "-s", "name=t1", "-s", "toy.words=4")
    r = run_cli(*args, env=PLUGIN_ENV)
    assert r.returncode == 0, r.stderr
    assert "counted to 4 (ran: True)" in r.stdout
    assert json.loads((tmp_path / "t1" / "toy" / "counts.json").read_text()) == {"n": 4}
    r = run_cli(*args, env=PLUGIN_ENV)  # unchanged inputs: the stage is skipped
    assert "ran: False" in r.stdout and "toy/count: up to date" in r.stderr
    r = run_cli(*args, "--fresh", env=PLUGIN_ENV)
    assert "ran: True" in r.stdout
    r = run_cli("toy", "run", "-s", "toy.words=0", env=PLUGIN_ENV)
    assert r.returncode == 2 and "toy.words" in r.stderr and "Traceback" not in r.stderr


def test_toy_pipeline_runs_as_a_job(tmp_path):
    import os

    from workbench.jobs import start_job, wait_job

    old = dict(os.environ)
    os.environ.update(PLUGIN_ENV)
    sys.path.insert(0, str(TESTS))
    try:
        from workbench import registry

        registry._register_module("toy_pipeline")
        cfg = {"name": "j1", "output_dir": str(tmp_path / "runs"), "toy": {"words": 2}}
        job = wait_job(start_job(tmp_path / "ws", "toy", cfg), timeout=120)
    finally:
        registry.unregister("toy")
        os.environ.clear()
        os.environ.update(old)
        sys.path.remove(str(TESTS))
    assert job.status == "completed", job.log_text()
    assert job.result["figures"] == {"n": 2, "ran": True}
    assert (tmp_path / "runs" / "j1" / "toy" / "counts.json").exists()


def test_registry_refuses_bad_declarations():
    from workbench.errors import WorkbenchError
    from workbench.registry import Pipeline, register

    with pytest.raises(WorkbenchError, match="lower-case"):
        Pipeline(name="Bad Name", help="", run="x:y")
    with pytest.raises(WorkbenchError, match="core key"):
        Pipeline(name="models", help="", run="x:y", config="x:Y")
    with pytest.raises(WorkbenchError, match="already registered"):
        register(Pipeline(name="distill", help="another", run="x:y"))


def test_run_layout_owns_paths(tmp_path):
    from workbench.config import load_config
    from workbench.errors import ConfigError

    cfg = load_config(None, [f"output_dir={tmp_path}", "name=r1"])
    lay = cfg.layout
    assert lay.artifact("distill", "benchmark") == tmp_path / "r1" / "distill" / \
        "benchmark.jsonl"
    assert lay.artifact("train", "adapter") == tmp_path / "r1" / "adapter"
    assert lay.folder("rag") == tmp_path / "r1" / "index"
    for bad in ("/etc", "../x", "a/b", "..", ""):
        with pytest.raises(ConfigError, match="name"):
            load_config(None, [f"name={bad}"])


def test_every_shipped_config_and_pack_loads():
    from workbench.config import load_config
    from workbench.domain_packs import available_packs, load_pack

    for f in sorted((REPO / "configs").glob("*.yaml")):
        load_config(f)
    for name in available_packs():
        pack = load_pack(name)
        assert pack.train.parity_prompts
        if "loop" in pack.pipelines:  # the improvement loop's templates validate
            from workbench.loop.api import loop_pack

            assert loop_pack(name).knowledge
        if pack.distill is None:  # a pack for other pipelines: distillation refuses it clearly
            assert pack.agent.settings or pack.pipelines
            with pytest.raises(WorkbenchError, match="no distill section"):
                pack.perspectives
        else:
            assert pack.distill.perspectives


def test_pack_placeholders_are_checked(tmp_path):
    import yaml

    from workbench.domain_packs import PACKS, load_pack
    from workbench.errors import ConfigError

    data = yaml.safe_load((PACKS / "generic.yaml").read_text())
    data["distill"]["prompts"]["question"] = "About {txet}: ask."
    data["agent"]["system"] = "You help with {domian}."
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_pack(str(f))
    msg = str(e.value)
    assert "distill.prompts.question: unknown placeholder {txet}" in msg
    assert "distill.prompts.question: must contain {text}" in msg
    assert "agent.system: unknown placeholder {domian}" in msg and str(f) in msg
