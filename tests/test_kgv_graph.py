"""KG fact verification on a graph as it comes: N-Triples, Turtle (written with rdflib) or a
TSV of triples, labels and aliases from rdfs:label / skos:altLabel or a label column, claims
as triples or as free sentences, evidence from documents or from the graph itself."""

import json

import pytest

from workbench.agent_packs.kgv.api import load_kg
from workbench.errors import DataError, WorkbenchError

EX = "http://example.org/rf/"


def rf_graph():
    import rdflib
    from rdflib.namespace import RDFS, SKOS

    g = rdflib.Graph()
    ex = rdflib.Namespace(EX)
    names = {"LNA": ("low-noise amplifier", ["LNA"]), "Amplifier": ("amplifier", []),
             "Mixer": ("mixer", ["frequency mixer"]), "Receiver": ("receiver", ["RX"]),
             "Oscillator": ("oscillator", [])}
    for k, (label, aliases) in names.items():
        g.add((ex[k], RDFS.label, rdflib.Literal(label, lang="en")))
        for a in aliases:
            g.add((ex[k], SKOS.altLabel, rdflib.Literal(a)))
    g.add((ex.LNA, ex.hypernym, ex.Amplifier))
    g.add((ex.LNA, ex.partOf, ex.Receiver))
    g.add((ex.Mixer, ex.partOf, ex.Receiver))
    g.add((ex.Mixer, ex.drivenBy, ex.Oscillator))
    g.add((ex.drivenBy, RDFS.label, rdflib.Literal("is driven by")))
    return g


def test_an_n_triples_graph_with_claims_as_triples_and_no_documents(tmp_path):
    rf_graph().serialize(tmp_path / "graph.nt", format="nt", encoding="utf-8")
    (tmp_path / "claims.tsv").write_text(
        "subject\tpredicate\tobject\tlabel\tpart\n"
        f"{EX}LNA\t{EX}partOf\t{EX}Receiver\tSUPPORTED\tdev\n"
        "frequency mixer\tis driven by\toscillator\tSUPPORTED\tdev\n"
        f"{EX}LNA\t{EX}drivenBy\t{EX}Oscillator\tREFUTED\ttrain\n")
    claims, docs, extra = load_kg(tmp_path)
    c0, c1, _ = claims
    assert c0.subject.label == "low-noise amplifier" and c0.subject.aliases == ["LNA"]
    assert c0.form == "triple" and c0.part == "dev" and claims[2].part == "train"
    # entities and predicates named by their labels and aliases resolve to the graph's
    assert c1.subject.id == EX + "Mixer" and c1.predicate == EX + "drivenBy"
    assert extra[EX + "drivenBy"].verbal == "{s} is driven by {o}"
    assert extra[EX + "partOf"].verbal == "{s} part of {o}"  # its local name
    # without documents, each subject entity's facts are its evidence entry
    mixer = next(d for d in docs if d.heading_path == ["mixer"])
    assert mixer.text == ("mixer (also: frequency mixer): Mixer is driven by oscillator. "
                          "Mixer part of receiver.")


def test_a_turtle_graph_with_free_sentence_claims_and_a_document_folder(tmp_path):
    rf_graph().serialize(tmp_path / "kg.ttl", format="turtle")
    (tmp_path / "claims.txt").write_text(
        "Low-noise amplifier is a kind of amplifier.\tSUPPORTED\n"
        "A mixer multiplies two signals to change their frequency.\tSUPPORTED\n"
        "# a comment line\n"
        "An oscillator has no phase noise.\n")
    (tmp_path / "documents").mkdir()
    (tmp_path / "documents" / "mixers.md").write_text(
        "# Mixers\n\nA mixer multiplies the RF signal with the local oscillator to change its "
        "frequency.\n")
    claims, docs, _ = load_kg(tmp_path)
    worded, free, unlabelled = claims
    assert worded.form == "wording" and worded.predicate == "hypernym"
    assert worded.subject.id == EX + "LNA"  # the name in the sentence found in the graph
    assert free.form == "sentence" and free.subject is None and free.label == "SUPPORTED"
    assert unlabelled.label is None
    assert [d.source for d in docs] == ["mixers.md"]


