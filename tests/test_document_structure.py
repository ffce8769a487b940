"""Documents keep the structure their format gives them (issue 46 item 4): headings from Word
styles and outline levels, HTML heading tags, EPUB navigation and a PDF's outline, never from
a text line that starts with `#`; spreadsheets with empty cells empty and text kept as text;
a slide's title and table on their slide; nothing in a folder passed over in silence. Every
file is written by its format's own library, in tmp_path."""

from docgen import make_docx, make_epub
from pdfgen import make_pdf

from workbench.corpus import SUPPORTED, html_to_markdown, ingest, split_markdown


def sections(rep, source):
    return [s for s in rep.sections if s.source == source]


def test_code_comments_and_shell_prompts_never_become_headings(tmp_path):
    # EPUB (EbookLib): a comment paragraph and a prompt in a pre block
    make_epub(tmp_path / "manual.epub", "Manual", [
        ("Installing", ["Run the installer as root.", "# apt-get install workbench",
                        "# this comment explains the next line"]),
        ("Using", ["Start it."])])
    # HTML: a pre block with a comment on its first line, a paragraph starting with #
    (tmp_path / "guide.html").write_text(
        "<h1>Guide</h1><p>Edit the file:</p><pre># config.ini\nport = 80\n# end</pre>"
        "<p># not a heading either</p><h2>Running</h2><p>Run it.</p>")
    # Word (python-docx): a paragraph that starts with #
    make_docx(tmp_path / "notes.docx", [("h1", "Notes"), ("p", "# a comment in code"),
                                        ("p", "More text.")])
    # a Sphinx page: a navigation sidebar, permalinks, a highlighted code block
    (tmp_path / "sphinx.html").write_text(
        '<nav class="sidebar"><ul><li><a href="#">Home</a></li></ul></nav>'
        '<div class="related" role="navigation"><div><h3>Navigation</h3></div><ul><li>'
        'next</li></ul></div>'
        '<h1>Setup<a class="headerlink" href="#setup">¶</a></h1><div class="highlight"><pre>'
        '<span></span><span class="c1"># create the folder</span>\nmkdir out\n</pre></div>'
        '<h2>Learn C#<a class="headerlink" href="#c">#</a></h2><p>Types.</p>')
    rep = ingest(tmp_path)
    assert not rep.skipped, rep.skipped
    sphinx = sections(rep, "sphinx.html")
    assert [(s.heading_path, s.text) for s in sphinx] == [
        (["Setup"], "```\n# create the folder\nmkdir out\n```"),
        (["Setup", "Learn C#"], "Types.")]
    assert [s.heading_path for s in sections(rep, "manual.epub")] == [["Installing"],
                                                                       ["Using"]]
    assert "# apt-get install workbench" in sections(rep, "manual.epub")[0].text
    guide = sections(rep, "guide.html")
    assert [s.heading_path for s in guide] == [["Guide"], ["Guide", "Running"]]
    assert "```\n# config.ini\nport = 80\n# end\n```" in guide[0].text
    assert "# not a heading either" in guide[0].text
    notes = sections(rep, "notes.docx")
    assert [s.heading_path for s in notes] == [["Notes"]]
    assert "# a comment in code" in notes[0].text
    # the markdown view of HTML escapes such lines, so it splits the same way
    md = html_to_markdown("<h1>A</h1><p># x = 1</p>")
    assert [h for h, _ in split_markdown(md, "t")] == [["A"]]


def test_an_epub_chapter_without_a_heading_tag_is_titled_by_the_navigation(tmp_path):
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("urn:test:nav")
    book.set_title("Field Guide")
    book.set_language("en")
    chapters = []
    for i, (head, text) in enumerate([("Birds", "Birds have feathers."),
                                      ("Bees", "Bees make honey.")], start=1):
        ch = epub.EpubHtml(title=head, file_name=f"c{i}.xhtml", lang="en")
        ch.content = f"<p class='chapter-title'>{head}</p><p>{text}</p>"  # no h tag
        book.add_item(ch)
        chapters.append(ch)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    epub.write_epub(str(tmp_path / "guide.epub"), book)
    rep = ingest(tmp_path)
    assert [(s.heading_path, s.text.splitlines()[-1]) for s in rep.sections] == [
        (["Birds"], "Birds have feathers."), (["Bees"], "Bees make honey.")]
    assert rep.documents[0].title == "Field Guide"


