"""A researcher's library as the literature-search corpus: BibTeX, RIS, PubMed XML, OpenAlex
and Semantic Scholar JSONL, each written by its format's own library (bibtexparser, rispy,
ElementTree) or as the service exports it; citations resolved inside the library, intents
made from them, and a library without citations running with the citation operators off."""

import json
import re
import time
import xml.etree.ElementTree as ET

import pytest

from workbench.agent_packs.litsearch.library import anchors_for, read_library
from workbench.agent_packs.litsearch.pack import edits, load_corpus, templates
from workbench.errors import DataError

# ten papers about receivers; W0 cites W1, W2, W3 and is cited by W4 (anchor material)
TOPICS = ["low-noise amplifier noise figure", "mixer image rejection", "LNA input matching",
          "noise figure of cascaded stages", "receiver sensitivity budget",
          "superheterodyne receiver design", "phase noise of oscillators",
          "antenna gain and directivity", "Smith chart matching", "filter insertion loss"]
CITES = {0: [1, 2, 3, 99], 4: [0], 5: [0, 1]}  # 99: a work outside the library


def openalex(i):
    return {"id": f"https://openalex.org/W{i}", "doi": f"https://doi.org/10.1000/rf.{i}",
            "title": f"On {TOPICS[i]}", "publication_year": 2000 + i,
            "primary_location": {"source": {"display_name": "RF Journal"}},
            "abstract_inverted_index": {"We": [0], "study": [1], TOPICS[i].split()[0]: [2]},
            "keywords": [{"display_name": "Receivers"}, {"display_name": TOPICS[i]}],
            "referenced_works": [f"https://openalex.org/W{j}" for j in CITES.get(i, [])]}


def semantic_scholar(i):
    return {"paperId": f"s2-{i}", "externalIds": {"DOI": f"10.1000/rf.{i}"},
            "title": f"On {TOPICS[i]}", "year": 2000 + i, "venue": "RF Journal",
            "abstract": f"We study {TOPICS[i]}.", "fieldsOfStudy": ["Engineering"],
            "references": [{"paperId": f"s2-{j}"} for j in CITES.get(i, [])]}


def write_bibtex(path, n=8, keywords=("LNA", "noise figure")):
    from bibtexparser import Library, write_string
    from bibtexparser.model import Entry, Field

    lib = Library([Entry("article", f"key{i}", [
        Field("title", "{On} " + TOPICS[i]), Field("year", str(2000 + i)),
        Field("journal", "RF Journal"), Field("doi", f"10.1000/rf.{i}"),
        Field("keywords", ", ".join(keywords)), Field("abstract", f"We study {TOPICS[i]}.")])
        for i in range(n)])
    path.write_text(write_string(lib))


