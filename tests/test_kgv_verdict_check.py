"""A person checks the KGV agent's verdicts (issue 29, item 4): each verdict of a real KGV
evaluation (a scripted verifier over a prebuilt index: claim, cited passages, SUPPORTED or
REFUTED) is a decision of `workbench.evaluate.agreement`; `workbench agent verdict-check RUN`
rates a stable sample with the verdict hidden and reports kappa with its interval, the
confusion table and the reading."""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kgv_scripted import make_kg, write_config  # noqa: E402

from workbench.errors import DataError, WorkbenchError  # noqa: E402


@pytest.fixture(scope="module")
def kgv_run(tmp_path_factory, embedder) -> Path:
    """A finished KGV evaluation (rag and agent on 8 claims, 4 true): the agent's scripted
    verifier calls 4 SUPPORTED and 4 REFUTED, citing the index's passages."""
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    root = tmp_path_factory.mktemp("vc")
    data, index = make_kg(root, embedder)
    conf = write_config(root / "kgi.yaml", data=data, out=root / "runs", name="kgv")
    cfg = load_config(conf, [f"agent.index={json.dumps(str(index))}"])
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    return root / "runs" / "kgv"


@pytest.fixture
def run_copy(kgv_run, tmp_path) -> Path:
    shutil.copytree(kgv_run, tmp_path / "run")
    return tmp_path / "run"


def test_verdicts_show_the_claim_and_its_passages_never_the_verdict(kgv_run):
    from workbench.agent_packs.kgv.verdict_check import verdict_check, verdict_decisions

    d = verdict_decisions(kgv_run)
    runs = {t["task_id"]: t for t in map(json.loads, (
        kgv_run / "agent" / "trajectories" / "agent.jsonl").read_text().splitlines())}
    assert d.folder == kgv_run / "agent" and d.condition == "agent"
    assert d.runs == len(d.items) == 8 and d.no_verdict == 0
    assert d.decider == "fake:verifier (free policy)"
    assert d.evidence.startswith("prebuilt index ") and d.evidence.endswith("keyword retrieval")
    assert sum(i.machine for i in d.items) == 4
    for item in d.items:
        cond, task, _ = item.key.split(":")
        t = runs[task]
        assert cond == "agent" and item.machine == (t["final"]["label"] == "SUPPORTED")
        shown = {s.label: s.text for s in item.shown}
        assert list(shown) == ["claim", "evidence cited"]
        assert shown["claim"] == t["metadata"]["verbal"]
        p = t["metadata"]["cited"][0]
        assert shown["evidence cited"] == f"[{p['id']}] {p['source']}\n{p['text']}"
        assert not any(w in s for s in shown.values() for w in ("SUPPORTED", "REFUTED"))
    # the sample: half SUPPORTED, the same after a reload, from the run or its agent/ folder
    c = verdict_check(kgv_run, n=6).check
    assert c.mode == "kappa" and len(c.sample) == 6 and sum(i.machine for i in c.sample) == 3
    assert [i.key for i in verdict_check(kgv_run / "agent", n=6).check.sample] == \
        [i.key for i in c.sample]
    assert {i.key for i in c.sample} <= {i.key for i in verdict_check(kgv_run).check.sample}
    # the single-turn RAG baseline's verdicts are checked the same way
    rag = verdict_decisions(kgv_run, "rag")
    assert rag.condition == "rag" and all(i.key.startswith("rag:") for i in rag.items)


def test_a_run_without_recorded_passages_or_verdicts(run_copy):
    """Runs made before the cited passages were recorded show the snippets their searches
    showed; a run that ended without a verdict is no decision."""
    from workbench.agent_packs.kgv.verdict_check import verdict_decisions

    path = run_copy / "agent" / "trajectories" / "agent.jsonl"
    runs = [json.loads(x) for x in path.read_text().splitlines()]
    old = runs[0]
    cited = old["metadata"].pop("cited")[0]
    runs[1].update(final=None, stop="max_steps")
    path.write_text("".join(json.dumps(t) + "\n" for t in runs))
    d = verdict_decisions(run_copy)
    assert len(d.items) == 7 and d.no_verdict == 1 and d.runs == 8
    item = next(i for i in d.items if i.key.split(":")[1] == old["task_id"])
    shown = {s.label: s.text for s in item.shown}
    assert shown["evidence cited"] == f"[{cited['id']}] {cited['source']}\n{cited['text']}"


def test_rating_appends_and_the_last_counts(run_copy):
    from workbench.agent_packs.kgv.verdict_check import RATINGS, verdict_decisions

    d = verdict_decisions(run_copy)
    yes = next(i for i in d.items if i.machine)
    no = next(i for i in d.items if not i.machine)
    d.rate(yes.key, True, by="ana")
    d.rate(no.key, True, by="ana")
    d.rate(no.key, False, by="bo")  # changes the verdict: the last one counts
    f = run_copy / "agent" / RATINGS
    assert len(f.read_text().splitlines()) == 3
    a = d.check(8).agreement
    assert a.n == 2 and a.confusion == {"yes/yes": 1, "yes/no": 0, "no/yes": 0, "no/no": 1}
    with pytest.raises(WorkbenchError, match="not a verdict of agent"):
        d.rate("agent:claim-9999:0", True, by="ana")


