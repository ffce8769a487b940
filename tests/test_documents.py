"""Documents as they arrive: Word, PowerPoint, Excel, CSV, EPUB and PDF with tables, each
into sections with heading paths and provenance (pages, slides, sheet, rows); bad and hostile
files named and skipped."""

import zipfile

import pytest

from docgen import make_docx, make_epub, make_pptx, make_table_pdf, make_xlsx
from workbench.corpus import ingest
from workbench.corpus import formats as fmts
from workbench.errors import DataError


def by_source(rep):
    out = {}
    for s in rep.sections:
        out.setdefault(s.source, []).append(s)
    return out


def test_office_and_book_formats_keep_headings_tables_and_provenance(tmp_path):
    make_docx(tmp_path / "lna.docx", [
        ("h1", "Low-noise amplifiers"), ("p", "An LNA sets the noise figure of a receiver."),
        ("h2", "Matching"), ("p", "Noise matching differs from power matching."),
        ("table", [["Device", "NF (dB)"], ["GaAs pHEMT", "0.4"], ["SiGe HBT", "0.9"]])])
    make_epub(tmp_path / "book.epub", "RF Basics", [
        ("Decibels", ["A decibel is ten times the log of a power ratio."]),
        ("Smith chart", ["The Smith chart maps reflection coefficients."])])
    make_pptx(tmp_path / "talk.pptx", [
        ("Mixers", "A mixer multiplies two signals.", "Mention image rejection."),
        ("Filters", "Butterworth filters are maximally flat.", None)],
        table=[["Order", "Rolloff"], ["2", "40 dB/dec"]])
    (tmp_path / "bands.csv").write_text("band,low GHz,high GHz\nL,1,2\nS,2,4\n")
    rep = ingest(tmp_path)
    assert not rep.skipped, rep.skipped
    got = by_source(rep)
    docx = got["lna.docx"]
    assert [s.heading_path for s in docx] == [["Low-noise amplifiers"],
                                              ["Low-noise amplifiers", "Matching"]]
    assert "| Device | NF (dB) |\n| --- | --- |\n| GaAs pHEMT | 0.4 |" in docx[1].text
    epub = got["book.epub"]
    assert [s.heading_path for s in epub] == [["Decibels"], ["Smith chart"]]
    assert "**Title:**" not in epub[0].text and "power ratio" in epub[0].text
    assert {d.source: d.title for d in rep.documents}["book.epub"] == "RF Basics"
    talk = got["talk.pptx"]
    assert [(s.heading_path, s.metadata) for s in talk] == [
        (["Mixers"], {"slides": [1, 1]}), (["Filters"], {"slides": [2, 2]})]
    assert "Notes:\nMention image rejection." in talk[0].text  # notes stay with their slide
    assert "| 2 | 40 dB/dec |" in talk[1].text
    csv = got["bands.csv"]
    assert csv[0].heading_path == ["bands"] and "| S | 2 | 4 |" in csv[0].text
    assert {d.source: d.format for d in rep.documents} == {
        "lna.docx": "docx", "book.epub": "epub", "talk.pptx": "pptx", "bands.csv": "csv"}


def test_a_long_sheet_is_cut_into_row_blocks_that_each_carry_the_header(tmp_path):
    make_xlsx(tmp_path / "parts.xlsx", {
        "Amplifiers": [["Part", "Gain dB"]] + [[f"A{i}", 10 + i] for i in range(50)],
        "Notes": [["Note"], ["Keep inputs below 0 dBm"]]})
    secs = ingest(tmp_path).sections
    assert [(s.heading_path, s.metadata) for s in secs] == [
        (["parts", "Amplifiers", "rows 1-40"], {"sheet": "Amplifiers", "rows": [1, 40]}),
        (["parts", "Amplifiers", "rows 41-50"], {"sheet": "Amplifiers", "rows": [41, 50]}),
        (["parts", "Notes"], {"sheet": "Notes"})]
    assert secs[1].text.startswith("| Part | Gain dB |\n| --- | --- |\n| A40 | 50 |")
    assert secs[1].text.count("\n| A") == 10


def test_pdf_tables_come_out_as_markdown_tables_in_reading_order_with_pages(tmp_path):
    make_table_pdf(tmp_path / "sheet.pdf", ["Datasheet of the LNA-7.", "Typical values."],
                   [["Parameter", "Value", "Unit"], ["Gain", "18", "dB"], ["NF", "0.8", "dB"]],
                   ["Absolute maximum input: 10 dBm."], second_page=["About packaging."])
    got = by_source(ingest(tmp_path))
    sheet = got["sheet.pdf"]
    assert [(s.heading_path, s.metadata) for s in sheet] == [
        (["sheet", "page 1"], {"pages": [1, 1]}), (["sheet", "page 2"], {"pages": [2, 2]})]
    assert sheet[0].text == ("Datasheet of the LNA-7.\nTypical values.\n"
                             "| Parameter | Value | Unit |\n|---|---|---|\n| Gain | 18 | dB |\n"
                             "| NF | 0.8 | dB |\nAbsolute maximum input: 10 dBm.")
    # a PDF's sections follow its outline (tests/test_document_structure.py), never `#` lines


