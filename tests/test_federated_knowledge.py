"""Track B of the federated pipeline: knowledge units (workflows) across data-agent sites —
the protocol (wire records, privacy filter, A/B gate, voting, promotion), the experiment in
process over the real Flower ClientApp, and resume."""

from __future__ import annotations

import json

import pytest

from workbench.federated.knowledge.units import (
    KnowledgeBase,
    KnowledgeOp,
    PrivacyFilter,
    ab_gate,
    apply_round,
    ops_from_record,
    ops_to_record,
    review_candidates,
    votes,
)


def wf(family, *steps, count=1, op="ADD", target=""):
    return KnowledgeOp(op=op, count=count, target=target, kind="workflow", family=family,
              text=f"{family}: " + " -> ".join(steps), steps=list(steps))


def test_ops_survive_the_wire_and_bad_records_are_refused():
    ops = [wf("join", "op=count", "lit=conds:eq:via1", count=3),
           KnowledgeOp(op="AGREE", target="abc123", count=2),
           KnowledgeOp(op="REMOVE", target="def", count=1)]
    rec = ops_to_record(ops)
    assert all(isinstance(v, list) for v in rec.values())
    assert all(len(s) <= 64 for v in rec.values() for s in v if isinstance(s, str))
    assert ops_from_record(rec) == ops
    with pytest.raises(ValueError, match="keys"):
        ops_from_record({**rec, "rows": ["x"]})
    with pytest.raises(ValueError, match="length"):
        ops_from_record({**rec, "count": [1]})
    with pytest.raises(ValueError):
        ops_from_record({**rec, "op": ["DROP TABLE", "AGREE", "REMOVE"]})


def test_privacy_filter_drops_canaries_identifiers_and_overlap():
    f = PrivacyFilter(private_texts=["How many Invoice rows have Total greater than 1.98 ?"],
                      identifiers=["Invoice", "BillingCountry", "Rocha"],
                      canaries=["CANARY-abc"], n=4)
    assert f.check("join: op=count -> lit=conds:eq:via1") == \
        ("join: op=count -> lit=conds:eq:via1", "")
    assert f.check("lookup: ask CANARY-abc")[0] is None
    assert "identifier" in f.check("filter on billingcountry first")[1]
    assert "overlap" in f.check("many invoice rows have total greater")[1] or \
        "identifier" in f.check("many invoice rows have total greater")[1]
    text, why = f.check("compare 'Lethbridge' with 20231 then mail a@b.org")
    assert why == "" and "<slot>" in text and "Lethbridge" not in text and "20231" not in text


def test_votes_promotion_needs_k_sites_and_inflated_counts_weigh_one_vote():
    kb = KnowledgeBase()
    good = wf("lookup", "op=select", "lit=conds:eq", count=2)
    bad = wf("lookup", "op=count", "lit=conds:gt", count=500)
    apply_round(kb, [("a", [good]), ("p", [bad])], k_min=2, rnd=1)
    assert not kb.active()  # one site each: candidates
    gid = next(u.id for u in kb.units.values() if u.steps[0] == "op=select")
    bid = next(u.id for u in kb.units.values() if u.steps[0] == "op=count")
    assert [c["id"] for c in kb.candidates_for("a", None)] == [bid]  # a voted on its own
    apply_round(kb, [("b", [KnowledgeOp(op="AGREE", target=gid, count=1),
                            KnowledgeOp(op="REMOVE", target=bid, count=1)]),
                     ("c", [KnowledgeOp(op="REMOVE", target=bid, count=1)]),
                     ("p", [bad])], k_min=2, rnd=2)
    assert kb.units[gid].status == "active" and kb.units[gid].promoted_round == 2
    assert votes(kb.units[bid]) == (1, 2)  # 1000 counts from p are one vote
    assert kb.units[bid].status == "retired"
    assert [u["id"] for u in kb.view(["lookup"])] == [gid] and kb.view(["join"]) == []
    assert set(kb.view(None)[0]) == {"id", "kind", "family", "text", "steps", "sites",
                                     "against", "support"}


def test_gate_and_review_follow_measured_success():
    table = {"good": 0.6, "bad": 0.1, "": 0.3}

    def success(units, family):
        return table[units[-1]["text"] if units else ""]

    cands = [wf("f", "op=a"), wf("f", "op=b")]
    cands[0].text, cands[1].text = "good", "bad"
    kept, log = ab_gate(cands + [KnowledgeOp(op="AGREE", target="x")], [], success)
    assert [o.text for o in kept if o.op == "ADD"] == ["good"] and len(log) == 2
    ops, _ = review_candidates([{"id": "g", "family": "f", "text": "good"},
                                {"id": "b", "family": "f", "text": "bad"},
                                {"id": "z", "family": "none", "text": "good"}],
                               [], success, lambda fam: 10 if fam == "f" else 0)
    assert [(o.op, o.target, o.count) for o in ops] == [("AGREE", "g", 3), ("REMOVE", "b", 2)]


