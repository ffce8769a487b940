"""The registry owns every stage: `StageRunner` runs only stages a pipeline's spec declares,
and a stage declared per value (one run per condition) is recorded under the same key as
before (`agent/rf_alone`) with its outputs named by that value."""

import pytest

from workbench import registry
from workbench.errors import WorkbenchError
from workbench.registry import Artifact, Pipeline, Stage
from workbench.runs import RunLayout, StageRunner


def test_an_undeclared_stage_is_refused_before_it_runs(tmp_path):
    runner = StageRunner(RunLayout(tmp_path / "run"), "agent", log=lambda _: None)
    ran = []
    with pytest.raises(WorkbenchError, match="declares no stage 'rf_alone'.*declared: "
                                             "closed_book"):
        runner.run("rf_alone", (1,), lambda: ran.append(1))
    with pytest.raises(WorkbenchError, match="runs once per condition; name the condition"):
        runner.run("rf", (1,), lambda: ran.append(1))
    with pytest.raises(WorkbenchError, match="not declared per value"):
        runner.run("teacher", (1,), lambda: ran.append(1), part="x")
    with pytest.raises(WorkbenchError, match="declares no stage"):
        runner.mark("nope", "h", 0.0)
    # a value that would record the per-value stage under a plain stage's key
    with pytest.raises(WorkbenchError, match="share its record with the stage "
                                             "litsearch_training_data"):
        runner.run("litsearch", (1,), lambda: ran.append(1), part="training_data")
    assert ran == [] and not (tmp_path / "run").exists()


def test_a_stage_per_condition_keeps_its_key_and_checks_its_own_output(tmp_path):
    lay = RunLayout(tmp_path / "run")
    runner = StageRunner(lay, "agent", log=lambda _: None)
    out = lay.folder("agent")

    def write(cond):
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rf_{cond}.jsonl").write_text("{}\n")
        return {"n": 1}

    for cond in ("alone", "tools"):
        _, ran = runner.run("rf", ("k", cond), lambda c=cond: write(c), part=cond)
        assert ran
    assert {"agent/rf_alone", "agent/rf_tools"} <= set(lay.stages().stages)
    assert not runner.run("rf", ("k", "alone"), lambda: write("alone"), part="alone")[1]
    (out / "rf_tools.jsonl").unlink()  # its own output gone: only that condition runs again
    assert runner.run("rf", ("k", "tools"), lambda: write("tools"), part="tools")[1]
    assert not runner.run("rf", ("k", "alone"), lambda: write("alone"), part="alone")[1]


def test_every_declared_output_names_its_value_exactly_when_the_stage_is_per_value():
    for spec in registry.pipelines():
        for s in spec.stages:
            for a in s.outputs:
                assert ("{value}" in a.path) == (s.per is not None), (spec.name, s.name)
    with pytest.raises(WorkbenchError, match="names its outputs by"):
        Pipeline(name="p", help="", run="m:f",
                 stages=(Stage("s", per="condition", outputs=(Artifact("a", "a.jsonl"),)),))
    with pytest.raises(WorkbenchError, match="belongs to stages declared with per="):
        Pipeline(name="p", help="", run="m:f",
                 stages=(Stage("s", outputs=(Artifact("a", "a_{value}.jsonl"),)),))


def test_no_two_declared_outputs_share_a_path_in_a_run():
    """Two stages writing one file overwrite each other's work (the KGV teacher's and the
    litsearch export's sft.messages.jsonl once shared agent/): every declared path in a run
    folder, over every pipeline (some share the run root), belongs to one output."""
    from collections import Counter
    from pathlib import PurePosixPath

    seen = Counter(str(PurePosixPath(spec.subfolder or ".") / a.path)
                   for spec in registry.pipelines() for s in spec.stages for a in s.outputs)
    assert not [p for p, n in seen.items() if n > 1], seen
