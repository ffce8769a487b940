"""Readers of Word, PowerPoint, Excel, CSV and EPUB files that take headings from the
format's own structure, never from the text:

- Word (docx): a paragraph is a heading when its outline level (set on the paragraph or on
  its style, or on a style it is based on) says so, or its style is a "Heading N" or "Title";
  tables become markdown tables. The XML is read with entities and network access off.
- PowerPoint (pptx, python-pptx): one section per slide, titled by its title placeholder, or
  by a short first line at the top of the slide; tables stay on their slide; notes follow.
- Excel (xlsx, openpyxl) and CSV: every cell as its text, an empty cell empty (no `NaN`), a
  line break inside a cell a space, an empty header cell named by its column letter.
- EPUB: the spine's documents in order, headings from their h1-h6 tags; a document with no
  heading tag is titled by the book's navigation (nav or NCX).

Each reader returns (title, [`Part`]) or raises `DataError` naming the file.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import posixpath
import re
import zipfile
from pathlib import Path
from urllib.parse import unquote, urldefrag

from workbench.corpus.blocks import Block, html_blocks, split_blocks
from workbench.corpus.formats import TABLE_ROWS, Part, check_zip, markdown_table
from workbench.errors import DataError

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def _xml(data: bytes):
    """Parse XML with entity expansion, DTD loading and network access off."""
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                             huge_tree=False, remove_comments=True)
    return etree.fromstring(data, parser)


def read_structured(path: Path, fmt: str, data: bytes) -> tuple[str, list[Part]]:
    """(title, parts) of a docx, pptx, xlsx, csv or epub file."""
    if fmt != "csv":
        check_zip(path, fmt)
    reader = {"docx": _docx, "pptx": _pptx, "xlsx": _xlsx, "csv": _csv, "epub": _epub}[fmt]
    try:
        title, parts = reader(path, data)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  a reader's failure names the file, never stops a run
        raise DataError(f"unreadable {fmt} ({type(e).__name__}: {str(e)[:200]})",
                        path=str(path), code="unreadable") from None
    if fmt in ("xlsx", "csv"):
        parts = [p for part in parts for p in _table_blocks(part, fmt)]
    return title, parts


def _table_blocks(part: Part, fmt: str) -> list[Part]:
    """A long spreadsheet table as sections of `TABLE_ROWS` rows, each with the header, so a
    retrieved block still says what its columns are."""
    heading, body, meta = part
    lines = body.splitlines()
    if len(lines) <= TABLE_ROWS + 2 or not (lines[0].startswith("|") and
                                            set(lines[1].replace("|", "").strip()) <= set("-: ")):
        return [(heading, body, ({**(meta or {}), "sheet": heading[-1]} if fmt == "xlsx"
                                 else meta))]
    head, rows = lines[:2], lines[2:]
    out: list[Part] = []
    for i in range(0, len(rows), TABLE_ROWS):
        block = rows[i:i + TABLE_ROWS]
        span = [i + 1, i + len(block)]
        extra = {"sheet": heading[-1]} if fmt == "xlsx" else {}
        out.append(([*heading, f"rows {span[0]}-{span[1]}"], "\n".join(head + block),
                    {**(meta or {}), **extra, "rows": span}))
    return out


# --- Word -------------------------------------------------------------------------------------

def _docx_levels(styles_xml: bytes | None) -> dict[str, int]:
    """Style id -> heading level (0: body) from outline levels, names and `basedOn`."""
    if not styles_xml:
        return {}
    root = _xml(styles_xml)
    own: dict[str, int | None] = {}
    based: dict[str, str] = {}
    for st in root.iter(W + "style"):
        sid = st.get(W + "styleId") or ""
        name_el = st.find(W + "name")
        name = (name_el.get(W + "val") if name_el is not None else "") or ""
        lvl = st.find(f"{W}pPr/{W}outlineLvl")
        level: int | None = None
        if lvl is not None and (lvl.get(W + "val") or "").isdigit():
            v = int(lvl.get(W + "val"))
            level = v + 1 if v < 9 else 0
        elif m := re.fullmatch(r"heading\s*([1-9])", name.strip(), re.IGNORECASE):
            level = int(m.group(1))
        elif name.strip().lower() == "title":
            level = 1
        own[sid] = level
        base = st.find(W + "basedOn")
        if base is not None:
            based[sid] = base.get(W + "val") or ""
    levels: dict[str, int] = {}
    for sid in own:
        cur, seen = sid, 0
        while cur in own and own[cur] is None and cur in based and seen < 20:
            cur, seen = based[cur], seen + 1
        levels[sid] = min(own.get(cur) or 0, 6)
    return levels


def _docx_text(el) -> str:
    out = []
    for node in el.iter(W + "t", W + "tab", W + "br", W + "cr", W + "noBreakHyphen"):
        tag = node.tag[len(W):]
        out.append(node.text or "" if tag == "t" else "\t" if tag == "tab" else
                   "-" if tag == "noBreakHyphen" else "\n")
    return "".join(out)


def _docx_blocks(body, levels: dict[str, int], depth: int = 0) -> list[Block]:
    blocks: list[Block] = []
    for el in body:
        tag = el.tag[len(W):] if isinstance(el.tag, str) and el.tag.startswith(W) else ""
        if tag == "p":
            text = _docx_text(el).strip()
            if not text:
                continue
            ppr = el.find(W + "pPr")
            level = 0
            if ppr is not None:
                style = ppr.find(W + "pStyle")
                if style is not None:
                    level = levels.get(style.get(W + "val") or "", 0)
                lvl = ppr.find(W + "outlineLvl")
                if lvl is not None and (lvl.get(W + "val") or "").isdigit():
                    v = int(lvl.get(W + "val"))
                    level = min(v + 1, 6) if v < 9 else 0
            if level and len(text) <= 300:
                blocks.append((level, " ".join(text.split())))
            else:
                listed = ppr is not None and ppr.find(W + "numPr") is not None
                blocks += [(0, ("- " if listed else "") + text), (0, "")]
        elif tag == "tbl":
            rows = []
            for tr in el.iter(W + "tr"):
                if tr.getparent() is not el:
                    continue  # a nested table's rows: read as its cell's text
                row = []
                for tc in tr.findall(W + "tc"):
                    row.append(" ".join(_docx_text(p).strip() for p in tc.iter(W + "p")))
                    span = tc.find(f"{W}tcPr/{W}gridSpan")
                    if span is not None and (span.get(W + "val") or "").isdigit():
                        row += [""] * (min(int(span.get(W + "val")), 64) - 1)
                rows.append(row)
            md = markdown_table(rows, spaced=True)
            if md:
                blocks += [(0, md), (0, "")]
        elif tag in ("sdt", "sdtContent", "customXml", "ins") and depth < 20:
            blocks += _docx_blocks(el, levels, depth + 1)
    return blocks


def _core_title(z: zipfile.ZipFile) -> str:
    try:
        root = _xml(z.read("docProps/core.xml"))
    except KeyError:
        return ""
    el = root.find("{http://purl.org/dc/elements/1.1/}title")
    return " ".join((el.text or "").split()) if el is not None else ""


def _docx(path: Path, data: bytes) -> tuple[str, list[Part]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = set(z.namelist())
        main = "word/document.xml"
        if main not in names:
            raise DataError("not a Word document (no word/document.xml)", path=str(path),
                            code="unreadable")
        levels = _docx_levels(z.read("word/styles.xml") if "word/styles.xml" in names
                              else None)
        root = _xml(z.read(main))
        title = _core_title(z) or path.stem
    body = root.find(W + "body")
    if body is None:
        raise DataError("not a Word document (no body)", path=str(path), code="unreadable")
    return title, split_blocks(_docx_blocks(body, levels), title)


# --- PowerPoint -------------------------------------------------------------------------------

def _shape_lines(shape, depth: int = 0) -> list[str]:
    """A shape's text, tables as markdown tables, pictures by their alt text."""
    if depth > 20:
        return []
    if shape.shape_type is not None and int(shape.shape_type) == 6:  # a group
        return [ln for s in _reading_order(shape.shapes) for ln in _shape_lines(s, depth + 1)]
    if getattr(shape, "has_table", False) and shape.has_table:
        rows = [[cell.text for cell in row.cells] for row in shape.table.rows]
        md = markdown_table(rows, spaced=True)
        return [md, ""] if md else []
    if getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        return [p for p in (" ".join(par.text.split()) for par in shape.text_frame.paragraphs)
                if p]
    alt = shape._element.xpath(".//p:cNvPr/@descr") if hasattr(shape, "_element") else []
    return [" ".join(str(alt[0]).split())] if alt and str(alt[0]).strip() else []


