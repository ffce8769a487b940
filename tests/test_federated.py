"""Federated LoRA in process (RELIABILITY F2-F6, F8, F13-F15): the real Flower ClientApp and
our server loop over InProcessGrid, a tiny random-init model, the shipped RF QTSA rows split
into three sites."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.federated.config import FederatedConfig
from workbench.federated.deploy import APP_DIR, DeployError, Deployment, emitted_flags
from workbench.federated.sites import load_site, split_sites
from workbench.federated.weights import GlobalStore, aggregate, product_gap, state_hash

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    return split_sites(ROOT / "datasets" / "rf_distilled",
                       tmp_path_factory.mktemp("fed") / "sites", sites=3)


def fcfg(model: str, **kw) -> FederatedConfig:
    base = {"model": model, "rounds": 2, "mc_eval": False, "keep_replies": True,
            "local": {"steps": 2, "batch_size": 2, "max_length": 512,
                      "lora": {"r": 4, "alpha": 8, "dropout": 0.0}},
            "guards": {"min_nodes": 3, "wait_nodes_s": 3, "round_timeout_s": 60}}
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return FederatedConfig.model_validate(base)


def serve(cfg, sites, out, client=None, **kw):
    from workbench.federated.flower_app import client_app
    from workbench.federated.inprocess import InProcessGrid, site_node_configs
    from workbench.federated.server import FedServer

    grid = InProcessGrid(client or client_app(), site_node_configs(sites),
                         wire=kw.pop("wire", None))
    return FedServer(cfg, out, log=kw.pop("log", lambda m: None), **kw).run(grid)


def rounds(out):
    return [json.loads(x) for x in (Path(out) / "rounds.jsonl").read_text().splitlines()]


def replies_of(out, rnd):
    from safetensors import safe_open

    states, weights = [], []
    for p in sorted((Path(out) / "replies" / f"round-{rnd:04d}").glob("*.safetensors")):
        with safe_open(str(p), "numpy") as f:
            weights.append(float(f.metadata()["num-examples"]))
            states.append({k: f.get_tensor(k) for k in f.keys()})
    return states, weights


# --- F2: aggregation numerics ----------------------------------------------------------------

def test_fedavg_matches_numpy_and_ffa_is_exact():
    rng = np.random.default_rng(0)
    names = ["m.0.q_proj.lora_A.weight", "m.0.q_proj.lora_B.weight"]
    shapes = {names[0]: (4, 16), names[1]: (16, 4)}
    states = [{n: rng.normal(size=shapes[n]).astype(np.float32) for n in names}
              for _ in range(3)]
    weights = [10, 25, 7]
    merged = aggregate(states, weights)
    for n in names:
        ref = sum(w * s[n].astype(np.float64) for s, w in zip(states, weights)) / sum(weights)
        assert np.abs(merged[n] - ref).max() <= 1e-6
    assert product_gap(states, weights, merged) > 0.05  # mean(B)mean(A) != mean(BA)

    shared_a = states[0][names[0]]
    ffa_states = [{names[0]: shared_a.copy(), names[1]: s[names[1]]} for s in states]
    ffa = aggregate(ffa_states, weights, method="ffa", previous=ffa_states[0])
    assert np.array_equal(ffa[names[0]], shared_a)
    assert product_gap(ffa_states, weights, ffa) <= 1e-6
    with pytest.raises(WorkbenchError, match="different tensors"):
        aggregate([states[0], {names[0]: states[1][names[0]]}], [1, 1])
    with pytest.raises(WorkbenchError, match="sum to 0"):
        aggregate(states[:1], [0])


# --- a clean federation: the global adapter is the weighted mean; nothing else leaves --------

def test_rounds_average_exactly_and_only_allowed_data_leaves(tiny_model, sites, tmp_path):
    from workbench.federated.api import run_federated

    out = tmp_path / "server"
    summary = run_federated(fcfg(tiny_model), sites, out)
    store = GlobalStore(out / "global")
    for rnd in (1, 2):
        states, weights = replies_of(out, rnd)
        assert len(states) == 3
        ref = {k: sum(w * s[k].astype(np.float64) for s, w in zip(states, weights))
               / sum(weights) for k in states[0]}
        glob = store.load(rnd)
        assert max(np.abs(glob[k] - ref[k]).max() for k in ref) <= 1e-6
    log = rounds(out)
    assert [(r["round"], r["kind"], r["used"]) for r in log] == \
        [(1, "train", 3), (2, "train", 3), (2, "evaluate", 3)]
    assert all(r["bytes_up"] > 0 for r in log if r["kind"] == "train")
    assert sorted(log[0]["sites"]) == ["site-0", "site-1", "site-2"]
    # F14: only allow-listed records, no long strings, no planted canary
    wire = summary["wire"]
    assert set(wire["record_names"]) <= {"arrays", "metrics", "site"}
    assert wire["long_strings"] == 0 and wire["canary_leaks"] == 0
    assert wire["replies"] == 9
    assert summary["sha256"] == state_hash(store.load(2))


def test_ffa_keeps_the_shared_a(tiny_model, sites, tmp_path):
    from workbench.federated.api import run_federated

    out = tmp_path / "ffa"
    run_federated(fcfg(tiny_model, rounds=1, aggregation="ffa"), sites, out)
    store = GlobalStore(out / "global")
    init, after = store.load(0), store.load(1)
    a = [k for k in init if ".lora_A." in k]
    b = [k for k in init if ".lora_B." in k]
    assert a and all(np.array_equal(init[k], after[k]) for k in a)
    assert any(np.abs(after[k]).max() > 0 for k in b)  # B moved from zero
    assert rounds(out)[0]["product_gap"] <= 1e-6


# --- F4 / F5 / F3: failing sites and missing sites ------------------------------------------

class Flaky:
    """The real client app, except that chosen (site, round) pairs raise."""

    def __init__(self, fail):
        from workbench.federated.flower_app import client_app

        self.app, self.fail = client_app(), fail

    def __call__(self, msg, ctx):
        site = Path(ctx.node_config["data-path"]).name
        rnd = int(msg.content["config"]["round"])
        if msg.metadata.message_type == "train" and self.fail(site, rnd):
            raise RuntimeError(f"disk full at {site}")
        return self.app(msg, ctx)


def test_a_raising_site_is_recorded_and_the_round_goes_on(tiny_model, sites, tmp_path):
    out = tmp_path / "s"
    serve(fcfg(tiny_model), sites, out,
          client=Flaky(lambda site, rnd: site == "site-1" and rnd == 2))
    r2 = rounds(out)[1]
    assert r2["status"] == "ok" and r2["used"] == 2 and r2["replies"] == 3
    assert [f["code"] for f in r2["failures"]] == [2]  # CLIENT_APP_RAISED_EXCEPTION
    assert "disk full at site-1" in r2["failures"][0]["reason"]
    states, weights = replies_of(out, 2)
    assert len(states) == 2 and r2["num_examples"] == sum(weights)


def test_all_sites_failing_keeps_the_adapter_and_aborts(tiny_model, sites, tmp_path):
    from workbench.federated.guards import FedAbort

    out = tmp_path / "s"
    with pytest.raises(FedAbort, match="2 rounds in a row") as e:
        serve(fcfg(tiny_model, rounds=4), sites, out, client=Flaky(lambda s, r: True))
    assert e.value.exit_code != 0
    store = GlobalStore(out / "global")
    h0 = state_hash(store.load(0))
    assert state_hash(store.load(1)) == h0 == state_hash(store.load(2))
    assert [r["status"] for r in rounds(out)] == ["failed", "failed"]
    assert not (out / "global" / "round-0003").exists()


def test_too_few_sites_abort_within_the_wait(tiny_model, sites, tmp_path):
    from workbench.federated.guards import FedAbort

    t0 = time.monotonic()
    with pytest.raises(FedAbort, match="3 of the 4 required sites") as e:
        serve(fcfg(tiny_model, guards={"min_nodes": 4, "wait_nodes_s": 3}), sites,
              tmp_path / "s")
    waited = time.monotonic() - t0
    assert "guards.min_nodes=4" in str(e.value)
    assert waited < 3 + 2 + 15  # the wait, plus building the initial adapter


def test_replies_outside_the_allow_list_are_rejected(tiny_model, sites, tmp_path):
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    from workbench.federated.flower_app import client_app

    app = client_app()

    def bad(msg, ctx):
        site = Path(ctx.node_config["data-path"]).name
        reply = app(msg, ctx)
        if msg.metadata.message_type != "train" or site == "site-0":
            return reply
        content = dict(reply.content.items())
        if site == "site-1":  # smuggles text out
            content["notes"] = ConfigRecord({"row": "the patient in bed 4 ..."})
        else:  # a NaN update
            arrays = content["arrays"]
            k = next(iter(arrays))
            v = arrays[k].numpy().copy()
            v.flat[0] = np.nan
            from flwr.app import Array

            arrays[k] = Array.from_numpy_ndarray(v)
            content["metrics"] = MetricRecord({"num-examples": 3.0})
        return Message(RecordDict(content), reply_to=msg)

    out = tmp_path / "s"
    serve(fcfg(tiny_model, rounds=1), sites, out, client=bad)
    r1 = rounds(out)[0]
    assert r1["used"] == 1 and r1["status"] == "ok"
    reasons = sorted(f["reason"] for f in r1["failures"])
    assert any("allow-list" in r for r in reasons) and any("non-finite" in r for r in reasons)


# --- F6: the server resumes after a crash and ends where an uninterrupted run ends ----------

def test_server_resumes_after_a_crash_with_the_same_final_adapter(tiny_model, sites,
                                                                   tmp_path, kill_injection):
    cfg = fcfg(tiny_model, rounds=4, keep_replies=False)
    whole = serve(cfg, sites, tmp_path / "whole")

    def crash(rnd):
        if rnd == 2:
            raise KeyboardInterrupt("killed after round 2")

    with pytest.raises(KeyboardInterrupt):
        serve(cfg, sites, tmp_path / "cut", on_round=crash)
    assert GlobalStore(tmp_path / "cut" / "global").latest()[0] == 2
    logs = []
    resumed = serve(cfg, sites, tmp_path / "cut", log=logs.append)
    assert logs[0].startswith("resuming after round 2")
    assert [r["round"] for r in rounds(tmp_path / "cut") if r["kind"] == "train"] == \
        [1, 2, 3, 4]
    assert resumed["sha256"] == whole["sha256"]


def test_a_torn_round_is_not_resumed_from(tiny_model, tmp_path):
    store = GlobalStore(tmp_path / "g")
    s0 = {"x.lora_A.weight": np.ones((2, 2), np.float32)}
    store.save(0, s0, {})
    store.save(1, {"x.lora_A.weight": np.zeros((2, 2), np.float32)}, {})
    (store.round_dir(1) / "adapter.safetensors").write_bytes(b"torn")
    rnd, state, _ = store.latest()
    assert rnd == 0 and np.array_equal(state["x.lora_A.weight"], s0["x.lora_A.weight"])


# --- sites ------------------------------------------------------------------------------------

def test_split_by_chapter_keeps_documents_whole_and_plants_canaries(sites):
    docs = [set(json.loads((s / "site.json").read_text())["documents"]) for s in sites]
    assert all(docs) and not (docs[0] & docs[1] or docs[0] & docs[2] or docs[1] & docs[2])
    for s in sites:
        site = load_site(s)
        assert len(site.canaries) == 2 and site.eval and site.train
        text = (s / "train.jsonl").read_text()
        assert all(c in text for c in site.canaries)


def test_bad_site_folders_are_named(tmp_path):
    with pytest.raises(WorkbenchError, match="does not exist"):
        load_site(tmp_path / "nope")
    (tmp_path / "a").mkdir()
    with pytest.raises(WorkbenchError, match="no train.jsonl"):
        load_site(tmp_path / "a")
    (tmp_path / "B B").mkdir()
    (tmp_path / "B B" / "train.jsonl").write_text("{}\n")
    with pytest.raises(WorkbenchError, match="site name"):
        load_site(tmp_path / "B B")


# --- F13 / F15 / F8: the app package, the launcher's flags, secure by default ---------------

def test_fab_holds_code_only(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(APP_DIR, app, ignore=shutil.ignore_patterns("__pycache__"))
    for decoy in ("wbfed/site.jsonl", "wbfed/rows.json", "data.parquet",
                  "adapter.safetensors", "wbfed/notes.jsonl"):
        (app / decoy).write_bytes(b"private")
    r = subprocess.run([str(Path(sys.executable).parent / "flwr"), "build", "--app", str(app)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    fab = next(tmp_path.glob("*.fab"))
    names = zipfile.ZipFile(fab).namelist()
    assert fab.stat().st_size < 10_000_000
    assert not [n for n in names if re.search(r"\.(jsonl|json|parquet|safetensors)$", n)]
    assert {"wbfed/client_app.py", "wbfed/server_app.py"} <= set(names)


def test_every_flag_the_launcher_emits_exists_in_the_installed_flower():
    bindir = Path(sys.executable).parent
    for binary, flags in emitted_flags().items():
        helptext = subprocess.run([str(bindir / binary), "--help"], capture_output=True,
                                  text=True, timeout=60).stdout
        known = set(re.findall(r"(--[a-z][a-z0-9-]+)", helptext))
        assert flags and flags <= known, f"{binary}: {sorted(flags - known)} not in --help"


def test_launcher_refuses_without_tls_unless_insecure(tmp_path, sites):
    d = Deployment(tmp_path / "dep")
    with pytest.raises(DeployError, match="--insecure"):
        d.up(sites)
    assert not (tmp_path / "dep" / "pids.json").exists()
    r = subprocess.run([str(Path(sys.executable).parent / "workbench"), "fed", "up",
                        "--sites", str(sites[0].parent), "--home", str(tmp_path / "dep")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 5 and "no TLS certificates" in r.stderr
    assert "Traceback" not in r.stderr
    cmd = Deployment(tmp_path / "dep", insecure=True).superlink_command()
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--insecure" in cmd
    assert "--disable-runtime-dependency-installation" in cmd


# --- the experiment -------------------------------------------------------------------------

def test_experiment_reports_federated_local_and_central(federated_run, tmp_path, monkeypatch):
    from workbench.runs import RunContext, RunLayout, run_pipeline

    monkeypatch.chdir(tmp_path)
    cfg, out = federated_run.cfg, federated_run.report_dir
    report = json.loads((out / "report.json").read_text())
    conds = {t["condition"] for t in report["conditions"]}
    assert conds == {"initial", "local", "federated", "central"}
    fig = report["figures"]
    assert fig["canary_leaks"] == 0 and fig["failed_rounds"] == 0
    assert fig["mc_accuracy"]["federated"] is not None
    md = (out / "report.md").read_text()
    assert "| federated |" in md and "Wilson" in md and (out / "rounds.png").stat().st_size
    for t in report["conditions"]:
        assert sum(t["predictions"].values()) == t["mc_n"] > 0
    # rerun: nothing trains again; the result's figures are the report's
    before = {p: p.stat().st_mtime for p in out.rglob("*.safetensors")}
    res = run_pipeline("fed", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    assert {p: p.stat().st_mtime for p in out.rglob("*.safetensors")} == before
    assert json.loads(json.dumps(res.figures)) == \
        json.loads((out / "report.json").read_text())["figures"]


# --- the report as a typed record ------------------------------------------------------------

FED_RUNS = {"federated_run": ("LoraReport", {
                "sites", "rounds", "eval_loss", "mc_accuracy", "bytes_per_round",
                "round_seconds", "failed_rounds", "canary_leaks", "seconds"}),
            "knowledge_run": ("KnowledgeReport", {
                "sites", "rounds", "rate", "active_units", "knowledge_bytes_per_round",
                "lora_bytes_per_round", "canary_leaks", "poison_active_rounds",
                "poison_sites_against", "transfer", "seconds"})}


@pytest.mark.parametrize("fixture", FED_RUNS)
def test_every_federated_report_is_its_typed_record(fixture, request):
    """Both tracks' report.json validate against their model, hold exactly the keys the
    writer always wrote (plus schema_version), and round-trip model -> JSON -> model; the run
    folder, its layout, the fed folder and the report's path all find the same report."""
    from workbench.federated.report import read_report
    from workbench.runs import RunLayout, locate

    run = request.getfixturevalue(fixture)
    model, figure_keys = FED_RUNS[fixture]
    out = run.report_dir
    raw = json.loads((out / "report.json").read_text())
    assert set(raw) == {"schema_version", "figures", "conditions", "headline"}
    assert raw["schema_version"] == 1 and set(raw["figures"]) == figure_keys
    report, md = read_report(out)
    assert type(report).__name__ == model and md == (out / "report.md").read_text()
    assert json.loads(json.dumps(report.model_dump())) == raw  # what is read is what was written
    again = type(report).model_validate(json.loads(json.dumps(report.model_dump())))
    assert again == report
    assert report.figures.canary_leaks == 0 and report.headline
    lay = RunLayout.of(run.cfg)
    assert locate("fed", "report", lay) == locate("fed", "report", lay.root) == \
        locate("fed", "report", out) == out / "report.json"
    for where in (lay, lay.root, out / "report.json"):
        assert read_report(where) == (report, md)
    # the round log reads as typed rows through its declared record (what the app shows)
    rows = lay.read("fed", "rounds")
    assert rows and {type(r).__name__ for r in rows} == {"RoundRow"}


