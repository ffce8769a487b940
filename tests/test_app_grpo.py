"""GRPO's live curves in the app: the rows of a training's live file shaped into chart data
(`workbench.app.grpo_curves`, no Streamlit), the trainings of a run's agent folder found and
labelled by name, and the Domain agents and Train pages drawing them while a training runs
(no report yet, the best adapter so far) and after (the kept step from the manifest)."""

import json
import os
from pathlib import Path

import pytest
from conftest import REPO

from workbench.app import grpo_curves as gc

APP = REPO / "workbench" / "app"


def grpo_rows(n: int = 6, eval_every: int = 3, **extra) -> list[dict]:
    """A GRPO training's metric rows as `grpo_session.train_steps` writes them: held-out
    reward every `eval_every` steps (best at step 3, tied at 6)."""
    rows = []
    for s in range(1, n + 1):
        r = {"step": s, "reward_mean": 0.1 * s, "reward_std_in_group": 0.05,
             "groups_no_signal": 0.5 if s % 2 else 0.0, "tool_calls_per_rollout": 1.0 + s / 10,
             "turns_per_rollout": 2.0, "answered": 1.0, "lr": 1e-3, "loss": -0.01,
             "grad_norm": 0.1, "clip_fraction": 0.0, "update_tokens": 100,
             "rollout_seconds": 2.0, "update_seconds": 1.0, "rollout_tokens_per_s": 20.0,
             "update_tokens_per_s": None if s == 2 else 100.0, "rollouts_truncated": 0.0,
             "rollouts_reread": False, "seconds": 3.0, **extra}
        if s % eval_every == 0:
            r.update(heldout_reward=0.7, heldout_tool_calls=1.5)
        rows.append(r)
    return rows


def write_rows(path: Path, rows: list[dict], torn: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)
    return path


def write_manifest(adapter: Path, steps: int, adapter_step: int, start: float = 0.5) -> None:
    adapter.mkdir(parents=True, exist_ok=True)
    (adapter / "manifest.json").write_text(json.dumps({"outputs": {
        "steps": steps, "adapter_step": adapter_step, "heldout_reward_start": start,
        "heldout_reward_best": 0.7}}))


# --- the rows as curves (no Streamlit) ----------------------------------------------------------

def test_rows_become_one_point_per_step_in_order():
    rows = grpo_rows(4)
    mixed = [rows[2], {"step": 9, "loss": 1.0}, rows[0], {**rows[1], "reward_mean": 0.9},
             rows[1], rows[3], "not a row"]  # a resumed file rewrites a step: the last wins
    c = gc.shape(mixed)  # type: ignore[arg-type]
    assert [p["step"] for p in c.reward] == [1, 2, 3, 4] and c.steps == 4
    assert c.reward[1]["reward_mean"] == pytest.approx(0.2)
    assert c.reward[0]["low"] == pytest.approx(0.05) and c.reward[0]["high"] == pytest.approx(0.15)
    assert [p["groups_no_signal"] for p in c.no_signal] == [0.5, 0.0, 0.5, 0.0]
    assert [p["clip_fraction"] for p in c.clip] == [0.0] * 4
    # long form: the training rollouts' tool calls every step, the held-out ones at step 3
    assert [(p["series"], p["step"]) for p in c.tool_calls if p["series"] != "training "
            "rollouts"] == [("held-out (greedy)", 3)]
    speeds = {(p["series"], p["step"]) for p in c.speed}
    assert ("update (forward and backward)", 2) not in speeds and len(speeds) == 7  # None out
    assert c.final["step"] == 4


def test_kl_is_drawn_only_where_it_is_measured():
    assert gc.shape(grpo_rows(3)).kl == [] and not gc.shape(grpo_rows(3)).kl_measured
    c = gc.shape(grpo_rows(3, kl=0.02, distill_kl=float("nan")))  # NaN: no point
    assert {p["series"] for p in c.kl} == {"KL to the start policy"} and len(c.kl) == 3
    c = gc.shape(grpo_rows(2, distill_kl=0.3))
    assert {p["series"] for p in c.kl} == {"KL to the teacher (distillation)"}