def write_pubmed(path):
    root = ET.Element("PubmedArticleSet")
    for i in range(6):
        art = ET.SubElement(root, "PubmedArticle")
        mc = ET.SubElement(art, "MedlineCitation")
        ET.SubElement(mc, "PMID").text = str(100 + i)
        a = ET.SubElement(mc, "Article")
        j = ET.SubElement(a, "Journal")
        ET.SubElement(j, "Title").text = "RF Journal"
        ET.SubElement(ET.SubElement(ET.SubElement(j, "JournalIssue"), "PubDate"),
                      "Year").text = str(1990 + i)
        ET.SubElement(a, "ArticleTitle").text = f"On {TOPICS[i]}"
        ET.SubElement(ET.SubElement(a, "Abstract"), "AbstractText").text = "We study it."
        mesh = ET.SubElement(mc, "MeshHeadingList")
        for term, major in (("Receivers", "Y"), (TOPICS[i], "N")):
            ET.SubElement(ET.SubElement(mesh, "MeshHeading"), "DescriptorName",
                          MajorTopicYN=major).text = term
        refs = ET.SubElement(ET.SubElement(art, "PubmedData"), "ReferenceList")
        for k in CITES.get(i, []):
            ids = ET.SubElement(ET.SubElement(refs, "Reference"), "ArticleIdList")
            ET.SubElement(ids, "ArticleId", IdType="pubmed").text = str(100 + k)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def test_every_format_reads_into_papers_with_in_library_citations(tmp_path):
    import rispy

    (tmp_path / "oa.jsonl").write_text("".join(json.dumps(openalex(i)) + "\n"
                                               for i in range(10)))
    papers, summary = read_library(tmp_path / "oa.jsonl")
    assert summary["files"]["oa.jsonl"] == {"format": "openalex", "records": 10}
    p0 = papers["10.1000/rf.0"]  # the DOI is the id when there is no PMID
    assert p0.title == "On low-noise amplifier noise figure" and p0.year == 2000
    assert p0.abstract == "We study low-noise" and p0.journal == "RF Journal"
    assert p0.refs == ["10.1000/rf.1", "10.1000/rf.2", "10.1000/rf.3"]  # W99 is not ours
    assert summary["citation_edges"] == 6

    (tmp_path / "s2.jsonl").write_text("".join(json.dumps(semantic_scholar(i)) + "\n"
                                               for i in range(10)))
    s2, summary = read_library(tmp_path / "s2.jsonl")
    assert summary["files"]["s2.jsonl"]["format"] == "semanticscholar"
    assert s2["10.1000/rf.4"].refs == ["10.1000/rf.0"] and s2["10.1000/rf.0"].mesh == [
        "Engineering"]

    write_pubmed(tmp_path / "pm.xml")
    pm, _ = read_library(tmp_path / "pm.xml")
    assert pm["100"].refs == ["101", "102", "103"] and pm["100"].major == ["Receivers"]
    assert pm["101"].year == 1991

    write_bibtex(tmp_path / "lib.bib")
    bib, summary = read_library(tmp_path / "lib.bib")
    assert bib["10.1000/rf.0"].title == "On low-noise amplifier noise figure"  # braces gone
    assert bib["10.1000/rf.0"].mesh == ["LNA", "noise figure"] and summary["citation_edges"] == 0

    (tmp_path / "lib.ris").write_text(rispy.dumps([
        {"type_of_reference": "JOUR", "title": f"On {TOPICS[i]}", "year": str(2000 + i),
         "journal_name": "RF Journal", "doi": f"10.1000/rf.{i}", "keywords": ["LNA"]}
        for i in range(3)]))
    ris, _ = read_library(tmp_path / "lib.ris")
    assert sorted(ris) == ["10.1000/rf.0", "10.1000/rf.1", "10.1000/rf.2"]
    assert ris["10.1000/rf.2"].journal == "RF Journal"


def test_a_folder_of_exports_merges_the_same_paper_by_doi(tmp_path):
    write_bibtex(tmp_path / "mine.bib", n=3)
    (tmp_path / "oa.jsonl").write_text("".join(json.dumps(openalex(i)) + "\n"
                                               for i in range(10)))
    papers, summary = read_library(tmp_path)
    assert len(papers) == 10 and set(summary["files"]) == {"mine.bib", "oa.jsonl"}
    p0 = papers["10.1000/rf.0"]
    assert "LNA" in p0.mesh and "Receivers" in p0.mesh  # keywords of both exports
    assert p0.refs == ["10.1000/rf.1", "10.1000/rf.2", "10.1000/rf.3"]


def test_intents_come_from_the_library_citations_or_else_its_keywords(tmp_path):
    (tmp_path / "oa.jsonl").write_text("".join(json.dumps(openalex(i)) + "\n"
                                               for i in range(10)))
    papers, intents = load_corpus(tmp_path / "oa.jsonl")
    anchors = {i.anchor: i for i in intents}
    assert "10.1000/rf.0" in anchors
    rel = anchors["10.1000/rf.0"].relevance
    assert {k for k, v in rel.items() if v == 3} == {"10.1000/rf.1", "10.1000/rf.2",
                                                     "10.1000/rf.3", "10.1000/rf.4",
                                                     "10.1000/rf.5"}
    assert anchors["10.1000/rf.0"].query == "On low-noise amplifier noise figure"
    write_bibtex(tmp_path / "lib.bib")
    bib, _ = read_library(tmp_path / "lib.bib")
    kw = anchors_for(bib)
    assert kw and all(sum(v >= 2 for v in i.relevance.values()) >= 3 for i in kw)