def test_a_tsv_graph_with_label_columns(tmp_path):
    (tmp_path / "graph.tsv").write_text(
        "Q1\tpart of\tQ2\tlow-noise amplifier\treceiver\n"
        "Q1\talias\tLNA\n"
        "Q3\tpart of\tQ2\tmixer\treceiver\n")
    (tmp_path / "claims.tsv").write_text("LNA\tpart of\treceiver\tSUPPORTED\n")
    claims, docs, extra = load_kg(tmp_path)
    assert claims[0].subject.id == "Q1" and claims[0].subject.aliases == ["LNA"]
    assert "part of" in extra and {d.heading_path[0] for d in docs} == {
        "low-noise amplifier", "mixer"}


@pytest.mark.parametrize("files, expect", [
    ({"graph.ttl": "@prefix ex: <http://e/> .\nex:a ex:b .\n", "claims.txt": "A b c.\n"},
     "not valid Turtle"),
    ({"graph.tsv": "a\tb\tc\n", "claims.tsv": "a\tb\n"}, "claims.tsv:1"),
    ({"graph.tsv": "a\tb\tc\n", "claims.tsv": "a\tb\tc\tMAYBE\n"}, "label 'MAYBE'"),
    ({"graph.tsv": "a\tb\n", "claims.txt": "A b c.\n"}, "graph.tsv:1"),
    ({"claims.txt": "Mixers multiply signals.\n"}, "no evidence"),
    ({"graph.nt": "<http://e/a> <http://e/b> <http://e/c> .\n"}, "no claims.tsv"),
])
def test_bad_graph_folders_are_refused_naming_the_file(tmp_path, files, expect):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises((DataError, WorkbenchError)) as e:
        load_kg(tmp_path)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_the_job_on_a_graph_reports_each_claim_form(tmp_path, tiny_model):
    """The KGV job on an N-Triples graph and mixed claims (tiny random-init model): every
    claim runs, a free sentence's agent searches the sentence itself, and the report has a
    section per form; unlabelled claims are refused by the evaluation."""
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    data = tmp_path / "kg"
    data.mkdir()
    rf_graph().serialize(data / "graph.nt", format="nt", encoding="utf-8")
    lines = ["Low-noise amplifier is a kind of amplifier.\tSUPPORTED",
             "Mixer is a part of receiver.\tSUPPORTED",
             "Oscillator is a kind of amplifier.\tREFUTED",
             "A mixer is driven by an oscillator in every receiver.\tSUPPORTED",
             "Amplifiers and mixers never appear in receivers.\tREFUTED",
             "The receiver contains an oscillator for the mixer.\tSUPPORTED"]
    (data / "claims.txt").write_text("\n".join(lines) + "\n")
    cfg = load_config("configs/kgv_demo.yaml", [
        f"models.chat.spec={tiny_model}", f"agent.data={data}", "agent.dev_limit=10",
        "agent.conditions=[closed_book,rag,agent]", "agent.retriever=keyword",
        f"output_dir={tmp_path / 'runs'}", "name=kg"])
    run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))
    out = tmp_path / "runs" / "kg" / "agent"
    from workbench.agent_packs.kgv.report import read_report
    from workbench.agent_packs.reports import report_json

    rep = read_report(out / "report.json")
    assert report_json(rep) == (out / "report.json").read_text()
    forms = rep.conditions["rag"]
    assert forms["wording"].n + forms["sentence"].n == rep.dev_claims == 4
    md = (out / "report.md").read_text()
    assert "## sentences verified as a whole" in md and "## sentences read as triples" in md
    rag = [json.loads(x) for x in (out / "trajectories" / "rag.jsonl").read_text().splitlines()]
    free = [t for t in rag if t["metadata"]["form"] == "sentence"]
    assert free and all(t["steps"][0]["arguments"]["query"] == t["metadata"]["verbal"]
                        for t in free)  # a sentence is searched as itself
    (data / "claims.txt").write_text("A mixer is driven by an oscillator.\n")
    with pytest.raises(WorkbenchError, match="no label"):
        run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lambda m: None))


def test_odd_labels_and_claims_rows_are_text_or_one_line(tmp_path):
    (tmp_path / "graph.tsv").write_text("A\tcosts {x}\tB\n")
    (tmp_path / "claims.jsonl").write_text('{"text": "A costs a lot of money", "label": 1}\n')
    with pytest.raises(DataError, match=r"claims.jsonl:1.*label 1"):
        load_kg(tmp_path)
    (tmp_path / "claims.jsonl").write_text('{"text": "A costs a lot of money", "id": 5}\n')
    claims, docs, extra = load_kg(tmp_path)
    assert claims[0].id == "5" and docs[0].text == "a: A costs {x} b."