def test_the_kept_step_while_training_and_once_exported():
    rows = grpo_rows(6)  # held-out reward 0.7 at steps 3 and 6
    k = gc.kept(rows)
    assert (k.step, k.reward, k.final) == (3, 0.7, False)  # a later tie does not replace it
    rows[5]["heldout_reward"] = 0.8
    assert gc.kept(rows).step == 6
    assert gc.kept(grpo_rows(2)) == gc.Kept(None, None, False)  # no evaluation yet
    pts = gc.heldout(rows)
    assert [(p["step"], p["kept"]) for p in pts] == [(3, False), (6, True)]
    # exported: the manifest's step (here the start: the training never beat it), and the
    # start's reward as step 0
    out = {"steps": 6, "adapter_step": 0, "heldout_reward_start": 0.9}
    c = gc.shape(rows, out)
    assert c.kept == gc.Kept(0, 0.9, True)
    assert [(p["step"], p["heldout_reward"], p["kept"]) for p in c.heldout] == [
        (0, 0.9, True), (3, 0.7, False), (6, 0.8, False)]
    assert gc.shape(rows, {**out, "adapter_step": 6}).kept == gc.Kept(6, 0.8, True)
    s = gc.summary(c)
    assert s.startswith("6 steps; mean reward at the last step 0.600; groups with no signal 0.0%")
    assert "kept: step 0 (held-out reward 0.900)" in s
    assert "held-out reward before training 0.900" in s
    assert "best so far: step 6" in gc.summary(gc.shape(rows))


def test_a_start_that_stays_best_is_kept_while_training():
    """The live rows carry the held-out reward before the first step and the planned steps:
    while training, a start better than every evaluated step is the best so far."""
    rows = [{"step": k, "reward_mean": 0.1 * k, "steps_planned": 16} for k in range(1, 9)]
    rows[-1].update(heldout_reward=0.5, heldout_reward_start=0.75)
    c = gc.shape(rows)
    assert (c.kept.step, c.kept.reward, c.kept.final) == (0, 0.75, False)
    assert [(p["step"], p["kept"]) for p in c.heldout] == [(0, True), (8, False)]
    assert gc.summary(c).startswith("8 of 16 steps") and "best so far: step 0" in gc.summary(c)


def test_specs_mark_the_kept_step_and_the_band():
    band = gc.band_spec()
    assert [layer["mark"]["type"] for layer in band["layer"]] == ["area", "line"]
    assert band["layer"][0]["encoding"]["y2"] == {"field": "high"}
    spec = gc.heldout_spec(mark="best so far")
    kept = [layer for layer in spec["layer"] if layer.get("transform")]
    assert [layer["mark"]["type"] for layer in kept] == ["rule", "point", "text"]
    assert kept[-1]["encoding"]["text"] == {"value": "best so far"}
    assert gc.line_spec("x", "x", (0.0, 1.0))["encoding"]["y"]["scale"] == {"domain": [0, 1]}
    json.dumps([band, spec, gc.lines_spec("t")])  # plain data


# --- finding a folder's trainings ---------------------------------------------------------------

def test_every_grpo_live_file_of_the_agent_folder_is_found_and_labelled(tmp_path):
    agent = tmp_path / "agent"
    write_rows(agent / "rf_grpo.live.jsonl", grpo_rows(2))
    (agent / "kgv_grpo.live.jsonl").write_text("")  # started: no step yet
    write_rows(agent / "student.live.jsonl", [{"step": 1, "loss": 2.0}])  # SFT: not GRPO
    write_rows(agent / "mine.live.jsonl", grpo_rows(1))  # GRPO rows under any name
    write_rows(agent / "torn.live.jsonl", [], torn='{"step": 1, "rew')
    (agent / "rf_grpo").mkdir()
    found = {t.stage: t for t in gc.find_trainings(agent)}
    assert list(found) == ["kgv_grpo", "mine", "rf_grpo"]
    assert found["rf_grpo"].label == "rf_grpo (RF design, tools+grpo)"
    assert found["kgv_grpo"].label == "kgv_grpo (KGV, agent_grpo)"
    assert found["mine"].label == "mine" and gc.label("agent_grpo") == "agent_grpo"
    assert found["rf_grpo"].manifest == agent / "rf_grpo" / "manifest.json"
    assert gc.find_trainings(tmp_path / "absent") == []


def test_a_torn_last_row_is_skipped_and_a_stale_manifest_is_not_read(tmp_path):
    agent = tmp_path / "agent"
    live = write_rows(agent / "rf_grpo.live.jsonl", grpo_rows(3), torn='{"step": 4, "rew')
    (t,) = gc.find_trainings(agent)
    rows = gc.read_rows(live)
    assert [r["step"] for r in rows] == [1, 2, 3]
    write_manifest(t.adapter, steps=3, adapter_step=3)
    assert gc.read_outputs(t, rows)["adapter_step"] == 3
    write_manifest(t.adapter, steps=24, adapter_step=8)  # an earlier training's adapter
    assert gc.read_outputs(t, rows) is None
    write_manifest(t.adapter, steps=3, adapter_step=3)
    old = live.stat().st_mtime - 60
    os.utime(t.manifest, (old, old))  # written before the live file's last row
    assert gc.read_outputs(t, rows) is None
    t.manifest.write_text('{"outputs": ')
    assert gc.read_outputs(t, rows) is None


# --- the pages ----------------------------------------------------------------------------------

@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("WB_WORKSPACE", str(tmp_path / "ws"))
    return tmp_path / "ws"


def page(name):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP / "views" / f"{name}.py"), default_timeout=300)