def test_bad_and_hostile_files_are_named_and_skipped(tmp_path, monkeypatch):
    (tmp_path / "truncated.docx").write_bytes(b"PK\x03\x04garbage")
    with zipfile.ZipFile(tmp_path / "wrong.pptx", "w") as z:
        z.writestr("hello.txt", "a zip, not a presentation")
    with zipfile.ZipFile(tmp_path / "bomb.xlsx", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("xl/big.xml", b"\0" * (3 * 2**20))
    (tmp_path / "enc.pdf").write_bytes(b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF")
    (tmp_path / "latin1.csv").write_bytes("caf\xe9,1\n".encode("latin-1"))
    outside = tmp_path.parent / "secret.md"
    outside.write_text("# Secret\n\nnot yours\n")
    corpus = tmp_path
    (corpus / "link.md").symlink_to(outside)
    monkeypatch.setattr(fmts, "MAX_EXPANDED_MB", 2)
    rep = ingest(corpus)
    skipped = dict(rep.skipped)
    assert set(skipped) == {"truncated.docx", "wrong.pptx", "bomb.xlsx", "enc.pdf",
                            "latin1.csv", "link.md"}
    assert "not a readable docx" in skipped["truncated.docx"]
    assert "unreadable pptx" in skipped["wrong.pptx"]
    assert "expands to 3 MB (limit 2 MB)" in skipped["bomb.xlsx"]
    assert "PDF" in skipped["enc.pdf"] and "UTF-8" in skipped["latin1.csv"]
    assert "a link" in skipped["link.md"]
    assert not rep.sections
    with pytest.raises(DataError, match="bomb.xlsx|enc.pdf|latin1.csv|link.md|truncated"):
        ingest(corpus, on_error="fail")


def test_a_workspace_takes_uploads_of_every_format_and_reads_them(tmp_path):
    """Uploads go through save_upload's allow-list into the workspace corpus, and the corpus
    reader gets sections from each of them."""
    from workbench.workspace import open_workspace, save_upload

    made = mixed_corpus(tmp_path / "made")
    (made / "bands.csv").write_text("band,low GHz,high GHz\nL,1,2\nS,2,4\n")
    ws = open_workspace(tmp_path / "ws")
    for f in sorted(made.iterdir()):
        save_upload(ws, f.name, f.read_bytes())
    rep = ingest(ws / "corpus")
    assert not rep.skipped
    assert {d.format for d in rep.documents} == {"docx", "pptx", "epub", "xlsx", "pdf", "csv"}


def mixed_corpus(folder):
    folder.mkdir(parents=True, exist_ok=True)
    make_docx(folder / "lna.docx", [
        ("h1", "Low-noise amplifiers"),
        ("p", "A low-noise amplifier sets the noise figure of the whole receiver, because the "
              "noise of later stages is divided by its gain. Its input is matched for the "
              "lowest noise rather than for the highest gain. A gain of fifteen to twenty "
              "decibels keeps the noise of the mixer small. Its linearity limits the "
              "strongest signal the receiver can take without distortion."),
        ("h2", "Devices"), ("table", [["Device", "NF (dB)"], ["GaAs pHEMT", "0.4"],
                                      ["SiGe HBT", "0.9"]])])
    make_pptx(folder / "mixers.pptx", [
        ("Mixers", "A mixer multiplies the RF signal with the local oscillator to move it to "
                   "the intermediate frequency. A double-balanced mixer suppresses the "
                   "leakage of both input ports. Conversion loss of a passive diode mixer is "
                   "about six decibels. The local oscillator must drive the diodes hard "
                   "enough to switch them fully.", "Image rejection comes next."),
        ("Image frequency", "The image lies on the other side of the local oscillator, at the "
                            "same distance as the wanted signal. A filter before the mixer "
                            "removes the image. A high intermediate frequency moves the image "
                            "far from the wanted band. An image-reject mixer cancels it with "
                            "two paths in quadrature.", None)])
    make_epub(folder / "antennas.epub", "Antennas", [
        ("Dipoles", ["A half-wave dipole has a gain of about 2.15 dBi and a radiation "
                     "resistance near 73 ohms. Its pattern is a doughnut around the wire. "
                     "Shortening the dipole lowers its radiation resistance sharply. A balun "
                     "feeds the balanced dipole from an unbalanced coaxial cable."])])
    make_xlsx(folder / "bands.xlsx", {"Bands": [["Band", "From GHz", "To GHz"], ["L", 1, 2],
                                                ["S", 2, 4], ["C", 4, 8], ["X", 8, 12]]})
    make_table_pdf(folder / "lna7.pdf", ["Datasheet of the LNA-7 amplifier.",
                                         "Typical values at 25 degrees."],
                   [["Parameter", "Value", "Unit"], ["Gain", "18", "dB"],
                    ["Noise figure", "0.8", "dB"]], ["Absolute maximum input: 10 dBm.",
                                                     "The supply draws 40 mA at 5 volts.",
                                                     "The package is a 2 mm square."])
    return folder


def test_a_mixed_corpus_is_indexed_and_its_tables_and_slides_are_retrieved(tmp_path, cli,
                                                                            embedder):
    """End to end on the bundled embedder: every format becomes chunks that cite their file
    and place; a question about a PDF table's row finds that table."""
    import json

    corpus = mixed_corpus(tmp_path / "corpus")
    idx = tmp_path / "idx"
    r = cli("rag", "build", str(corpus), "--out", str(idx), env={"TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr
    chunks = [json.loads(x) for x in (idx / "chunks.jsonl").read_text().splitlines()]
    assert {c["source"] for c in chunks} == {"lna.docx", "mixers.pptx", "antennas.epub",
                                             "bands.xlsx", "lna7.pdf"}
    r = cli("rag", "query", str(idx), "What is the noise figure of the LNA-7 amplifier?",
            "--retriever", "hybrid", "-k", "2", "--json")
    hits = [json.loads(x) for x in r.stdout.splitlines()]
    pdf = [h for h in hits if h["source"] == "lna7.pdf"]
    assert pdf and pdf[0]["heading_path"] == ["lna7", "page 1"], hits
    assert "| Noise figure | 0.8 | dB |" in pdf[0]["text"]
    r = cli("rag", "query", str(idx), "Where does the image frequency lie?",
            "--retriever", "semantic", "-k", "1", "--json")
    top = json.loads(r.stdout.splitlines()[0])
    assert top["source"] == "mixers.pptx" and top["heading_path"] == ["Image frequency"]


def test_distillation_runs_on_a_mixed_corpus_with_the_bundled_model(tmp_path, cli,
                                                                     bundled_model):
    """Full tier: the bundled teacher distils sections of every format; each question it
    writes, and each sample kept, names the section (and so the file) it came from."""
    import json

    corpus = mixed_corpus(tmp_path / "corpus")
    # a 135M writer gets few questions through the checks on sections this short (0-5 of ~14
    # tasks reach the quality gates, by seed and engine; a CI run saw 0 at seed 0): the first
    # of three seeds whose questions reach the gates is checked, kept or not
    for seed in (0, 1, 2):
        out = tmp_path / f"runs{seed}"
        r = cli("distill", "run", "-s", f"corpus={corpus}", "-s", f"output_dir={out}",
                "-s", "name=docs", "-s", "domain=rf", "-s", "distill.mode=composed",
                "-s", "distill.answer_source=text", "-s", "distill.verifier.enabled=false",
                "-s", "distill.answer_max_tokens=64", "-s", f"seed={seed}",
                "-s", "distill.perspectives=[concepts,analysis]", "-s", "distill.kinds=[mc]",
                "-s", "distill.benchmark_fraction=0", "-s", "distill.constrained=auto",
                "-s", "distill.min_section_chars=40", "-s", "distill.write_attempts=3",
                env={"TQDM_DISABLE": "1"})
        assert r.returncode == 0, r.stderr
        run = out / "docs" / "distill"
        gated = [json.loads(x) for x in (run / "gates.jsonl").read_text().splitlines()]
        if gated:
            break
    report = json.loads((run / "report.json").read_text())
    sections = {x["id"]: x for x in map(json.loads,
                                        (run / "sections.jsonl").read_text().splitlines())}
    assert {x["source"] for x in sections.values()} == {
        "lna.docx", "mixers.pptx", "antennas.epub", "bands.xlsx", "lna7.pdf"}
    assert report["sections"] == len(sections) and report["stages"]["tasks"] > 0
    assert gated and all(g["section_id"] in sections for g in gated)
    rows = [json.loads(x) for f in ("mcQTSA.jsonl", "ndQTSA.jsonl")
            for x in (run / f).read_text().splitlines()]
    assert all(r["provenance"]["section_id"] in sections for r in rows)


def test_zip_and_sheet_bombs_are_refused_unread(tmp_path):
    """A member that expands past what it declares, a compression method other than
    deflate, and a tiny workbook that names a far corner cell are all refused."""
    from openpyxl import Workbook

    with zipfile.ZipFile(tmp_path / "bz2.docx", "w", zipfile.ZIP_BZIP2) as z:
        z.writestr("word/document.xml", b"<w/>" * 1000)
    wb = Workbook()
    wb.active["A1"] = "x"
    wb.active.cell(row=200000, column=1, value="y")
    wb.active.cell(row=1, column=16000, value="z")
    wb.save(tmp_path / "sparse.xlsx")
    skipped = dict(ingest(tmp_path).skipped)
    assert "compression method 12" in skipped["bz2.docx"]
    assert "200,000 rows x 16,000 columns" in skipped["sparse.xlsx"]
