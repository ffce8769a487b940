import pytest

from pdfgen import make_pdf
from workbench.errors import DataError
from workbench.corpus import html_to_markdown, ingest, split_markdown


def test_markdown_heading_paths_and_code_fences():
    text = ("# Ch\n\nintro\n\n## Sec A\n\na text\n\n```\n# not a heading\n```\n\n### Sub\n\n"
            "sub text\n\n## Sec B\n\nb text\n")
    parts = split_markdown(text, "title")
    assert [p[0] for p in parts] == [["Ch"], ["Ch", "Sec A"], ["Ch", "Sec A", "Sub"],
                                     ["Ch", "Sec B"]]
    assert "# not a heading" in parts[1][1]


def test_html_to_sections():
    html = ("<html><head><title>t</title><style>p{}</style></head><body><h1>Mixers</h1>"
            "<p>A mixer <b>multiplies</b> two signals.</p><h2>Image rejection</h2><p>The "
            "image lies at 2 f<sub>LO</sub> - f<sub>RF</sub>.</p><script>x=1</script>"
            "</body></html>")
    parts = split_markdown(html_to_markdown(html), "t")
    assert parts[0] == (["Mixers"], "A mixer multiplies two signals.")
    assert parts[1][0] == ["Mixers", "Image rejection"] and "x=1" not in parts[1][1]


def test_every_format_and_bad_files(tmp_path):
    (tmp_path / "a.md").write_text("# Lines\n\n## Z0\n\nCharacteristic impedance.\n")
    (tmp_path / "b.txt").write_text("Plain notes about noise figure.\n\nSecond paragraph.\n")
    (tmp_path / "c.html").write_text("<h1>Filters</h1><p>Butterworth is maximally flat.</p>")
    make_pdf(tmp_path / "d.pdf", [["Antenna gain is directivity times efficiency."],
                                  ["A dipole has about 2.15 dBi of gain."]])
    (tmp_path / "empty.md").write_text("  \n")
    (tmp_path / "bin.txt").write_bytes(b"abc\x00\x01\x02")
    (tmp_path / "notes.docx").write_bytes(b"PK\x03\x04")
    (tmp_path / "fake.pdf").write_text("not a pdf")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    rep = ingest(tmp_path)
    by_src = {}
    for s in rep.sections:
        by_src.setdefault(s.source, []).append(s)
    assert by_src["a.md"][0].heading_path == ["Lines", "Z0"]
    assert by_src["b.txt"][0].heading_path == ["b"]
    assert by_src["c.html"][0].text == "Butterworth is maximally flat."
    assert [s.heading_path for s in by_src["d.pdf"]] == [["d", "page 1"], ["d", "page 2"]]
    assert "2.15 dBi" in by_src["d.pdf"][1].text
    skipped = dict(rep.skipped)
    assert set(skipped) == {"empty.md", "bin.txt", "notes.docx", "fake.pdf", "latin1.txt"}
    assert "empty" in skipped["empty.md"] and "binary" in skipped["bin.txt"]
    assert "not a readable docx" in skipped["notes.docx"] and "PDF" in skipped["fake.pdf"]
    assert "UTF-8" in skipped["latin1.txt"]
    with pytest.raises(DataError) as e:
        ingest(tmp_path, on_error="fail")
    assert "bin.txt" in str(e.value)


def test_ids_are_deterministic(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\n## B\n\ntext one\n\n## C\n\ntext two\n")
    one, two = ingest(tmp_path), ingest(tmp_path)
    assert [s.id for s in one.sections] == [s.id for s in two.sections]
    assert len({s.id for s in one.sections}) == 2
    assert all(s.content_hash for s in one.sections)


def test_rf_corpus_ingests_cleanly():
    from pathlib import Path

    rep = ingest(Path(__file__).resolve().parents[1] / "datasets" / "rf")
    # the folder's own README.md describes the corpus: listed as not read, never silently
    assert [f for f, _ in rep.skipped] == ["README.md"] and len(rep.sections) >= 8
    assert all(len(s.heading_path) == 2 for s in rep.sections)