def charts(at) -> dict[str, dict]:
    """The page's Vega-Lite charts by their y title (a layered chart: its first layer's)."""
    import pyarrow as pa

    out = {}
    for c in at.get("vega_lite_chart"):
        spec = json.loads(c.proto.spec)
        enc = (spec.get("layer") or [spec])[0]["encoding"]
        data = pa.ipc.open_stream(c.proto.data.data).read_all().to_pylist()
        out[enc["y"]["title"]] = {"spec": spec, "data": data}
    return out


def texts(at) -> str:
    return "\n".join(e.value for kind in ("markdown", "caption", "subheader")
                     for e in getattr(at, kind))


def test_agents_page_draws_a_training_grpo_condition_then_the_kept_step(ws):
    """While the RF pack's tools+grpo trains there is no report: the run is listed and its
    curves drawn from agent/rf_grpo.live.jsonl, the best held-out step so far marked; once
    the adapter and the report are written the same curves mark the manifest's kept step."""
    agent = ws / "runs" / "rfgrpo" / "agent"
    rows = grpo_rows(6, kl=0.01)
    write_rows(agent / "rf_grpo.live.jsonl", rows[:4], torn='{"step": 5')
    at = page("agents").run()
    assert not at.exception, at.exception
    body = texts(at)
    assert "No report in this run yet" in body and "GRPO training" in body
    assert "rf_grpo (RF design, tools+grpo)" in body
    assert "4 steps; mean reward at the last step 0.400" in body
    assert "best so far: step 3 (held-out reward 0.700)" in body
    got = charts(at)
    assert set(got) == {"mean reward", "held-out reward", "share of groups", "tool calls",
                        "KL", "share of tokens", "tokens / s"}
    assert [p["step"] for p in got["mean reward"]["data"]] == [1, 2, 3, 4]
    assert got["held-out reward"]["data"] == [{"step": 3, "heldout_reward": 0.7,
                                                "kept": True}]
    assert got["held-out reward"]["spec"]["layer"][-1]["encoding"]["text"] == {
        "value": "best so far"}

    from workbench.agent_packs.rf.api import rf_report
    from workbench.agent_packs.rf.bench import DesignItem

    write_rows(agent / "rf_grpo.live.jsonl", rows)
    write_manifest(agent / "rf_grpo", steps=6, adapter_step=3, start=0.5)
    items = [DesignItem(id="i0", question="q", answer=10.0, quantity="x", tool="t",
                        family="f")]
    rf_report(agent, items, {"tools": [{"id": "i0", "family": "f", "prediction": 10.0,
                                        "tool_calls": 1, "errors": 0}]}, {}, model="m")
    at = page("agents").run()
    assert not at.exception, at.exception
    body = texts(at)
    assert "No report in this run yet" not in body
    assert any("accuracy" in d.value.columns for d in at.dataframe)  # the report, then
    assert "kept: step 3 (held-out reward 0.700)" in body
    assert "held-out reward before training 0.500" in body
    held = charts(at)["held-out reward"]
    assert [(p["step"], p["kept"]) for p in held["data"]] == [(0, False), (3, True),
                                                              (6, False)]
    assert held["spec"]["layer"][-1]["encoding"]["text"] == {"value": "kept"}


def test_agents_page_picks_among_several_trainings(ws):
    agent = ws / "runs" / "both" / "agent"
    write_rows(agent / "rf_grpo.live.jsonl", grpo_rows(2))
    (agent / "kgv_grpo.live.jsonl").write_text("")
    at = page("agents").run()
    assert not at.exception, at.exception
    pick = at.selectbox(key="ag-grpo-pick")
    assert [o for o in pick.options] == ["kgv_grpo (KGV, agent_grpo)",
                                         "rf_grpo (RF design, tools+grpo)"]
    assert "started, no step finished yet" in texts(at)
    pick.select_index(1).run()
    assert not at.exception, at.exception
    assert "2 steps" in texts(at) and "mean reward" in charts(at)


def test_train_page_lists_the_workspaces_grpo_trainings(ws):
    """The Train page: the agent conditions' GRPO trainings at its foot (nothing trained by
    `workbench train` yet), and a run whose adapter was trained with GRPO (the library's
    train_grpo into <run>/adapter) drawn with the GRPO curves, not a loss curve."""
    write_rows(ws / "runs" / "rfgrpo" / "agent" / "rf_grpo.live.jsonl", grpo_rows(3))
    at = page("train").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="t-grpo").value == "rfgrpo: rf_grpo (RF design, tools+grpo)"
    assert "3 steps" in texts(at) and "held-out reward" in charts(at)

    write_rows(ws / "runs" / "lib" / "adapter.live.jsonl", grpo_rows(4))
    at = page("train").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="t-run").value == "lib"
    body = texts(at)
    assert "Training loss" not in body and "4 steps" in body
