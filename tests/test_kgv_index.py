"""KGV with a prebuilt retrieval index as its evidence (issue 30, item 2): an index built with
the retrieval library over a few documents, searched as it is by `workbench agent run|eval kgv
--index` (keyword retrieval, through the registry's `query_index` service); the verdicts cite
its passages with their source documents and the output and report name the index; a missing
or broken index is one line naming it, before anything is written."""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kgv_scripted import DOCS, make_kg, write_config  # noqa: E402


@pytest.fixture(scope="module")
def kg(tmp_path_factory, embedder):
    return make_kg(tmp_path_factory.mktemp("kgi"), embedder)


def _chunks(index: Path) -> dict[str, str]:
    """chunk id -> source document of the index (read with the library)."""
    from workbench.retrieval.index import RagIndex

    return {c.id: c.source for c in RagIndex.load(index, semantic=False).store.chunks}


def test_agent_run_searches_the_index_and_cites_its_passages(kg, tmp_path, cli):
    data, index = kg
    conf = write_config(tmp_path / "kgi.yaml", data=data, out=tmp_path / "runs")
    traj = tmp_path / "traj.jsonl"
    r = cli("agent", "run", "kgv", str(conf), "--index", str(index), "-i", "claim-0001",
            "-i", "A mixer is driven by a local oscillator.", "--out", str(traj))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"evidence: prebuilt index {index}, keyword retrieval" in r.stdout
    assert "cites [chk-" in r.stdout and "mixers.md > Mixers: A mixer is driven" in r.stdout
    chunks = _chunks(index)
    runs = [json.loads(x) for x in traj.read_text().splitlines()]
    assert [t["final"]["label"] for t in runs] == ["SUPPORTED", "SUPPORTED"]
    for t in runs:
        assert t["metadata"]["evidence_source"] == f"prebuilt index {index}, keyword retrieval"
        cited = t["metadata"]["cited"]
        assert [p["id"] for p in cited] == t["final"]["evidence"]
        assert all(chunks[p["id"]] == "mixers.md" for p in cited)  # the index's passages
        assert cited[0]["source"] == "mixers.md > Mixers"
        assert cited[0]["text"] == DOCS["mixers.md"].split("\n\n", 1)[1].strip()
    # searched as it is: nothing indexed or written in the run folder
    assert not (tmp_path / "runs" / "kgi").exists()
    # without --index the same config searches the graph's own facts
    r = cli("agent", "run", "kgv", str(conf), "-i", "claim-0001")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "evidence: the graph's own facts (graph.tsv: 5 entity entries), keyword " \
           "retrieval" in r.stdout and "cites [chk-" not in r.stdout


def test_agent_eval_reports_the_index_as_its_evidence(kg, tmp_path, cli):
    data, index = kg
    conf = write_config(tmp_path / "kgi.yaml", data=data, out=tmp_path / "runs")
    r = cli("agent", "eval", "kgv", str(conf), "--index", str(index))
    assert r.returncode == 0, r.stderr[-2000:]
    source = f"prebuilt index {index}, keyword retrieval"
    assert f"(evidence: {source})" in r.stdout
    out = tmp_path / "runs" / "kgi" / "agent"
    from workbench.agent_packs.kgv.report import read_report

    rep = read_report(out / "report.json")
    assert rep.evidence == source and rep.dev_claims == 8
    assert f"Evidence searched: {source}." in (out / "report.md").read_text()
    # the scripted verifier is right on every claim from the index's passages
    assert rep.conditions["agent"]["all"].accuracy == 1.0
    chunks = _chunks(index)
    for cond in ("rag", "agent"):
        runs = [json.loads(x) for x in
                (out / "trajectories" / f"{cond}.jsonl").read_text().splitlines()]
        assert len(runs) == 8 and all(t["tool_calls"] >= 1 for t in runs)
        cited = [p for t in runs for p in t["metadata"]["cited"]]
        assert cited and all(p["id"] in chunks for p in cited)
        assert {p["source"].split(" > ")[0] for p in cited} <= set(DOCS)
    assert not (out / "index").exists()  # the prebuilt index is not copied or rebuilt


def test_a_missing_or_broken_index_is_one_line_naming_it(kg, tmp_path, cli):
    data, index = kg
    conf = write_config(tmp_path / "kgi.yaml", data=data, out=tmp_path / "runs")
    nope = tmp_path / "nope"
    r = cli("agent", "run", "kgv", str(conf), "--index", str(nope), "-i", "claim-0001")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0] == (f"error: agent.index {nope}: no such folder; give a folder made by "
                        f"`workbench rag build CORPUS -o {nope}`")
    broken = tmp_path / "broken"
    shutil.copytree(index, broken)
    with open(broken / "chunks.jsonl", "a") as f:
        f.write('{"id": "planted"}\n')
    r = cli("agent", "eval", "kgv", str(conf), "--index", str(broken))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: agent.index {broken}: not a usable index (")
    assert f"{broken / 'chunks.jsonl'}: size" in lines[0]
    assert not (tmp_path / "runs" / "kgi" / "agent" / "trajectories").exists()
    (broken / "manifest.json").unlink()
    r = cli("agent", "run", "kgv", str(conf), "--index", str(broken), "-i", "claim-0001")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert f"agent.index {broken}: not a usable index" in r.stderr
    assert "no manifest.json" in r.stderr
    # another pack is told that the index is kgv's
    r = cli("agent", "run", "rf", str(conf), "--index", str(index), "-i", "rfd-000")
    assert r.returncode == 2 and "agent.index: pack 'rf'" in r.stderr