def _reading_order(shapes) -> list:
    return sorted(shapes, key=lambda s: (s.top or 0, s.left or 0))


def _slide_title(slide, height: int):
    """(title, its shape): the title placeholder's text, else a short single line at the top
    of the slide (a text box used as a title), else ("", None)."""
    title = slide.shapes.title
    if title is not None and title.has_text_frame and title.text_frame.text.strip():
        return " ".join(title.text_frame.text.split()), title
    for shape in _reading_order(slide.shapes):
        if not (getattr(shape, "has_text_frame", False) and shape.has_text_frame):
            continue
        text = shape.text_frame.text.strip()
        if not text:
            continue
        if "\n" not in text and "\v" not in text and len(text) <= 120 and \
                (shape.top or 0) < height * 0.25:
            return " ".join(text.split()), shape
        break
    return "", None


def _pptx(path: Path, data: bytes) -> tuple[str, list[Part]]:
    from pptx import Presentation

    prs = Presentation(io.BytesIO(data))
    title = " ".join((prs.core_properties.title or "").split()) or path.stem
    height = prs.slide_height or 6858000
    parts: list[Part] = []
    for n, slide in enumerate(prs.slides, start=1):
        head, head_shape = _slide_title(slide, height)
        skip = head_shape.shape_id if head_shape is not None else None
        lines = [ln for s in _reading_order(slide.shapes) if s.shape_id != skip
                 for ln in _shape_lines(s)]
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                lines += ["", "Notes:", notes.text.strip()]
        body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        if body or head:
            parts.append(([head] if head else [title, f"slide {n}"], body or head,
                          {"slides": [n, n]}))
    return title, parts


