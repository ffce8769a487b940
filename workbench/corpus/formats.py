"""Containers, markdown splitting and PDF: the pieces the readers share.

Word, PowerPoint, Excel, CSV and EPUB are read by their own structure in `office.py` (through
python-pptx and openpyxl, and the Word and EPUB XML read with lxml); every
container is checked here first (a zip that expands past `MAX_EXPANDED_MB`, or holds more than
`MAX_MEMBERS` entries, is refused unread). PDF goes through pypdf page by page, and pages that
draw rules through pdfplumber, whose tables come out as markdown tables in reading order. A
PDF's sections follow its outline (bookmarks) when it has one, else one section per page;
a line of its text that starts with `#` is text, never a heading.

Each reader returns `Part`s: (heading path, body, provenance). Provenance holds `pages`,
`slides` (first and last) or `sheet`/`rows`. A file that cannot be read raises `DataError`
naming it.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

from workbench.errors import DataError

Part = tuple[list[str], str, dict[str, Any] | None]

MAX_EXPANDED_MB = 512   # a docx/pptx/xlsx/epub whose members expand past this is refused
MAX_MEMBERS = 20_000
TABLE_ROWS = 40         # a spreadsheet table is cut into sections of this many rows + header

_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_MARK = re.compile(r"^<!-- (page|slide) (\d+) -->$")


# --- splitting markdown with unit marks -------------------------------------------------------

def split_marked(text: str, title: str) -> list[Part]:
    """Split markdown on ATX headings (outside code fences), tracking the heading path and the
    `<!-- page N -->` / `<!-- slide N -->` marks each section spans. With marks and no
    heading, each page or slide is a section titled `page N` / `slide N`."""
    lines = text.splitlines()
    has_heading, in_fence = False, False
    for line in lines:
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and _MD_HEADING.match(line):
            has_heading = True
            break
    path: list[tuple[int, str]] = []
    out: list[Part] = []
    buf: list[str] = []
    unit: tuple[str, int] | None = None  # the page or slide being read
    first: int | None = None  # the units the buffered body starts and ends in
    last: int | None = None
    in_fence = False

    def flush():
        nonlocal first, last
        body = "\n".join(buf).strip()
        if body:
            heading = [h for _, h in path] or [title]
            meta = None
            if unit is not None:
                start = unit[1] if first is None else first
                meta = {unit[0] + "s": [start, unit[1] if last is None else last]}
                if not has_heading:
                    heading = [title, f"{unit[0]} {start}"]
            out.append((heading, body, meta))
        buf.clear()
        first = last = None

    for line in lines:
        mark = None if in_fence else _MARK.match(line.strip())
        if mark:
            if not has_heading:
                flush()
            unit = (mark.group(1), int(mark.group(2)))
            continue
        if _FENCE.match(line):
            in_fence = not in_fence
        m = None if in_fence else _MD_HEADING.match(line)
        if m:
            flush()
            level, head = len(m.group(1)), m.group(2).strip()
            path = [(lv, h) for lv, h in path if lv < level] + [(level, head)]
        else:
            if line.strip() and unit is not None:
                first = unit[1] if first is None else first
                last = unit[1]
            buf.append(line)
    flush()
    return out


# --- containers -------------------------------------------------------------------------------

def check_zip(path: Path, fmt: str) -> None:
    """Refuse a file that is not a zip, whose declared sizes pass the bounds, or whose members
    really expand past what they declare (a lying header) or use a method other than stored
    or deflate. Every member is expanded once, a chunk at a time, so memory stays bounded;
    the converter then reads sizes that are known to be true. What the readers would build
    is bounded too: the XML members together may hold at most `MAX_XML_TAGS` tags (a parsed
    element costs ~150 bytes, so a small file of `<w:p/>` could ask for gigabytes), and a
    spreadsheet's sheets at most `MAX_CELLS` cells, none spanning more than `MAX_CELLS`
    cells (a tiny file can name a far corner, a far row, or cells without a reference)."""
    def bad(msg: str, code: str = "unreadable") -> DataError:
        return DataError(msg, path=str(path), code=code)

    limit = MAX_EXPANDED_MB * 2**20
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if len(infos) > MAX_MEMBERS:
                raise bad(f"{fmt} archive has {len(infos)} members (limit {MAX_MEMBERS})",
                          "too_large")
            declared = sum(i.file_size for i in infos)
            if declared > limit:
                raise bad(f"{fmt} archive expands to {declared / 2**20:.0f} MB (limit "
                          f"{MAX_EXPANDED_MB} MB)", "too_large")
            tags = cells = 0
            for info in infos:
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise bad(f"{fmt} member {info.filename!r} uses compression method "
                              f"{info.compress_type} (only stored and deflate are read)")
                sheet = fmt == "xlsx" and info.filename.startswith("xl/worksheets/")
                t, c = _scan_member(z, info, fmt, sheet, bad, MAX_XML_TAGS - tags,
                                    MAX_CELLS - cells)
                tags, cells = tags + t, cells + c
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  bad CRC, names, offsets: all mean unreadable
        raise bad(f"not a readable {fmt} file ({type(e).__name__}: {str(e)[:160]})") \
            from None


MAX_CELLS = 2_000_000
MAX_XML_TAGS = 3_000_000  # ~500 MB of parsed elements at worst; a 1,000-page docx has ~1M
_XML_MEMBER = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx", ".vml")
# a cell or row reference, whatever attributes come first (`<c s="1" r="XFD1">` too)
_CELL_REF = re.compile(rb'<c\b[^>]{0,200}?\br="([A-Z]{1,3})([0-9]{1,9})"')
_ROW_REF = re.compile(rb'<row\b[^>]{0,200}?\br="([0-9]{1,9})"')
_CELL_TAG = re.compile(rb"<c[\s/>]")


def _scan_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, fmt: str, sheet: bool, bad,
                 tags_left: int, cells_left: int) -> tuple[int, int]:
    """(XML tags outside sheets, cells) of one member, expanded a chunk at a time; raises
    the moment it expands past what it declares, holds more tags or cells than are left of
    the archive's bounds, or (a sheet) spans more than `MAX_CELLS`."""
    got = tags = cells = cols = rows = 0
    xml = info.filename.lower().endswith(_XML_MEMBER) and not sheet
    tail = b""
    with z.open(info) as fh:
        while chunk := fh.read(1 << 16):
            got += len(chunk)
            if got > info.file_size:
                raise bad(f"{fmt} member {info.filename!r} expands past the "
                          f"{info.file_size} bytes it declares", "too_large")
            if xml and (tags := tags + chunk.count(b"<")) > tags_left:
                raise bad(f"{fmt} archive holds over {MAX_XML_TAGS:,} XML tags (at "
                          f"{info.filename!r})", "too_large")
            if sheet:  # the span the sheet's references name, and its cells
                buf = tail + chunk
                cells += sum(1 for m in _CELL_TAG.finditer(buf) if m.end() > len(tail))
                if cells > cells_left:
                    raise bad(f"{fmt} sheets hold over {MAX_CELLS:,} cells (at "
                              f"{info.filename!r})", "too_large")
                c, r = _sheet_span(buf)
                cols, rows, tail = max(cols, c), max(rows, r), chunk[-256:]
    if max(cols, 1) * rows > MAX_CELLS:
        raise bad(f"sheet {info.filename!r} spans {rows:,} rows x {cols:,} "
                  f"columns (limit {MAX_CELLS:,} cells)", "too_large")
    return tags, cells