@pytest.mark.parametrize("fixture", FED_RUNS)
def test_a_report_written_before_schema_version_reads_as_version_1(fixture, request,
                                                                   tmp_path):
    from workbench.federated.report import read_report

    out = request.getfixturevalue(fixture).report_dir
    raw = json.loads((out / "report.json").read_text())
    del raw["schema_version"]
    (tmp_path / "report.json").write_text(json.dumps(raw, indent=2))
    shutil.copy(out / "report.md", tmp_path / "report.md")
    old, md = read_report(tmp_path)
    assert old == read_report(out)[0] and old.schema_version == 1
    assert md == (out / "report.md").read_text()


def test_a_broken_report_is_refused_in_one_line_naming_the_file(federated_run, tmp_path):
    from workbench.errors import DataError
    from workbench.federated.report import read_report

    good = json.loads((federated_run.report_dir / "report.json").read_text())
    md = (federated_run.report_dir / "report.md").read_text()
    no_sites = json.loads(json.dumps(good))
    del no_sites["figures"]["sites"]
    extra = json.loads(json.dumps(good))
    extra["conditions"][0]["surprise"] = 1
    cases = {"bad-json": ("{not json", "bad JSON"), "a-list": ("[]", "JSON list"),
             "missing": (json.dumps(no_sites), "figures.sites: missing field"),
             "extra": (json.dumps(extra), "conditions.0.surprise"),
             "version": (json.dumps({**good, "schema_version": 2}), "schema_version 2"),
             "no-report": (None, "no report here")}
    for name, (text, said) in cases.items():
        d = tmp_path / name
        d.mkdir()
        if text is not None:
            (d / "report.json").write_text(text)
        (d / "report.md").write_text(md)
        with pytest.raises(DataError) as e:
            read_report(d)
        msg = str(e.value)
        assert msg.startswith(f"{d / 'report.json'}: ") and said in msg, (name, msg)
        assert "\n" not in msg
    link = tmp_path / "link"
    link.mkdir()
    (link / "report.json").symlink_to(federated_run.report_dir / "report.json")
    with pytest.raises(DataError, match="is a link"):
        read_report(link)
    no_md = tmp_path / "no-md"
    no_md.mkdir()
    (no_md / "report.json").write_text(json.dumps(good))
    with pytest.raises(DataError) as e:
        read_report(no_md)
    assert str(e.value).startswith(f"{no_md / 'report.md'}: ")


def test_check_reply_refuses_missing_or_odd_tensors():
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from workbench.federated.inprocess import InProcessGrid
    from workbench.federated.server import check_reply

    InProcessGrid(None, [])  # sets the process's Flower task identity
    glob = {"m.lora_A.weight": np.zeros((2, 2), np.float32)}
    metrics = MetricRecord({"num-examples": 4.0})

    def reply(**content):
        return Message(RecordDict(content), dst_node_id=5, message_type="train")

    ok = reply(arrays=ArrayRecord({"m.lora_A.weight": Array.from_numpy_ndarray(
        np.ones((2, 2), np.float32))}), metrics=metrics, site=ConfigRecord({"name": "a"}))
    assert check_reply(ok, glob)[0] == "a"
    for bad, why in ((reply(metrics=metrics), "without arrays"),
                     (reply(arrays=ArrayRecord({"m.lora_A.weight": Array.from_numpy_ndarray(
                         np.array([["a", "b"], ["c", "d"]]))}), metrics=metrics),
                      "floating point"),
                     (reply(arrays=ok.content["arrays"], metrics=MetricRecord(
                         {"num-examples": 4.0, "rows": 3.0})), "allow-listed")):
        with pytest.raises(ValueError, match=why):
            check_reply(bad, glob)