# --- spreadsheets -----------------------------------------------------------------------------

def cell_text(v) -> str:
    """A cell as the text a reader sees: empty stays empty, text stays text, a whole number
    without `.0`, a number to the 15 digits Excel shows, a date without a midnight time, a
    line break a space."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.15g}"
    if isinstance(v, dt.datetime):
        return v.date().isoformat() if v.time() == dt.time() else v.isoformat(sep=" ")
    if isinstance(v, (dt.date, dt.time)):
        return v.isoformat()
    return " ".join(str(v).split())


def _letter(i: int) -> str:
    s = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        s = chr(65 + r) + s
    return s


def sheet_table(rows) -> str:
    """Rows of cell values as a markdown table: empty rows dropped, trailing empty columns
    cut, the first row the header (an empty header cell named by its column letter)."""
    cells = [r for r in ([cell_text(v) for v in row] for row in rows) if any(r)]
    if not cells:
        return ""
    width = max(max((i + 1 for i, c in enumerate(r) if c), default=0) for r in cells)
    cells = [(r + [""] * width)[:width] for r in cells]
    cells[0] = [c or _letter(i) for i, c in enumerate(cells[0])]
    return markdown_table(cells, spaced=True)


def _xlsx(path: Path, data: bytes) -> tuple[str, list[Part]]:
    from openpyxl import load_workbook

    wb = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        title = " ".join((wb.properties.title or "").split()) or path.stem
        for ws in wb.worksheets:  # a sheet's <dimension> may name any corner: rows are read
            ws.reset_dimensions()  # as wide as their cells, never padded to what it claims
        parts: list[Part] = [([path.stem, ws.title], md, None) for ws in wb.worksheets
                 if (md := sheet_table(ws.iter_rows(values_only=True)))]
    finally:
        wb.close()
    return title, parts


def _csv(path: Path, data: bytes) -> tuple[str, list[Part]]:
    text = data.decode("utf-8-sig")
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    md = sheet_table(csv.reader(io.StringIO(text), dialect))
    return path.stem, [([path.stem], md, None)] if md else []


# --- EPUB -------------------------------------------------------------------------------------

_OPF = "{http://www.idpf.org/2007/opf}"
_DC = "{http://purl.org/dc/elements/1.1/}"
_NCX = "{http://www.daisy.org/z3986/2005/ncx/}"
_XHTML = "{http://www.w3.org/1999/xhtml}"
_OPS = "{http://www.idpf.org/2007/ops}"


def _nav_titles(z: zipfile.ZipFile, base: str, manifest: dict, nav_id: str | None,
                ncx_id: str | None) -> dict[str, tuple[int, str]]:
    """File (in the zip) -> (depth, title) of its first entry in the book's navigation."""
    out: dict[str, tuple[int, str]] = {}

    def add(href: str, text: str, depth: int, rel_to: str):
        file = posixpath.normpath(posixpath.join(posixpath.dirname(rel_to),
                                                 unquote(urldefrag(href)[0])))
        text = " ".join(text.split())
        if text and file not in out:
            out[file] = (min(depth, 6), text)

    if nav_id and nav_id in manifest:
        href = manifest[nav_id][0]
        root = _xml(z.read(href))
        for nav in root.iter(_XHTML + "nav"):
            if (nav.get(_OPS + "type") or "toc") != "toc":
                continue
            for a in nav.iter(_XHTML + "a"):
                depth = sum(1 for p in a.iterancestors() if p.tag == _XHTML + "ol")
                add(a.get("href") or "", "".join(a.itertext()), depth, href)
    elif ncx_id and ncx_id in manifest:
        href = manifest[ncx_id][0]
        root = _xml(z.read(href))
        for point in root.iter(_NCX + "navPoint"):
            depth = sum(1 for p in point.iterancestors() if p.tag == _NCX + "navPoint") + 1
            label = point.find(f"{_NCX}navLabel/{_NCX}text")
            content = point.find(_NCX + "content")
            if label is not None and content is not None:
                add(content.get("src") or "", label.text or "", depth, href)
    return out