def _sheet_span(chunk: bytes) -> tuple[int, int]:
    """(last column, last row) named by the cell and row references in a piece of a
    sheet."""
    cols = rows = 0
    for col, row in _CELL_REF.findall(chunk):
        n = 0
        for ch in col:
            n = n * 26 + ch - 64
        cols, rows = max(cols, n), max(rows, int(row))
    for row in _ROW_REF.findall(chunk):
        rows = max(rows, int(row))
    return cols, rows


# --- PDF --------------------------------------------------------------------------------------

def read_pdf(path: Path) -> tuple[str, list[Part]]:
    """(title, parts) of a PDF: text and ruled tables of every page in reading order, one
    section per outline entry (`pdf_sections`), or per page without an outline. pypdf reads
    the text
    (about 20x faster than pdfplumber's layout analysis); only pages that draw rules (four or
    more rectangles or lines: a table's cells) go through pdfplumber for their tables."""
    from pypdf import PdfReader

    texts: dict[int, str] = {}
    try:
        reader = PdfReader(str(path))
        if reader.is_encrypted:
            raise DataError("encrypted PDF", path=str(path), code="unreadable")
        meta_title = str((reader.metadata.title if reader.metadata else None) or "").strip()
        # pdfminer (under pdfplumber) expands streams without a limit: a ruled page goes to
        # it only when its content and forms expand within PDF_PAGE_MB (else pypdf reads it)
        ruled = [i for i, page in enumerate(reader.pages)
                 if _draws_rules(page) and _expands_within(page, PDF_PAGE_MB * 2**20)]
        if ruled:
            import pdfplumber

            with pdfplumber.open(str(path)) as pdf:
                for i in ruled:
                    page = pdf.pages[i]
                    texts[i] = _page_markdown(page)
                    page.close()  # frees the page's parsed objects
        pages = [texts[i] if i in texts else (page.extract_text() or "")
                 for i, page in enumerate(reader.pages)]
        outline = pdf_outline(reader)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  pypdf and pdfminer raise many types; all unreadable
        raise DataError(f"unreadable PDF ({type(e).__name__}: {str(e)[:200]})",
                        path=str(path), code="unreadable") from None
    title = meta_title or path.stem
    return title, pdf_sections(pages, outline, title)