def test_without_citations_the_citation_workflows_are_not_offered(tmp_path):
    write_bibtex(tmp_path / "lib.bib")
    papers, intents = load_corpus(tmp_path / "lib.bib")
    names = set(templates(intents[0], citations=False))
    assert names == {"keyword", "semantic", "hybrid"}
    wf = templates(intents[0], citations=False)["hybrid"]
    accepted = [p for p in intents[0].relevance][:1]
    assert not any(k.startswith("expand") for k in edits(wf, accepted, [], papers))


@pytest.mark.parametrize("name, content, expect", [
    ("bad.jsonl", '{"id": "https://openalex.org/W1", "title": "x"}\n{oops\n', "bad.jsonl:2"),
    ("odd.jsonl", '{"name": "neither"}\n', "neither an OpenAlex work"),
    ("bad.bib", "@article{k1, title={Fine}, year=2001}\n@article{k2, title={Broken\n",
     "bad.bib:2"),
    ("latin.ris", "TY  - JOUR\nTI  - caf\xe9\nER  - \n", "not UTF-8"),
    ("broken.xml", "<PubmedArticleSet><PubmedArticle>", "PubMed/MEDLINE XML"),
    ("notes.txt", "hello", "not a library file"),
])
def test_a_bad_library_file_is_refused_in_one_line_naming_it(tmp_path, name, content, expect):
    path = tmp_path / name
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(DataError) as e:
        read_library(path)
    assert expect in str(e.value) and name in str(e.value)
    assert "\n" not in str(e.value)


def test_the_agent_evaluates_on_a_bibtex_library_with_citations_off(tmp_path):
    """The pipeline end to end on the bundled embedder (no chat model: the rule conditions),
    from a BibTeX file; the log says the citation operators are off."""
    from workbench.config import load_config
    from workbench.runs import RunContext, RunLayout, run_pipeline

    write_bibtex(tmp_path / "lib.bib")
    cfg = load_config(None, ["agent.pack=litsearch", f"agent.data={tmp_path / 'lib.bib'}",
                             "agent.turns=2", "agent.conditions=[query_only,fixed,oracle]",
                             f"output_dir={tmp_path / 'runs'}", "name=bib"])
    lines = []
    res = run_pipeline("agent", cfg, RunContext(layout=RunLayout.of(cfg), log=lines.append))
    assert any("has no citations" in line and "cite_backward" in line for line in lines)
    out = tmp_path / "runs" / "bib" / "agent"
    from workbench.agent_packs.litsearch.report import read_report
    from workbench.agent_packs.reports import report_json

    report = read_report(tmp_path / "runs" / "bib")
    assert report_json(report) == (out / "litsearch_report.json").read_text()
    assert set(report.conditions) == {"query_only", "fixed", "oracle"}
    assert report.citations is False and report.intents > 0
    assert "no citations" in (out / "litsearch_report.md").read_text()
    assert all("citations" not in c for v in report.conditions.values()
               for c in v.choices)
    assert res.pipeline == "agent"
    assert res.figures == {f"{c}_ndcg10": round(v, 4) for c, v in report.ndcg10().items()}


def test_the_bundled_model_searches_an_openalex_library(tmp_path, bundled_model, cli):
    """Full tier: the agent on the bundled model over an OpenAlex export, citations on."""
    (tmp_path / "oa.jsonl").write_text("".join(json.dumps(openalex(i)) + "\n"
                                               for i in range(10)))
    r = cli("agent", "run", "litsearch", "configs/litsearch_demo.yaml", "-i", "ls-000",
            "-s", "agent.turns=2", "-s", f"agent.data={tmp_path / 'oa.jsonl'}",
            "-s", f"output_dir={tmp_path / 'runs'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("call submit_workflow") == 2 and "nDCG@10" in r.stdout


@pytest.mark.parametrize("record", [
    {"id": "https://openalex.org/W1", "title": "x", "ids": ["not", "a", "dict"]},
    {"id": "https://openalex.org/W1", "title": "x", "primary_location": "x"},
    {"paperId": "p1", "title": "x", "fieldsOfStudy": "Biology"},
])
def test_a_record_with_a_field_of_an_odd_type_is_named_by_its_line(tmp_path, record):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"id": "https://openalex.org/W0", "title": "fine"}) + "\n"
                    + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=r"odd.jsonl:2"):
        read_library(path)


