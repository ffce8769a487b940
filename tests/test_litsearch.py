"""Literature search as workflow induction: the DAG validator catches every corruption, the
executor memoises by (operator, parameters, inputs), feedback edits keep unaffected nodes
cached, the simulated user and the metrics on hand-computed cases, and a dialogue with a
scripted model that repairs an invalid workflow."""

import json

import pytest

from workbench.agent_packs.litsearch import dag as D
from workbench.agent_packs.litsearch.corrupt import STRUCTURAL, corrupt
from workbench.agent_packs.litsearch.pack import (
    Intent,
    Library,
    Paper,
    SimulatedUser,
    edits,
    metrics,
    ranking,
    templates,
)
from workbench.records import RetrievalHit

# a tiny corpus: 1 cites 2 and 3; 4 cites 1; 5 and 6 unrelated
PAPERS = {p.pmid: p for p in [
    Paper(pmid="1", title="Glutamine in light chains", year=1977, journal="J1",
          mesh=["Glutamine", "Immunoglobulin"], major=["Glutamine"], refs=["2", "3"]),
    Paper(pmid="2", title="Light chain sequences", year=1976, journal="J1",
          mesh=["Immunoglobulin"], major=["Immunoglobulin"]),
    Paper(pmid="3", title="Pyrrolidone carboxylic acid", year=1975, journal="J2",
          mesh=["Glutamine"], major=["Glutamine"]),
    Paper(pmid="4", title="Precursors of light chains", year=1978, journal="J2",
          mesh=["Immunoglobulin", "Glutamine"], major=["Immunoglobulin"], refs=["1"]),
    Paper(pmid="5", title="Heart rate in rats", year=1977, journal="J3", mesh=["Heart"]),
    Paper(pmid="6", title="Rat kidney function", year=1979, journal="J3", mesh=["Kidney"]),
]}
INTENT = Intent(id="ls-x", anchor="1", query="Glutamine in light chains",
                relevance={"2": 3, "3": 3, "4": 3, "5": 0})


class Search:
    def __init__(self):
        self.calls = 0

    def __call__(self, queries, k=5):
        self.calls += 1
        words = set(queries[0].lower().split())
        ranked = sorted(PAPERS, key=lambda p: (-len(words & set(PAPERS[p].title.lower()
                                                                .split())), p))
        return [[RetrievalHit(rank=i + 1, chunk_id=p, score=1.0 / (i + 1), section_id=p,
                              doc_id=p) for i, p in enumerate(ranked[:k])]]


@pytest.fixture()
def lib():
    return Library(PAPERS, Search(), Search())


def test_templates_are_valid_and_every_structural_corruption_is_caught():
    kinds = {"drop_required_node": {"dangling_input"}, "filter_before_search": {"arity"},
             "wrong_operator": {"arity", "bad_params"}, "invalid_parameter": {"bad_params"},
             "dangling_input": {"dangling_input"}, "cycle": {"cycle"}}
    for name, wf in templates(INTENT).items():
        parsed, problems = D.parse(wf)
        assert not problems and not D.validate(parsed), name
    wf = templates(INTENT)["citations"]
    for kind in STRUCTURAL:
        bad = corrupt(wf, kind)
        parsed, problems = D.parse(bad)
        found = {p.kind for p in problems or D.validate(parsed)}
        assert found & kinds[kind], (kind, found)
    assert D.parse("{not json")[1][0].kind == "schema"
    assert D.parse({"nodes": [], "output": "x"})[1][0].kind == "schema"
    unknown = {"nodes": [{"id": "a", "op": "google", "params": {}}], "output": "a"}
    assert [p.kind for p in D.validate(D.parse(unknown)[0])] == ["unknown_op", "unreachable"]
    evid = {"nodes": [{"id": "a", "op": "keyword_search", "params": {"query": "xy"}},
                      {"id": "b", "op": "evidence", "inputs": ["a"], "params": {"query": "x y"}},
                      {"id": "c", "op": "dedup", "inputs": ["b"]}], "output": "c"}
    assert "edge_type" in {p.kind for p in D.validate(D.parse(evid)[0])}


def test_operators_on_the_citation_graph(lib):
    ops = lib.ops()
    seed = ops["seed"]([], pmids=["1"])
    assert ranking(ops["cite_backward"]([seed])) == ["2", "3"]
    assert ranking(ops["cite_forward"]([seed])) == ["4"]
    fused = ops["fuse"]([[("a", 1), ("b", 1)], [("b", 1), ("c", 1)]])
    assert ranking(fused)[0] == "b"  # in both lists
    kept = ops["filter_year"]([[(p, 1) for p in PAPERS]], min=1977, max=1978)
    assert ranking(kept) == ["1", "4", "5"]
    assert ranking(ops["filter_terms"]([[(p, 1) for p in PAPERS]], terms=["glutamine"],
                                       field="mesh", mode="exclude")) == ["2", "5", "6"]
    with pytest.raises(ValueError, match="unknown PMID"):
        ops["seed"]([], pmids=["999"])
    with pytest.raises(ValueError, match="no model"):
        ops["filter_model"]([seed], criterion="light chains")


