"""Small real documents for the ingestion tests, each written by its format's own library
(python-docx, EbookLib, python-pptx, openpyxl), and PDF pages with ruled tables."""

from __future__ import annotations

import zipfile
from html import escape

from pdfgen import write_pdf

def make_docx(path, blocks: list[tuple[str, object]], title: str | None = None) -> None:
    """blocks: ("h1" | "h2" | "p", text) or ("table", rows), through python-docx."""
    from docx import Document

    doc = Document()
    if title:
        doc.core_properties.title = title
    for kind, content in blocks:
        if kind == "table":
            rows = list(content)
            table = doc.add_table(rows=len(rows), cols=len(rows[0]))
            for r, row in enumerate(rows):
                for c, val in enumerate(row):
                    table.cell(r, c).text = str(val)
        elif kind in ("h1", "h2"):
            doc.add_heading(str(content), level=int(kind[1]))
        else:
            doc.add_paragraph(str(content))
    doc.save(str(path))


def make_epub(path, title: str, chapters: list[tuple[str, list[str]]]) -> None:
    """chapters: (heading, paragraphs), one XHTML file each in the spine, through EbookLib."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("urn:workbench:test")
    book.set_title(title)
    book.set_language("en")
    book.add_author("A. Author")
    items = []
    for i, (head, paras) in enumerate(chapters, start=1):
        ch = epub.EpubHtml(title=head, file_name=f"ch{i}.xhtml", lang="en")
        ch.content = f"<h1>{escape(head)}</h1>" + "".join(f"<p>{escape(p)}</p>" for p in paras)
        book.add_item(ch)
        items.append(ch)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = items
    epub.write_epub(str(path), book)


def make_pptx(path, slides: list[tuple[str, str, str | None]], table: list[list[str]] | None
              = None) -> None:
    """slides: (title, body, speaker notes or None); `table` goes on the last slide."""
    from pptx import Presentation
    from pptx.util import Inches

    prs = Presentation()
    for title, body, notes in slides:
        slide = prs.slides.add_slide(prs.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
    if table:
        shape = slide.shapes.add_table(len(table), len(table[0]), Inches(1), Inches(4),
                                       Inches(6), Inches(2))
        for r, row in enumerate(table):
            for c, val in enumerate(row):
                shape.table.cell(r, c).text = val
    prs.save(str(path))


def make_xlsx(path, sheets: dict[str, list[list[object]]]) -> None:
    from openpyxl import Workbook

    wb = Workbook()
    wb.remove(wb.active)
    for name, rows in sheets.items():
        ws = wb.create_sheet(name)
        for row in rows:
            ws.append(row)
    wb.save(str(path))


def make_table_pdf(path, before: list[str], rows: list[list[str]], after: list[str],
                   second_page: list[str] | None = None) -> None:
    """A page with text lines, a ruled table (every cell boxed) and more lines; optionally a
    second page of text."""
    def text(x, y, s):
        s = s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        return f"BT /F1 10 Tf {x} {y} Td ({s}) Tj ET"

    ops, y = [], 740
    for line in before:
        ops.append(text(72, y, line))
        y -= 16
    y -= 10
    col, row_h = 150, 20
    top = y
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            x0, y0 = 72 + c * col, top - (r + 1) * row_h
            ops.append(f"{x0} {y0} {col} {row_h} re S")
            ops.append(text(x0 + 4, y0 + 6, cell))
    y = top - len(rows) * row_h - 24
    for line in after:
        ops.append(text(72, y, line))
        y -= 16
    pages = ["\n".join(ops)]
    if second_page:
        pages.append("\n".join(text(72, 740 - 16 * i, ln) for i, ln in enumerate(second_page)))
    write_pdf(path, pages)


def _zip(path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in files.items():
            z.writestr(name, content)
