"""Readers for the formats a domain's documents arrive in besides markdown, text and HTML:
Word (docx), PowerPoint (pptx), Excel (xlsx), CSV, EPUB and PDF.

Office formats and EPUB go through MarkItDown (Microsoft's converter: MIT, about 30 MB with its
docx/pptx/xlsx/pdf extras, no model downloads; docling needs layout models from a hub and
unstructured pulls hundreds of MB). Its converters are called directly by format, so no file
type is guessed. PDF goes through pdfplumber (MarkItDown's own PDF dependency) page by page,
because MarkItDown's PDF output drops page boundaries: each page's ruled tables come out as
markdown tables in reading order, and every section knows its pages. pypdf reads the text of
pages that draw no rules (pdfplumber's layout analysis is ~20x slower).

Each reader returns `Part`s: (heading path, body, provenance). Provenance holds `pages`,
`slides` (first and last) or `sheet`/`rows`. A file that cannot be read raises `DataError`
naming it; every container is checked before it is opened (a zip that expands past
`MAX_EXPANDED_MB`, or holds more than `MAX_MEMBERS` entries, is refused unread).
"""

from __future__ import annotations

import io
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
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
# a header row of empty cells, its rule, and the first real row (Word tables have no header)
_EMPTY_HEADER = re.compile(r"^\|(?:[ \t]*\|)+[ \t]*\n(\|(?:[ \t]*:?-+:?[ \t]*\|)+)[ \t]*\n(\|.*)$",
                           re.M)


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
    the converter then reads sizes that are known to be true. A spreadsheet whose sheets
    span more than `MAX_CELLS` cells (a tiny file can name a far corner) is refused too."""
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
            for info in infos:
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise bad(f"{fmt} member {info.filename!r} uses compression method "
                              f"{info.compress_type} (only stored and deflate are read)")
                got, sheet = 0, fmt == "xlsx" and info.filename.startswith("xl/worksheets/")
                cols = rows = 0
                tail = b""
                with z.open(info) as fh:
                    while chunk := fh.read(1 << 16):
                        got += len(chunk)
                        if got > info.file_size:
                            raise bad(f"{fmt} member {info.filename!r} expands past the "
                                      f"{info.file_size} bytes it declares", "too_large")
                        if sheet:  # the span the sheet's cell references name
                            c, r = _sheet_span(tail + chunk)
                            cols, rows, tail = max(cols, c), max(rows, r), chunk[-24:]
                if cols * rows > MAX_CELLS:
                    raise bad(f"sheet {info.filename!r} spans {rows:,} rows x {cols:,} "
                              f"columns (limit {MAX_CELLS:,} cells)", "too_large")
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  bad CRC, names, offsets: all mean unreadable
        raise bad(f"not a readable {fmt} file ({type(e).__name__}: {str(e)[:160]})") \
            from None


MAX_CELLS = 2_000_000
_CELL_REF = re.compile(rb'<c r="([A-Z]{1,3})([0-9]{1,7})"')


def _sheet_span(chunk: bytes) -> tuple[int, int]:
    """(last column, last row) named by the cell references in a piece of a sheet."""
    cols = rows = 0
    for col, row in _CELL_REF.findall(chunk):
        n = 0
        for ch in col:
            n = n * 26 + ch - 64
        cols, rows = max(cols, n), max(rows, int(row))
    return cols, rows


def _converter(fmt: str):
    from markitdown import StreamInfo  # noqa: F401  (checked import: the extra is installed)
    from markitdown.converters import (CsvConverter, DocxConverter, EpubConverter,
                                       PptxConverter, XlsxConverter)

    return {"docx": DocxConverter, "pptx": PptxConverter, "xlsx": XlsxConverter,
            "csv": CsvConverter, "epub": EpubConverter}[fmt]()


def _markitdown(path: Path, fmt: str, data: bytes) -> tuple[str, str | None]:
    """(markdown, title) through MarkItDown's converter for `fmt`."""
    from markitdown import StreamInfo

    info = StreamInfo(extension="." + fmt, filename=path.name,
                      charset="utf-8" if fmt == "csv" else None)
    try:
        res = _converter(fmt).convert(io.BytesIO(data), info)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  a converter's failure names the file, never stops a run
        raise DataError(f"unreadable {fmt} ({type(e).__name__}: {str(e)[:200]})",
                        path=str(path), code="unreadable") from None
    return res.markdown or "", res.title


def read_office(path: Path, fmt: str, data: bytes) -> tuple[str, list[Part]]:
    """(title, parts) of a docx, pptx, xlsx, csv or epub file."""
    if fmt != "csv":
        check_zip(path, fmt)
    md, title = _markitdown(path, fmt, data)
    title = (title or "").strip() or path.stem
    md = _IMAGE.sub(lambda m: m.group(1), md)  # pictures keep their alt text only
    md = _EMPTY_HEADER.sub(r"\2\n\1", md)  # a headerless table: its first row heads it
    if fmt == "pptx":  # slide marks; speaker notes stay in their slide's section
        md = re.sub(r"<!-- Slide number: (\d+) -->", r"<!-- slide \1 -->", md)
        md = md.replace("### Notes:", "Notes:")
    if fmt == "epub":  # MarkItDown puts the book's metadata first as **Key:** lines
        md = re.sub(r"\A(\*\*[A-Z][a-z]+:\*\* .*\n?)+", "", md)
    if fmt in ("csv", "xlsx"):  # the file's name heads its sheets' (or its one) table
        md = f"# {path.stem}\n\n{md}"
    parts = split_marked(md, title)
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


# --- PDF --------------------------------------------------------------------------------------

def read_pdf(path: Path) -> tuple[str, list[Part]]:
    """(title, parts) of a PDF: text and ruled tables of every page in reading order, one
    section per page (or per heading, for PDFs written from markdown). pypdf reads the text
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
        pages = [f"<!-- page {i + 1} -->\n" + (texts[i] if i in texts else
                                               (page.extract_text() or ""))
                 for i, page in enumerate(reader.pages)]
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  pypdf and pdfminer raise many types; all unreadable
        raise DataError(f"unreadable PDF ({type(e).__name__}: {str(e)[:200]})",
                        path=str(path), code="unreadable") from None
    return meta_title or path.stem, split_marked("\n".join(pages), meta_title or path.stem)


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


def markdown_table(rows: list[list[Any]]) -> str:
    """Rows (the first is the header) as a markdown table; empty rows dropped."""
    cells = [[" ".join(str(c or "").split()).replace("|", "\\|") for c in row] for row in rows]
    cells = [r for r in cells if any(r)]
    if not cells:
        return ""
    width = max(len(r) for r in cells)
    cells = [r + [""] * (width - len(r)) for r in cells]
    head, *body = cells
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)