def test_memo_reuses_unchanged_nodes_after_a_feedback_edit(lib):
    memo = D.Memo()
    wf = templates(INTENT)["citations"]
    value, hashes = D.run(D.parse(wf)[0], lib.ops(), memo)
    n = len(wf["nodes"])
    assert (memo.hits, memo.misses) == (0, n)
    D.run(D.parse(wf)[0], lib.ops(), memo)
    assert memo.hits == n  # same workflow: all from the memo
    searches = lib.keyword.calls
    edited = edits(wf, accepted=["4"], rejected=["5"], papers=PAPERS)["expand_and_drop"]
    before = memo.hits
    _, h2 = D.run(D.parse(edited)[0], lib.ops(), memo)
    assert memo.hits - before == n - 1  # every old node but the final exclude
    assert lib.keyword.calls == searches  # no search ran again
    assert {k: h2[k] for k in hashes if k != "out"} == {k: v for k, v in hashes.items()
                                                        if k != "out"}


def test_simulated_user_and_metrics():
    user = SimulatedUser(INTENT, top=3)
    acc, rej = user.feedback(["5", "2", "6", "3"])
    assert acc == ["2"] and rej == ["5", "6"]
    assert user.feedback(["5", "2", "3"]) == (["3"], [])  # judged papers are not shown again
    m = metrics(["5", "2", "6"], INTENT)
    assert m["hit5"] == 1.0 and m["mrr"] == pytest.approx(0.5)
    import math

    dcg = 3 / math.log2(3)
    ideal = 3 + 3 / math.log2(3) + 3 / math.log2(4)
    assert m["ndcg10"] == pytest.approx(dcg / ideal)


def test_feedback_edits():
    wf = templates(INTENT)["hybrid"]
    e = edits(wf, accepted=["2"], rejected=["5"], papers=PAPERS)
    assert set(e) == {"expand_accepted", "drop_rejected", "filter_rejected_terms",
                      "expand_and_drop", "keep"}
    assert e["keep"] == wf
    drop = e["drop_rejected"]["nodes"][-1]["params"]["pmids"]
    assert set(drop) == {"1", "5"}  # the anchor and the rejected paper
    filt = next(n for n in e["filter_rejected_terms"]["nodes"] if n["op"] == "filter_terms")
    assert filt["params"]["terms"] == ["Heart"] and filt["params"]["mode"] == "exclude"
    for wf2 in e.values():
        assert not D.validate(D.parse(wf2)[0])


def test_a_dialogue_where_the_model_repairs_its_workflow(lib):
    """Free policy, scripted model: turn 1 writes a workflow with a cycle, sees the
    validator's error, repairs it; turn 2 answers the feedback; metrics per turn."""
    from workbench.agent_packs.litsearch.dialogue import model_turns, start
    from workbench.models import load_model

    good = templates(INTENT)["citations"]
    cyc = corrupt(good, "cycle")

    def call(wf):
        return f'<tool_call>\n{json.dumps({"name": "submit_workflow", "arguments": {"workflow": wf}})}\n</tool_call>'  # noqa: E501

    replies = [call(cyc), call(good), call(good)]
    model = load_model("fake", responses=replies)
    ds = start([INTENT], "system", "Find papers related to: {query}")
    from workbench.agent_packs.config import AgentConfig

    for _ in range(2):
        model_turns(ds, lib, model, policy="free")
    (d,) = ds
    assert [t["error"] for t in d.turns] == [None, None]
    assert d.turns[0]["choice"] == "citations"
    assert any(m["role"] == "tool" and "cycle: the inputs form a cycle" in m["content"]
               for m in d.messages)
    assert d.turns[1]["memo_hits"] > 0  # the same workflow again: served from the memo
    assert d.messages[-1]["role"] == "user"  # the user's feedback ends the dialogue so far
    assert AgentConfig().turns == 3


def test_teacher_exports_sft_and_preference_pairs(lib, tmp_path):
    from workbench.agent_packs.litsearch.api import export_training, run_condition
    from workbench.agent_packs.config import AgentConfig

    lib.intents = [INTENT]
    rows = run_condition("oracle", [INTENT], lib, None, 2, AgentConfig())
    assert rows[0]["turns"][0]["choice"] in templates(INTENT)
    info = export_training(tmp_path, rows, lib)
    assert info["sft"] == 1 and info["preferences"] >= len(STRUCTURAL)
    pairs = [json.loads(x)
             for x in (tmp_path / "litsearch_preferences.jsonl").read_text().splitlines()]
    assert {p["kind"] for p in pairs} >= set(STRUCTURAL)
    assert all(p["chosen"] != p["rejected"] for p in pairs)
    # the one pair format: every row reads as a PreferencePair, with the tools offered
    from workbench.formats import read_preferences

    read = read_preferences(tmp_path / "litsearch_preferences.jsonl")
    assert len(read) == len(pairs) and all(p.tools for p in read)
    sft = json.loads((tmp_path / "litsearch_sft.messages.jsonl").read_text().splitlines()[0])
    assert sft["messages"][-1]["role"] == "assistant"


def test_edits_and_execution_errors_on_a_workflow_the_model_wrote(lib):
    """Feedback edits work on any valid workflow, and an operator's failure of any kind is
    an execution error of that workflow, not a crash."""
    mine = {"nodes": [{"id": "kw", "op": "keyword_search", "params": {"query": "light chains"}}],
            "output": "kw"}
    e = edits(mine, accepted=["2"], rejected=["5"], papers=PAPERS)
    assert {"expand_accepted", "drop_rejected", "keep"} <= set(e)
    for wf in e.values():
        assert not D.validate(D.parse(wf)[0])
    judge = {"nodes": [mine["nodes"][0], {"id": "j", "op": "filter_model", "inputs": ["kw"],
                                          "params": {"criterion": "light chains"}}],
             "output": "j"}
    assert not D.validate(D.parse(judge)[0])
    with pytest.raises(D.ExecutionError, match="no model"):
        D.run(D.parse(judge)[0], lib.ops())