def test_a_pdf_is_split_by_its_outline_and_hash_lines_stay_text(tmp_path):
    from pypdf import PdfReader, PdfWriter

    make_pdf(tmp_path / "plain.pdf", [
        ["Front matter."], ["1 Setup", "Install it.", "# run as root"],
        ["more setup", "1.1 Options", "Set the port."], ["2 Use", "Start it."]])
    writer = PdfWriter()
    for page in PdfReader(tmp_path / "plain.pdf").pages:
        writer.add_page(page)
    setup = writer.add_outline_item("1 Setup", 1)
    writer.add_outline_item("1.1 Options", 2, parent=setup)
    writer.add_outline_item("2 Use", 3)
    with open(tmp_path / "book.pdf", "wb") as fh:
        writer.write(fh)
    (tmp_path / "plain.pdf").unlink()
    secs = ingest(tmp_path).sections
    assert [(s.heading_path, s.metadata) for s in secs] == [
        (["book"], {"pages": [1, 1]}),
        (["1 Setup"], {"pages": [2, 3]}),
        (["1 Setup", "1.1 Options"], {"pages": [3, 3]}),
        (["2 Use"], {"pages": [4, 4]})]
    assert secs[1].text == "Install it.\n# run as root\nmore setup"
    # without an outline: a section per page, and a `#` line is text
    make_pdf(tmp_path / "notes.pdf", [["# Gain", "Gain is a ratio."]])
    notes = sections(ingest(tmp_path), "notes.pdf")
    assert [(s.heading_path, s.text) for s in notes] == [
        (["notes", "page 1"], "# Gain\nGain is a ratio.")]


def test_word_headings_come_from_custom_styles_and_outline_levels(tmp_path):
    from docx import Document
    from docx.enum.style import WD_STYLE_TYPE
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    doc = Document()
    doc.add_heading("Overview", level=1)
    doc.add_paragraph("What the device does.")
    style = doc.styles.add_style("Appendix Heading", WD_STYLE_TYPE.PARAGRAPH)
    style.base_style = doc.styles["Heading 1"]  # a heading by the style it is based on
    doc.add_paragraph("Appendix A", style="Appendix Heading")
    doc.add_paragraph("Register map.")
    p = doc.add_paragraph("Appendix B")  # a heading by its own outline level
    lvl = OxmlElement("w:outlineLvl")
    lvl.set(qn("w:val"), "0")
    p._p.get_or_add_pPr().append(lvl)
    doc.add_paragraph("Timing diagrams.")
    doc.save(str(tmp_path / "manual.docx"))
    secs = ingest(tmp_path).sections
    assert [(s.heading_path, s.text) for s in secs] == [
        (["Overview"], "What the device does."), (["Appendix A"], "Register map."),
        (["Appendix B"], "Timing diagrams.")]


def test_spreadsheet_cells_are_their_text_and_empty_cells_empty(tmp_path):
    from openpyxl import Workbook

    wb = Workbook()
    ws = wb.active
    ws.title = "Parts"
    ws.append(["Part", "Gain", None, "Note"])
    ws.append(["A1", 12, "x", None])
    ws.append(["n/a", None, None, "line one\nline two"])
    ws.append([None, None, None, None])
    ws.append(["B2", 2.5, "NaN", "NA"])
    wb.save(str(tmp_path / "parts.xlsx"))
    (tmp_path / "bands.csv").write_text('band,low,note\nL,1,\nS,,"n/a"\nC,4,"two\nlines"\n')
    rep = ingest(tmp_path)
    xlsx = sections(rep, "parts.xlsx")[0].text
    assert xlsx == ("| Part | Gain | C | Note |\n| --- | --- | --- | --- |\n"
                    "| A1 | 12 | x |  |\n| n/a |  |  | line one line two |\n"
                    "| B2 | 2.5 | NaN | NA |")
    assert "Unnamed" not in xlsx and "\\n" not in xlsx
    csv = sections(rep, "bands.csv")[0].text
    assert csv == ("| band | low | note |\n| --- | --- | --- |\n| L | 1 |  |\n| S |  | n/a |\n"
                   "| C | 4 | two lines |")


