"""Trajectory search's downstream check with SFT then DPO (issue 27): the sft_dpo adapter is
trained from the SFT adapter on the run's pairs (exported or step-level), scored on the same
held-out tasks as sft with its Wilson interval and McNemar against sft; every adapter and
condition is a stage of the trajsynth pipeline, so a re-run trains and scores nothing again;
a report written before sft_dpo reads. A tiny random-init Llama: plumbing, not a result."""

from __future__ import annotations

import json

import pytest
from conftest import make_shop


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory, trajsynth_cache):
    """A searched and exported toy shop in `<run>/trajsynth` (no ICL index: icl is not
    scored here), and its first six tasks."""
    from workbench.trajsynth.api import explore_pool, export
    from workbench.dataenv.env import DataEnvironment
    from workbench.datatasks.explore import ExploreConfig
    from workbench.datatasks.tasks import PoolConfig, build_pool

    root = tmp_path_factory.mktemp("tsdpo")
    env = DataEnvironment.open(make_shop(root / "shop.sqlite"), cache_dir=trajsynth_cache)
    tasks = build_pool(env, PoolConfig(seed=0, python_check=False)).tasks[:6]
    out = root / "run" / "trajsynth"
    explore_pool(env, tasks, out, ExploreConfig(prior="uniform", iterations=60),
                 log=lambda m: None)
    export(out, [t.model_copy(update={"split": "train"}) for t in tasks], env, index=False)
    return env, tasks, out


def _counting(monkeypatch):
    """Count training sessions (method, init adapter) and model loads."""
    from workbench import models
    from workbench.train import session

    calls = {"train": [], "load": 0}
    setup, load = session.setup, models.load_model

    def counted_setup(tc, **kw):
        calls["train"].append((tc.method, tc.init_adapter))
        return setup(tc, **kw)

    def counted_load(*a, **kw):
        calls["load"] += 1
        return load(*a, **kw)

    monkeypatch.setattr(session, "setup", counted_setup)
    monkeypatch.setattr(models, "load_model", counted_load)
    return calls


def _config(**kw):
    from workbench.trajsynth.downstream import DownstreamConfig

    return DownstreamConfig(**{"conditions": ["zero_shot", "sft", "sft_dpo"], "max_tokens": 16,
                               "sft_steps": 2, "dpo_steps": 2, "sft_max_length": 512, **kw})


def test_sft_dpo_beside_sft_from_the_sft_adapter_and_resumed(toy_run, tiny_model, monkeypatch):
    from workbench.trajsynth.downstream import format_downstream, run_downstream
    from workbench.trajsynth.downstream_report import read_downstream

    env, tasks, out = toy_run
    calls = _counting(monkeypatch)
    logs: list[str] = []
    res = run_downstream(env, tasks[:3], out, _config(), model_spec=tiny_model,
                         log=logs.append)
    sft = out / "sft_adapter"
    assert calls["train"] == [("sft", None), ("dpo", str(sft))]
    manifest = json.loads((out / "sft_dpo_adapter" / "manifest.json").read_text())
    assert manifest["config"]["method"] == "dpo"
    assert manifest["config"]["init_adapter"] == str(sft)

    rep = read_downstream(out)
    assert res == json.loads((out / "downstream.json").read_text())
    assert list(rep.conditions) == ["zero_shot", "sft", "sft_dpo"]
    d, s = rep.conditions["sft_dpo"], rep.conditions["sft"]
    assert [r.task for r in d.rows] == [r.task for r in s.rows] == [t.id for t in tasks[:3]]
    assert d.n == 3 and 0 <= d.ci95[0] <= d.accuracy <= d.ci95[1] <= 1
    assert 0 <= d.mcnemar_p_vs_sft <= 1 and s.mcnemar_p_vs_sft is None
    a = rep.adapters["sft_dpo"]
    assert (a.method, a.init_adapter, a.source, a.steps) == ("dpo", "sft_adapter",
                                                             "preferences", 2)
    assert rep.adapters["sft"].method == "sft" and rep.adapters["sft"].init_adapter is None
    text = format_downstream(rep)
    assert "vs sft" in text and "DPO from sft_adapter (its reference)" in text

    # the run's stages.json holds every step; a re-run trains, loads and scores nothing
    stages = json.loads((out.parent / "stages.json").read_text())["stages"]
    assert {"trajsynth/sft_adapter", "trajsynth/dpo_adapter", "trajsynth/downstream_sft",
            "trajsynth/downstream_sft_dpo", "trajsynth/downstream_zero_shot",
            "trajsynth/downstream_report"} <= set(stages)
    logs.clear()
    again = run_downstream(env, tasks[:3], out, _config(), model_spec=tiny_model,
                           log=logs.append)
    assert again == res and len(calls["train"]) == 2 and calls["load"] == 3
    assert json.loads((out.parent / "stages.json").read_text())["stages"] == stages
    assert {"== trajsynth/sft_adapter: up to date", "== trajsynth/dpo_adapter: up to date",
            "== trajsynth/downstream_sft_dpo: up to date"} <= set(logs)

    # step-level pairs instead: only DPO and its condition run again
    logs.clear()
    steps = run_downstream(env, tasks[:3], out, _config(dpo_pairs="steps"),
                           model_spec=tiny_model, log=logs.append)
    assert calls["train"][2:] == [("dpo", str(sft))] and calls["load"] == 4
    assert {"== trajsynth/sft_adapter: up to date", "== trajsynth/downstream_sft: up to date",
            "== trajsynth/downstream_zero_shot: up to date"} <= set(logs)
    assert steps["adapters"]["sft_dpo"]["source"] == "steps"
    pairs = [json.loads(x) for x in (out / "step_pairs.jsonl").read_text().splitlines()]
    assert pairs and steps["adapters"]["sft_dpo"]["examples"] == len(pairs)
    assert {p["metadata"]["source"] for p in pairs} == {"step_pairs"}

    # no pairs: sft_dpo says so and nothing is trained for it
    (out / "preferences.jsonl").write_text("")
    none = run_downstream(env, tasks[:3], out, _config(conditions=["sft_dpo"]),
                          model_spec=tiny_model, log=logs.append)
    assert none["conditions"] == {} and "no preference pairs" in none["notes"]["sft_dpo"]
    assert len(calls["train"]) == 3 and calls["load"] == 4