def _epub(path: Path, data: bytes) -> tuple[str, list[Part]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        container = _xml(z.read("META-INF/container.xml"))
        rootfile = next((el.get("full-path") for el in container.iter()
                         if el.tag.endswith("rootfile") and el.get("full-path")), None)
        if not rootfile:
            raise DataError("not an EPUB (no rootfile in META-INF/container.xml)",
                            path=str(path), code="unreadable")
        opf = _xml(z.read(rootfile))
        base = posixpath.dirname(rootfile)
        el = opf.find(f"{_OPF}metadata/{_DC}title")
        title = " ".join((el.text or "").split()) if el is not None else ""
        manifest = {}
        nav_id = None
        for item in opf.iter(_OPF + "item"):
            href = posixpath.normpath(posixpath.join(base, unquote(item.get("href") or "")))
            manifest[item.get("id")] = (href, item.get("media-type") or "")
            if "nav" in (item.get("properties") or "").split():
                nav_id = item.get("id")
        spine = opf.find(_OPF + "spine")
        ncx_id = spine.get("toc") if spine is not None else None
        nav = _nav_titles(z, base, manifest, nav_id, ncx_id)
        blocks: list[Block] = []
        read: set[str] = set()  # a spine may name one document 20,000 times: read it once
        for ref in (spine if spine is not None else []):
            item = manifest.get(ref.get("idref"))
            if item is None or "html" not in item[1] or ref.get("linear") == "no" or \
                    ref.get("idref") == nav_id or item[0] in read:  # nav: the contents
                continue
            read.add(item[0])
            doc = html_blocks(z.read(item[0]).decode("utf-8", "replace"))
            if item[0] in nav and not any(level for level, _ in doc):
                doc = [nav[item[0]], *doc]  # a chapter without a heading tag: its nav title
            blocks += doc
    title = title or path.stem
    return title, split_blocks(blocks, title)