def test_knowledge_experiment_end_to_end(knowledge_run):
    out = knowledge_run.report_dir
    report = json.loads((out / "report.json").read_text())
    fig = report["figures"]
    assert fig["canary_leaks"] == 0 and fig["sites"] == 4
    assert {t["condition"] for t in report["conditions"]} == {"none", "local", "federated"}
    assert fig["transfer"]["site"] == "site-3"  # the listener
    summary = json.loads((out / "federated" / "summary.json").read_text())
    assert set(summary["wire"]["record_names"]) <= {"knowledge", "families", "metrics",
                                                    "site"}
    assert summary["wire"]["canaries"] == 6 and summary["wire"]["long_strings"] == 0
    rounds = [json.loads(x) for x in (out / "federated" / "rounds.jsonl").read_text()
              .splitlines()]
    assert [r["used"] for r in rounds] == [4, 4, 4] and rounds[0]["bytes_up"] > 0
    assert sorted((out / "federated" / "kb").glob("round-*.json"))[-1].name == \
        "round-0003.json"
    md = (out / "report.md").read_text()
    assert "Cross-scaffold transfer" in md and "Wilson" in md and "canaries" in md


def test_knowledge_server_resumes_after_a_crash(knowledge_run, tmp_path, kill_injection):
    from workbench.federated.flower_app import client_app
    from workbench.federated.knowledge.api import knowledge_sites, run_knowledge_rounds

    cfg, out = knowledge_run.cfg, knowledge_run.report_dir
    app = client_app()
    fc = cfg.federated.model_copy(update={"rounds": 2})
    sites = knowledge_sites(fc, out)

    def crash(rnd):
        if rnd == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_knowledge_rounds(fc, sites, tmp_path / "cut", app, on_round=crash,
                             log=lambda m: None)
    logs = []
    run_knowledge_rounds(fc, sites, tmp_path / "cut", app, log=logs.append)
    assert logs[0].startswith("resuming after round 1")
    whole = tmp_path / "whole"
    run_knowledge_rounds(fc, sites, whole, app, log=lambda m: None)
    a = json.loads((tmp_path / "cut" / "kb" / "round-0002.json").read_text())
    b = json.loads((whole / "kb" / "round-0002.json").read_text())
    assert a["units"].keys() == b["units"].keys()


def test_knowledge_replies_outside_the_allow_list_are_refused():
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    from workbench.federated.config import FederatedConfig
    from workbench.federated.inprocess import InProcessGrid
    from workbench.federated.knowledge.server import KnowledgeServer

    InProcessGrid(None, [])  # sets the process's Flower task identity
    srv = KnowledgeServer(FederatedConfig(track="knowledge"), "/nonexistent")
    good = {"knowledge": ConfigRecord(ops_to_record([wf("join", "op=count")])),
            "metrics": MetricRecord({"eval-tasks": 3.0}),
            "site": ConfigRecord({"name": "site-0"})}

    def reply(**content):
        return Message(RecordDict(content), dst_node_id=5, message_type="query.knowledge")

    assert srv.check(reply(**good))[0] == "site-0"
    for bad, why in (({"metrics": MetricRecord({"SELECT * FROM patients": 1.0})}, "allow"),
                     ({"notes": ConfigRecord({"x": "row"})}, "allow-list"),
                     ({"families": ConfigRecord({"Patient Name": 3})}, "families"),
                     ({"knowledge": ConfigRecord({**ops_to_record([wf("join", "op=count")]),
                                                 "steps": ["x" * 60]})}, "")):
        with pytest.raises((ValueError, TypeError), match=why):
            srv.check(reply(**{**good, **bad}))


def test_a_site_exception_leaves_without_its_text(capsys):
    from workbench.federated.client import site_errors

    @site_errors
    def handler(msg, ctx):
        raise ValueError("bad row: 'Luis Goncalves, CANARY-1234'")

    with pytest.raises(RuntimeError) as e:
        handler(None, None)
    assert "CANARY" not in str(e.value) and "ValueError at the site" in str(e.value)
    assert "CANARY-1234" in capsys.readouterr().err  # kept in the site's own log


def test_privacy_filter_embedding_threshold_catches_paraphrases(embedder):
    private = ["What is the billing address of the customer whose last name is Rocha?"]
    f = PrivacyFilter(private, n=5, embed=lambda t: embedder.embed(t), max_similarity=0.8)
    assert f.check("the billing address of customer with surname Rocha")[0] is None
    assert f.check("lookup: op=select -> lit=conds:eq")[0] is not None