def test_a_linked_file_in_a_graph_folder_is_not_followed(tmp_path):
    outside = tmp_path / "secret.tsv"
    outside.write_text("A\tknows\tB\n")
    data = tmp_path / "kg"
    data.mkdir()
    (data / "graph.tsv").write_text("A\tknows\tB\n")
    (data / "claims.tsv").symlink_to(outside)
    with pytest.raises(WorkbenchError, match="claims.tsv is a link"):
        load_kg(data)


def test_fever_labels_and_lines_are_read_and_not_enough_info_is_one_line(tmp_path):
    (tmp_path / "graph.tsv").write_text("A\tknows\tB\nB\tknows\tC\n")
    fever = [{"id": 75397, "verifiable": "VERIFIABLE", "label": "SUPPORTS",
              "claim": "A knows B.", "evidence": [[[92206, 104971, "A", 7]]]},
             {"id": 150448, "verifiable": "VERIFIABLE", "label": "REFUTES",
              "claim": "C knows A.", "evidence": [[[174271, 187498, "C", 0]]]}]
    (tmp_path / "claims.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fever))
    claims, _, _ = load_kg(tmp_path)
    assert [(c.id, c.label, c.evidence) for c in claims] == [
        ("75397", "SUPPORTED", []), ("150448", "REFUTED", [])]
    (tmp_path / "claims.jsonl").unlink()
    (tmp_path / "claims.tsv").write_text("A\tknows\tB\tSupports\nB\tknows\tA\trefutes\n"
                                         "A\tknows\tC\tFALSE\n")
    assert [c.label for c in load_kg(tmp_path)[0]] == ["SUPPORTED", "REFUTED", "REFUTED"]
    (tmp_path / "claims.tsv").write_text("A\tknows\tB\tSUPPORTS\nB\tknows\tA\tNOT ENOUGH INFO\n")
    with pytest.raises(DataError, match=r"claims.tsv:2.*NOT ENOUGH INFO.*SUPPORTED or "
                                        r"REFUTED only"):
        load_kg(tmp_path)


def test_a_predicate_written_as_users_write_it_is_the_graphs(tmp_path):
    import rdflib
    from rdflib.namespace import RDFS

    g = rdflib.Graph()
    ex = rdflib.Namespace(EX)
    for k, label in (("HeartFailure", "heart failure"), ("Disease", "disease"),
                     ("Heart", "heart"), ("Body", "body")):
        g.add((ex[k], RDFS.label, rdflib.Literal(label)))
    g.add((ex.HeartFailure, RDFS.subClassOf, ex.Disease))
    g.add((ex.Heart, ex.part_of, ex.Body))
    g.serialize(tmp_path / "graph.ttl", format="turtle")
    (tmp_path / "claims.tsv").write_text(
        "heart failure\tsubClassOf\tdisease\tSUPPORTED\n"
        "heart failure\trdfs:subClassOf\tdisease\tSUPPORTED\n"
        "heart failure\tsub class of\tdisease\tSUPPORTED\n"
        "heart\tpartOf\tbody\tSUPPORTED\n"
        "heart\ttreats\tdisease\tREFUTED\n")  # no wording anywhere: said as a sentence
    claims, _, extra = load_kg(tmp_path)
    assert [c.predicate for c in claims[:4]] == [str(RDFS.subClassOf)] * 3 + [EX + "part_of"]
    assert all(c.predicate in extra for c in claims[:4])
    assert (claims[4].form, claims[4].text) == ("sentence", "heart treats disease")


def test_names_that_differ_only_in_case_resolve_to_their_own_entity(tmp_path):
    (tmp_path / "graph.tsv").write_text(
        "ex:AppleInc\tlabel\tApple\nex:apple\tlabel\tapple\nex:fruit\tlabel\tfruit\n"
        "ex:company\tlabel\tcompany\nex:apple\tis a\tex:fruit\nex:AppleInc\tis a\tex:company\n"
        "ex:pear\tlabel\tpear\nex:pear\tis a\tex:fruit\n")
    (tmp_path / "claims.tsv").write_text("apple\tis a\tfruit\tSUPPORTED\n"
                                         "Apple\tis a\tcompany\tSUPPORTED\n"
                                         "PEAR\tis a\tfruit\tSUPPORTED\n"
                                         "APPLE\tis a\tfruit\tSUPPORTED\n")
    claims, _, _ = load_kg(tmp_path)
    assert [c.subject.id for c in claims] == ["ex:apple", "ex:AppleInc", "ex:pear", "APPLE"]