def test_each_slide_keeps_its_title_and_its_table(tmp_path):
    from pptx import Presentation
    from pptx.util import Inches

    prs = Presentation()
    s = prs.slides.add_slide(prs.slide_layouts[1])
    s.shapes.title.text = "Intro"
    s.placeholders[1].text = "The amplifier family."
    s = prs.slides.add_slide(prs.slide_layouts[6])  # blank: the title is a text box
    s.shapes.add_textbox(Inches(1), Inches(0.3), Inches(6), Inches(1)).text_frame.text = \
        "Limits"
    table = s.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1)).table
    for r, row in enumerate([["Input", "Max"], ["RF in", "10 dBm"]]):
        for c, val in enumerate(row):
            table.cell(r, c).text = val
    s = prs.slides.add_slide(prs.slide_layouts[6])  # no title at all
    s.shapes.add_textbox(Inches(1), Inches(3), Inches(6), Inches(2)).text_frame.text = \
        "A closing remark\nover two lines."
    prs.save(str(tmp_path / "deck.pptx"))
    secs = ingest(tmp_path).sections
    assert [(s.heading_path, s.metadata) for s in secs] == [
        (["Intro"], {"slides": [1, 1]}), (["Limits"], {"slides": [2, 2]}),
        (["deck", "slide 3"], {"slides": [3, 3]})]
    assert secs[0].text == "The amplifier family."
    assert secs[1].text == "| Input | Max |\n| --- | --- |\n| RF in | 10 dBm |"


def test_nothing_in_a_folder_is_passed_over_in_silence(tmp_path):
    (tmp_path / "README.md").write_text("# About this corpus\n\nLicence notes.\n")
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "README.md").write_text("# Guide\n\nStart here.\n")
    (tmp_path / "guide" / "setup.md").write_text("# Setup\n\nInstall.\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".notes.md").write_text("# Hidden\n\nx\n")
    (tmp_path / "data.bin").write_bytes(b"\x00\x01")
    rep = ingest(tmp_path)
    assert sorted(s.source for s in rep.sections) == ["guide/README.md", "guide/setup.md"]
    skipped = dict(rep.skipped)
    assert set(skipped) == {"README.md", ".git/", ".notes.md", "data.bin"}
    assert "the folder's own description" in skipped["README.md"]
    assert "hidden" in skipped[".git/"] and "hidden" in skipped[".notes.md"]
    assert "unsupported" in skipped["data.bin"]
    # named itself, the folder's README is read
    assert [s.heading_path for s in ingest(tmp_path / "README.md").sections] == [
        ["About this corpus"]]


def test_a_folder_that_cannot_be_listed_is_named(tmp_path, monkeypatch):
    import os

    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "a.md").write_text("# A\n\ntext\n")
    (tmp_path / "b.md").write_text("# B\n\ntext\n")
    real = os.scandir

    def scandir(path="."):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    rep = ingest(tmp_path)
    assert [s.source for s in rep.sections] == ["b.md"]
    assert rep.skipped == [("locked/", "folder not listed (Permission denied): not read")]


def test_data_ingest_help_names_every_format(cli):
    res = cli("data", "ingest", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split()).lower()
    for fmt in sorted(set(SUPPORTED.values())):
        name = {"md": "markdown", "txt": "text"}.get(fmt, fmt)
        assert name in text, fmt