MAX_OUTLINE = 5_000


def pdf_outline(reader) -> list[tuple[int, str, int]]:
    """The PDF's outline (bookmarks) as (level, title, page index), in the outline's order;
    entries without a page, and levels past 6, folded; at most `MAX_OUTLINE` entries."""
    out: list[tuple[int, str, int]] = []

    def walk(items, level: int) -> None:
        for item in items:
            if len(out) >= MAX_OUTLINE:
                return
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            try:
                page = reader.get_destination_page_number(item)
            except Exception:  # noqa: BLE001  a broken destination: the entry is left out
                page = None
            title = " ".join(str(getattr(item, "title", "") or "").split())
            if title and page is not None and page >= 0:
                out.append((min(level, 6), title, page))

    try:
        walk(reader.outline, 1)
    except RecursionError:
        pass
    return out


def _norm_line(s: str) -> str:
    return " ".join(s.split()).casefold()


def pdf_sections(pages: list[str], outline: list[tuple[int, str, int]], title: str
                 ) -> list[Part]:
    """Sections of a PDF's page texts: one per outline entry, starting at the line of its page
    that begins with the entry's title (that line is the heading), else at the page's top;
    without an outline, one per page. Each knows the pages it spans."""
    lines = [(p, ln) for p, text in enumerate(pages) for ln in text.splitlines()]
    if not outline:
        out: list[Part] = []
        for p, text in enumerate(pages):
            if text.strip():
                out.append(([title, f"page {p + 1}"], text.strip(), {"pages": [p + 1, p + 1]}))
        return out
    first_line: dict[int, int] = {}
    for i, (p, _) in enumerate(lines):
        first_line.setdefault(p, i)
    cuts: list[tuple[int, int, str, bool]] = []  # (line index, level, title, line is heading)
    cursor = 0
    for level, head, page in outline:
        start = max(cursor, next((first_line[q] for q in range(page, len(pages))
                                  if q in first_line), len(lines)))
        want = _norm_line(head)[:60]
        at, is_head = start, False
        for j in range(start, len(lines)):
            if lines[j][0] != page:
                break
            if want and _norm_line(lines[j][1]).startswith(want):
                at, is_head = j, True
                break
        cuts.append((at, level, head, is_head))
        cursor = at + 1 if is_head else at
    out = []
    path: list[tuple[int, str]] = []

    def emit(lo: int, hi: int, skip: int | None) -> None:
        body = [lines[j] for j in range(lo, hi) if j != skip]
        text = "\n".join(ln for _, ln in body).strip()
        if text:
            used = [p for p, ln in body if ln.strip()]
            out.append(([h for _, h in path] or [title], text,
                        {"pages": [used[0] + 1, used[-1] + 1]}))

    emit(0, cuts[0][0], None)
    for k, (at, level, head, is_head) in enumerate(cuts):
        path = [(lv, h) for lv, h in path if lv < level] + [(level, head)]
        end = cuts[k + 1][0] if k + 1 < len(cuts) else len(lines)
        emit(at, max(end, at), at if is_head else None)
    return out