def test_a_gzipped_pubmed_bomb_is_refused_with_little_memory(tmp_path):
    import gzip

    with gzip.open(tmp_path / "bomb.xml.gz", "wb") as fh:
        fh.write(b'<?xml version="1.0"?>\n<PubmedArticleSet>')
        for _ in range(40):
            fh.write(b" " * (1 << 20))
    # refused by whichever bound it passes first: 8 MB from 40 KB is far over 32 to 1
    with pytest.raises(DataError, match="text without a tag|times its compressed size"):
        read_library(tmp_path / "bomb.xml.gz")


# three topics of four papers each, as a library exported without keywords
LIBRARY = {
    "lna": ["Cascode low-noise amplifier noise figure at millimetre-wave frequencies",
            "Inductive degeneration matching of a cascode low-noise amplifier",
            "Noise figure and gain of a wideband cascode low-noise amplifier",
            "A low-noise amplifier with cascode inductive degeneration for receivers"],
    "pll": ["Phase-locked loop jitter and reference spur suppression",
            "Charge-pump phase-locked loop spur and jitter analysis",
            "Fractional-N phase-locked loop jitter with a charge-pump",
            "Reference spur reduction in charge-pump phase-locked loops"],
    "ant": ["Microstrip patch antenna bandwidth with a slotted ground plane",
            "Slotted patch antenna array gain and bandwidth",
            "Bandwidth enhancement of a microstrip patch antenna array",
            "Ground plane slots in microstrip antenna arrays"]}


def test_a_bibtex_library_without_keywords_still_gives_intents(tmp_path):
    from bibtexparser import Library, write_string
    from bibtexparser.model import Entry, Field

    entries = [Entry("article", f"{topic}{i}", [Field("title", t), Field("year", "2020"),
                                                Field("abstract", f"We study {t.lower()}.")])
               for topic, titles in LIBRARY.items() for i, t in enumerate(titles)]
    (tmp_path / "lib.bib").write_text(write_string(Library(entries)))
    papers, intents = load_corpus(tmp_path / "lib.bib")
    assert len(papers) == 12 and not any(p.mesh for p in papers.values())
    assert intents, "no intents from a library without keywords"
    for it in intents:  # what an intent finds relevant is of its own topic
        topic = it.anchor.rstrip("0123456789")
        assert all(k.startswith(topic) for k, v in it.relevance.items() if v >= 2), it
    # a keyword field under another name (Scopus, Web of Science, Mendeley) is read
    scopus = Entry("article", "s1", [Field("title", "T"), Field("author_keywords", "LNA; PLL"),
                                     Field("keywords-plus", "NOISE")])
    (tmp_path / "lib.bib").write_text(write_string(Library([scopus])))
    assert read_library(tmp_path / "lib.bib")[0]["s1"].mesh == ["LNA", "PLL", "NOISE"]


def test_records_that_share_an_id_stay_apart_and_are_counted(tmp_path):
    import rispy
    from bibtexparser import Library, write_string
    from bibtexparser.model import Entry, Field

    (tmp_path / "lib.ris").write_text(rispy.dumps([
        {"type_of_reference": "JOUR", "id": "1", "title": LIBRARY["lna"][0]},
        {"type_of_reference": "JOUR", "id": "1", "title": LIBRARY["pll"][0]},
        {"type_of_reference": "JOUR", "id": "2", "title": LIBRARY["ant"][0]},
        {"type_of_reference": "JOUR", "id": "2", "title": LIBRARY["ant"][0]}]))  # one twice
    papers, summary = read_library(tmp_path / "lib.ris")
    assert {k: p.title for k, p in papers.items()} == {
        "1": LIBRARY["lna"][0], "1-2": LIBRARY["pll"][0], "2": LIBRARY["ant"][0]}
    assert summary["shared_ids"] == {"records": 1, "ids": ["1"]}
    # BibTeX: a key used twice is two entries, not a refusal
    (tmp_path / "lib.ris").unlink()
    (tmp_path / "lib.bib").write_text(write_string(Library([
        Entry("article", "k", [Field("title", LIBRARY["lna"][1])]),
        Entry("article", "k2", [Field("title", LIBRARY["pll"][1])])])).replace("k2", "k"))
    papers, summary = read_library(tmp_path / "lib.bib")
    assert sorted(p.title for p in papers.values()) == sorted([LIBRARY["lna"][1],
                                                               LIBRARY["pll"][1]])
    assert summary["shared_ids"]["ids"] == ["k"]