def test_kappa_matches_a_hand_computed_table(run_copy, cli):
    # agent/person: SUPPORTED/true 2, SUPPORTED/false 1, REFUTED/true 1, REFUTED/false 2.
    # Observed agreement 4/6; agent SUPPORTED 3/6, person true 3/6, chance 0.5*0.5 + 0.5*0.5
    # = 0.5; kappa = (4/6 - 0.5) / (1 - 0.5) = 1/3
    from workbench.agent_packs.kgv.verdict_check import verdict_check

    vc = verdict_check(run_copy, n=8)
    d = vc.decisions
    yes = [i for i in d.items if i.machine][:3]
    no = [i for i in d.items if not i.machine][:3]
    for item, said in zip(yes + no, [True, True, False, True, False, False], strict=True):
        d.rate(item.key, said, by="ana")
    a = d.check(8).agreement
    assert a.n == 6 and a.kappa == pytest.approx(1 / 3)
    assert a.observed == pytest.approx(4 / 6) and a.expected == pytest.approx(0.5)
    assert a.confusion == {"yes/yes": 2, "yes/no": 1, "no/yes": 1, "no/no": 2}
    r = cli("agent", "verdict-check", str(run_copy), "--sample", "8")
    assert r.returncode == 0, r.stderr
    assert f"kappa 0.33 [{a.ci_low:.2f}, {a.ci_high:.2f}] (95% bootstrap); observed " \
           "agreement 66.7%, by chance 50.0%" in r.stdout
    table = [x.split() for x in r.stdout.splitlines()
             if x.startswith(("agent SUPPORTED", "agent REFUTED"))]
    assert table == [["agent", "SUPPORTED", "2", "1"], ["agent", "REFUTED", "1", "2"]]
    assert "reading: not yet measured: 6 of 20 items rated; rate 14 more" in r.stdout


def test_cli_rates_with_the_verdict_hidden_and_reports(run_copy, cli):
    from workbench.agent_packs.kgv.verdict_check import verdict_check

    before = verdict_check(run_copy, n=6).check.sample
    r = cli("agent", "verdict-check", str(run_copy), "--rate", "--by", "ana", "--sample", "6",
            stdin="y\nn\nmaybe\ns\ny\nq\n")
    assert r.returncode == 0, r.stderr
    assert "Is the claim true? [y/n/s/q]" in r.stdout
    assert "claim: " in r.stdout and "evidence cited:\n[chk-" in r.stdout
    assert "SUPPORTED" not in r.stdout.split("agent verdicts of")[0]  # hidden while rating
    assert r.stdout.count("[3/6]") == 3  # asked again after "maybe", then a skip
    assert "[4/6]" in r.stdout and "[5/6]" not in r.stdout
    from workbench.agent_packs.kgv.verdict_check import RATINGS

    kept = [json.loads(x) for x in (run_copy / "agent" / RATINGS).read_text().splitlines()]
    assert [x["verdict"] for x in kept] == [True, False, None, True]
    assert [x["key"] for x in kept[:3]] == [i.key for i in before[:3]]  # in the sample's order
    after = verdict_check(run_copy, n=6).check  # the skipped one replaced by another
    assert kept[3]["key"] in {i.key for i in after.sample} - {x["key"] for x in kept[:3]}
    assert len(after.sample) == 7 and {i.key for i in before} <= {i.key for i in after.sample}
    assert {x["by"] for x in kept} == {"ana"} and after.progress == (3, 6)
    # without --rate: the agreement, the table and the reading
    r = cli("agent", "verdict-check", str(run_copy), "--sample", "6")
    assert r.returncode == 0, r.stderr
    assert "agent verdicts of fake:verifier (free policy): 3 of 6 sampled verdicts rated" \
        in r.stdout
    assert "evidence searched: prebuilt index " in r.stdout
    assert "kappa " in r.stdout and "person true" in r.stdout and "agent REFUTED" in r.stdout
    assert "reading: not yet measured: 3 of 20 items rated; rate 17 more" in r.stdout
    r = cli("agent", "verdict-check", str(run_copy), "--rate")
    assert r.returncode == 2 and "--by" in r.stderr


def test_bad_input_is_one_line(run_copy, tmp_path, cli):
    from workbench.agent_packs.kgv.verdict_check import RATINGS

    for args, code, says in (
            ([str(tmp_path / "nope")], 1, f"{tmp_path / 'nope'}: not a run folder (no such "
                                          "folder)"),
            ([str(tmp_path)], 1, f"{tmp_path}: no KGV evaluation in it"),
            ([str(run_copy), "--condition", "agent_sft"], 1,
             f"{run_copy}: no agent_sft verdicts in it (conditions here: agent, rag)"),
            ([str(run_copy), "--condition", "oracle"], 1, "condition 'oracle': one of")):
        r = cli("agent", "verdict-check", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == code and len(lines) == 1, r.stderr
        assert lines[0].startswith(f"error: {says}"), lines[0]
    f = run_copy / "agent" / RATINGS
    f.write_text('{"key": "a", "verdict": true, "by": "ana", "at": "t"}\n{"key": "b"}\n')
    r = cli("agent", "verdict-check", str(run_copy))
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1
    assert f"{f}:2: verdict: missing field" in r.stderr
    bad = run_copy / "agent" / "trajectories" / "agent.jsonl"
    bad.write_text(bad.read_text().splitlines()[0] + "\nnot json\n")
    r = cli("agent", "verdict-check", str(run_copy))
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1
    assert f"{bad}:2: " in r.stderr
    with pytest.raises(DataError, match=f"{bad}:2"):
        from workbench.agent_packs.kgv.verdict_check import verdict_decisions

        verdict_decisions(run_copy)
