import json


from workbench.retrieval.context import format_context, with_context
from workbench.records import RetrievalHit


def _hit(i, text):
    return RetrievalHit(rank=i, chunk_id=f"c{i}", score=1.0, section_id="s", doc_id="d",
                        heading_path=["Ch", f"Sec {i}"], text=text)


def test_context_cites_sources_and_respects_budget():
    hits = [_hit(1, "alpha " * 10), _hit(2, "beta " * 10), _hit(3, "gamma " * 100)]
    ctx = format_context(hits, max_tokens=60)
    assert ctx.startswith("[1] Ch > Sec 1\nalpha")
    assert "[2] Ch > Sec 2" in ctx and "[3] Ch > Sec 3" in ctx and ctx.endswith("...")
    assert len(ctx.split()) <= 60
    assert format_context(hits, max_tokens=10).count("[") == 0 or len(
        format_context(hits, max_tokens=10).split()) <= 10
    assert "Question: q" in with_context("q", ctx)


def test_build_query_eval_end_to_end(tmp_path, cli):
    idx = tmp_path / "idx"
    r = cli("rag", "build", "datasets/rf", "--out", str(idx), "-s", "rag.chunk_size=96",
                "-s", "rag.chunk_overlap=16", env={"TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr
    assert "chunks from" in r.stdout
    r = cli("rag", "query", str(idx), "standing wave ratio", "--retriever", "keyword",
                "-k", "3", "--json")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["rank"] for x in rows] == [1, 2, 3]
    assert set(rows[0]) == {"rank", "chunk_id", "score", "section_id", "document",
                            "heading_path", "source", "text"}
    assert rows[0]["source"].endswith(".md") and "standing" in rows[0]["text"].lower()
    chunks = [json.loads(line) for line in (idx / "chunks.jsonl").read_text().splitlines()]
    by_heading = {c["heading_path"][-1]: c for c in chunks}
    # qrels at section level, JSONL and TREC forms
    qrels = [("q1", "What is the voltage standing wave ratio?", "Voltage Standing Wave Ratio"),
             ("q2", "How deep does current flow in copper at 1 GHz (skin depth)?",
              "Losses and Attenuation"),
             ("q3", "Which impedance does a quarter-wave line present?",
              "Input Impedance of a Terminated Line")]
    jl = tmp_path / "qrels.jsonl"
    jl.write_text("".join(json.dumps({"query_id": q, "query": t,
                                      "relevant": [by_heading[h]["section_id"]]}) + "\n"
                          for q, t, h in qrels))
    out = tmp_path / "eval.json"
    r = cli("rag", "eval", str(idx), "--qrels", str(jl), "--level", "section", "--out",
                str(out))
    assert r.returncode == 0, r.stderr
    assert "| keyword |" in r.stdout and "| hybrid |" in r.stdout
    summary = json.loads(out.read_text())
    assert summary["semantic"]["hit@10"] == 1.0
    trec = tmp_path / "qrels.trec"
    trec.write_text("".join(f"{q} 0 {by_heading[h]['section_id']} 1\n" for q, _, h in qrels))
    tsv = tmp_path / "queries.tsv"
    tsv.write_text("".join(f"{q}\t{t}\n" for q, t, _ in qrels))
    r = cli("rag", "eval", str(idx), "--qrels", str(trec), "--queries", str(tsv),
                "--level", "section", "--out", str(tmp_path / "eval2.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "eval2.json").read_text()) == summary
    r = cli("rag", "query", str(tmp_path / "nope"), "x")
    assert r.returncode == 1 and "no such index folder" in r.stderr
    r = cli("rag", "eval", str(idx), "--qrels", str(trec))
    assert r.returncode == 3 and "--queries" in r.stderr