def test_a_large_pubmed_library_gives_intents_quickly(tmp_path):
    """30,000 records with common headings: grading looks only at papers that share a
    heading, a reference or a citation with the anchor (all of them share `Humans`)."""
    import time

    from workbench.agent_packs.litsearch.pack import Paper

    papers = {str(i): Paper(pmid=str(i), title=f"Paper {i}", abstract="", year=2000,
                            journal="J", mesh=["Humans", f"Topic{i % 3000}", f"Sub{i % 1500}"],
                            major=[f"Topic{i % 3000}"], refs=[]) for i in range(30_000)}
    t = time.perf_counter()
    intents = anchors_for(papers, anchors=10)
    assert len(intents) == 10 and time.perf_counter() - t < 60


def test_embedding_a_large_library_counts_in_a_logs_progress_lines(embedder, monkeypatch):
    """A 30,000-record library embeds for many minutes: with no terminal (a job's log), the
    embedder counts the texts it has embedded of all, so the progress lines say how far it
    is (tests/test_progress.py reads the lines themselves)."""
    import workbench.progress as P

    seen = []
    real = P.count

    def spy(desc, total, unit="it", **k):
        seen.append((desc, total, unit))
        return real(desc, total, unit, **k)

    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(P, "count", spy)
    n = 3 * embedder.batch_size
    vecs = embedder.embed([f"paper {i} on noise figure" for i in range(n)])
    assert vecs.shape[0] == n and seen == [("embedding", n, "text")]


def test_a_library_says_what_it_kept_apart_derived_or_could_not_make(tmp_path):
    import rispy

    from workbench.agent_packs.litsearch.library import library_hash

    (tmp_path / "lib.ris").write_text(rispy.dumps([
        {"type_of_reference": "JOUR", "id": "1", "title": LIBRARY["lna"][0]},
        {"type_of_reference": "JOUR", "id": "1", "title": LIBRARY["pll"][0]}]))
    lines = []
    papers, intents = load_corpus(tmp_path / "lib.ris", log=lines.append)
    assert len(papers) == 2 and not intents
    text = "\n".join(lines)
    assert "1 record(s) share an id" in text and "no record has keywords" in text
    assert "no evaluation intents: none of the 2 papers" in text
    before = library_hash(tmp_path / "lib.ris")
    (tmp_path / "lib.ris").write_text((tmp_path / "lib.ris").read_text() + "\n")
    assert library_hash(tmp_path / "lib.ris") != before  # an edited export is new input


# --- progress while reading a large library (issue 46 item 2) ---------------------------------

_WORDS = "noise figure amplifier mixer receiver antenna filter oscillator phase gain".split()
PROGRESS_LINE = re.compile(r"^\[progress\] reading the library > records read: (\d+)/(\d+) "
                           r"record \(\d+%\), [0-9.e+-]+/s, \d+s, ETA (\S+)$")