PDF_PAGE_MB = 64


def _expands_within(page, limit: int) -> bool:
    """Whether the page's content streams and the form XObjects it uses (three levels
    deep) expand to at most `limit` bytes, each Flate stream expanded with a bounded
    decompressor; a stream under another filter counts its encoded size."""
    import zlib

    from pypdf.generic import IndirectObject

    total, seen = 0, set()

    def size(stream) -> int:
        raw = getattr(stream, "_data", b"") or b""
        filters = stream.get("/Filter")
        names = [str(f) for f in (filters if isinstance(filters, list) else
                                  [filters] if filters is not None else [])]
        if names == ["/FlateDecode"]:
            d = zlib.decompressobj()
            try:
                out = len(d.decompress(raw, limit + 1))
            except zlib.error:
                return len(raw)
            return out
        return len(raw)

    def visit(obj, depth: int) -> None:
        nonlocal total
        if isinstance(obj, IndirectObject):
            if (obj.idnum, obj.generation) in seen:
                return
            seen.add((obj.idnum, obj.generation))
        obj = obj.get_object()
        if hasattr(obj, "_data"):
            total += size(obj)
        if total > limit or depth > 3 or not hasattr(obj, "get"):
            return
        xobjects = (obj.get("/Resources") or {}).get("/XObject") or {}
        for ref in xobjects.values():
            visit(ref, depth + 1)

    contents = page.get("/Contents")
    for c in (contents if isinstance(contents, list) else [contents] if contents else []):
        visit(c, 0)
    xobjects = (page.get("/Resources") or {}).get("/XObject") or {}
    for ref in xobjects.values():
        if total > limit:
            break
        visit(ref, 1)
    return total <= limit


_RULE_OPS = re.compile(rb"(?<![A-Za-z])(re|l)(?![A-Za-z])")


def _draws_rules(page) -> bool:
    """Whether the page's content stream draws four or more rectangles or line segments."""
    contents = page.get_contents()
    data = contents.get_data() if contents is not None else b""
    return len(_RULE_OPS.findall(data, 0, 4_000_000)) >= 4


def _page_markdown(page) -> str:
    """The page's text lines and tables, top to bottom; tables as markdown tables."""
    tables = [t for t in page.find_tables() if t.bbox]
    boxes = [t.bbox for t in tables]

    def outside(obj) -> bool:
        x = (obj["x0"] + obj["x1"]) / 2
        y = (obj["top"] + obj["bottom"]) / 2
        return not any(b[0] <= x <= b[2] and b[1] <= y <= b[3] for b in boxes)

    text_page = page.filter(lambda o: o.get("object_type") != "char" or outside(o)) \
        if boxes else page
    blocks = [(ln["top"], ln["text"]) for ln in text_page.extract_text_lines()]
    for t in tables:
        md = markdown_table(t.extract())
        if md:
            blocks.append((t.bbox[1], md))
    blocks.sort(key=lambda b: b[0])
    return "\n".join(text for _, text in blocks)


def markdown_table(rows: list[list[Any]], spaced: bool = False) -> str:
    """Rows (the first is the header) as a markdown table; empty rows dropped. `spaced`
    writes the rule as `| --- |` (the office readers' tables), else `|---|`."""
    cells = [[" ".join(str(c or "").split()).replace("|", "\\|") for c in row] for row in rows]
    cells = [r for r in cells if any(r)]
    if not cells:
        return ""
    width = max(len(r) for r in cells)
    cells = [r + [""] * (width - len(r)) for r in cells]
    head, *body = cells
    rule = "| " + " | ".join(["---"] * width) + " |" if spaced else "|" + "---|" * width
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)