def test_sft_dpo_is_opt_in_and_conditions_are_checked(tmp_path, cli):
    from pydantic import ValidationError

    from workbench.trajsynth.downstream import DownstreamConfig, downstream_stages

    assert "sft_dpo" not in DownstreamConfig().conditions
    with pytest.raises(ValidationError, match="unknown condition.*'dpo'"):
        DownstreamConfig(conditions=["sft", "dpo"])
    r = cli("trajsynth", "report", "chinook", "-o", str(tmp_path), "--conditions", "sft,dpo",
            "--dpo-pairs", "steps")
    assert r.returncode == 2 and "unknown condition(s) 'dpo'" in r.stderr
    r = cli("trajsynth", "report", "chinook", "-o", str(tmp_path), "--dpo-pairs", "rollouts")
    assert r.returncode == 2 and "dpo_pairs" in r.stderr
    # a trajsynth folder of a run records in the run's stages.json; any other folder in its own
    run = downstream_stages(tmp_path / "r" / "trajsynth", log=lambda m: None)
    own = downstream_stages(tmp_path / "elsewhere", log=lambda m: None)
    assert run.layout.stages_file == tmp_path / "r" / "stages.json"
    assert run.layout.folder("trajsynth") == tmp_path / "r" / "trajsynth"
    assert own.layout.stages_file == tmp_path / "elsewhere" / "stages.json"
    assert own.layout.folder("trajsynth") == tmp_path / "elsewhere"


def test_a_report_from_before_sft_dpo_still_reads(tmp_path):
    """downstream.json as the first check wrote it (zero_shot, icl, sft; no notes, no
    schema_version) and as the first sft_dpo wrote it (notes, no schema_version)."""
    from workbench.errors import DataError
    from workbench.trajsynth.downstream import format_downstream
    from workbench.trajsynth.downstream_report import read_downstream

    def cond(k, **extra):
        rows = [{"task": f"t{i}", "sql": "SELECT 1" if i else None, "verified": i < k,
                 "outcome": "verified" if i < k else ("no_sql" if not i else "wrong")}
                for i in range(3)]
        return {"n": 3, "verified": k, "accuracy": k / 3, "ci95": [0.0, 0.9],
                "outcomes": {}, **extra, "rows": rows}

    first = {"tasks": 3, "conditions": {"zero_shot": cond(0),
                                        "icl": cond(0, mcnemar_p_vs_zero_shot=1.0),
                                        "sft": cond(1, mcnemar_p_vs_zero_shot=1.0)}}
    path = tmp_path / "downstream.json"
    path.write_text(json.dumps(first))
    rep = read_downstream(tmp_path)
    assert list(rep.conditions) == ["zero_shot", "icl", "sft"] and rep.adapters is None
    assert rep.notes == {} and rep.schema_version == 1
    assert "sft_dpo" not in format_downstream(rep) and "vs zero-shot 1" in format_downstream(rep)
    later = {**first, "notes": {"sft_dpo": "no preference pairs were exported: not run"}}
    path.write_text(json.dumps(later))
    assert "no preference pairs" in format_downstream(read_downstream(path))
    path.write_text(json.dumps({**later, "schema_version": 2}))
    with pytest.raises(DataError, match="schema_version 2 is not 1"):
        read_downstream(path)