def _library_of(n: int, fmt: str, path) -> None:
    """`n` generated records in one of the formats (a @string macro used by every BibTeX
    entry; the last entry of a BibTeX file broken when `fmt` is "bib-broken")."""
    def words(i: int, k: int) -> str:
        return " ".join(_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(k))

    if fmt.startswith("bib"):
        parts = ['@string{jnl = "Journal of Receivers"}\n']
        parts += [f"@article{{key{i},\n  title = {{Paper {i} on {words(i, 5)}}},\n"
                  f"  journal = jnl,\n  year = {{{2000 + i % 20}}},\n"
                  f"  keywords = {{{words(i, 1)}; {words(i + 1, 1)}}},\n"
                  f"  abstract = {{{words(i, 30)}}}\n}}\n\n" for i in range(n)]
        if fmt == "bib-broken":
            parts[-1] = f"@article{{key{n - 1}, title={{Broken\n"
        path.write_text("".join(parts))
    elif fmt == "ris":
        path.write_text("".join(f"TY  - JOUR\nID  - r{i}\nTI  - Paper {i} on {words(i, 5)}\n"
                                f"PY  - {2000 + i % 20}\nKW  - {words(i, 1)}\n"
                                f"AB  - {words(i, 30)}\nER  - \n\n" for i in range(n)))
    elif fmt == "xml":
        path.write_text('<?xml version="1.0"?>\n<PubmedArticleSet>\n' + "".join(
            f"<PubmedArticle><MedlineCitation><PMID>{1000 + i}</PMID><Article><Journal>"
            f"<JournalIssue><PubDate><Year>{2000 + i % 20}</Year></PubDate></JournalIssue>"
            f"</Journal><ArticleTitle>Paper {i} on {words(i, 5)}</ArticleTitle><Abstract>"
            f"<AbstractText>{words(i, 30)}</AbstractText></Abstract></Article>"
            f"</MedlineCitation></PubmedArticle>\n" for i in range(n)) + "</PubmedArticleSet>\n")
    else:
        path.write_text("".join(json.dumps({
            "id": f"https://openalex.org/W{i}", "title": f"Paper {i} on {words(i, 5)}",
            "publication_year": 2000 + i % 20,
            "referenced_works": [f"https://openalex.org/W{(i * 7) % n}"]}) + "\n"
            for i in range(n)))


@pytest.mark.parametrize("fmt, name, n", [("bib", "lib.bib", 600), ("ris", "lib.ris", 3000),
                                          ("xml", "pubmed.xml", 3000),
                                          ("jsonl", "works.jsonl", 3000)])
def test_reading_a_large_library_logs_records_read_of_all_with_a_rate_and_eta(
        tmp_path, monkeypatch, capsys, fmt, name, n):
    """A redirected log while a library file of thousands of records is read: the lines
    count records read of those the file holds (counted in its text first), with a rate
    and the time left, and the count moves from line to line (before: "records read: 0
    record" until bibtexparser or rispy had parsed the whole file, 30,000 BibTeX records
    being minutes, and no total or ETA in any format). BibTeX and RIS are parsed a chunk of
    records at a time, cut where braces balance, giving the same papers as one parse."""
    import workbench.agent_packs.litsearch.library as L

    monkeypatch.setenv("WB_PROGRESS_SECONDS", "0.02")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setattr(L, "CHUNK_RECORDS", 100)
    real = L._Counted.append

    def slowed(self, record):  # at least ~1 s of reading on any machine: several lines
        real(self, record)
        time.sleep(0.0003)

    monkeypatch.setattr(L._Counted, "append", slowed)
    path = tmp_path / name
    _library_of(n, fmt, path)
    papers, summary = read_library(path)
    assert len(papers) == n and summary["files"][name]["records"] == n
    lines = [m.groups() for m in map(PROGRESS_LINE.match, capsys.readouterr().err.splitlines())
             if m]
    counts = [int(done) for done, _, _ in lines]
    assert lines and {int(total) for _, total, _ in lines} == {n}, lines[:3]
    assert counts == sorted(counts) and len({c for c in counts if c}) >= 2, counts
    assert any(int(done) and eta != "?" for done, _, eta in lines), lines
    if fmt in ("bib", "ris"):  # chunked as one parse reads it
        monkeypatch.setattr(L, "CHUNK_RECORDS", 10 ** 9)
        whole, _ = read_library(path)
        assert whole == papers
        if fmt == "bib":
            assert {p.journal for p in papers.values()} == {"Journal of Receivers"}


def test_a_broken_bibtex_entry_past_the_first_chunk_is_named_by_its_line(tmp_path,
                                                                         monkeypatch):
    import workbench.agent_packs.litsearch.library as L

    monkeypatch.setattr(L, "CHUNK_RECORDS", 50)
    path = tmp_path / "big.bib"
    _library_of(300, "bib-broken", path)
    line = path.read_text().splitlines().index("@article{key299, title={Broken") + 1
    with pytest.raises(DataError, match=rf"big\.bib:{line}: BibTeX entry not parsed"):
        read_library(path)
