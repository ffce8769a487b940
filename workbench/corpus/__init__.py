"""Corpus files (markdown, plain text, HTML, PDF, Word, PowerPoint, Excel, CSV, EPUB) into
`Document` and `Section` records.

Sections keep their heading path (chapter > section > subsection) and, where the format has
them, the pages, slides, sheet or rows they came from (`Section.metadata`; the readers of the
binary formats are in `formats.py`). Ids are deterministic:
the same corpus gives the same ids. Unreadable, empty, binary or unsupported files are
reported by name and skipped, or refused with `on_error="fail"`; one bad file never stops
a run half-way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from workbench.corpus.formats import Part, read_office, read_pdf, split_marked
from workbench.errors import DataError
from workbench.io import sha256_text
from workbench.records import Document, Section

SUPPORTED = {".md": "md", ".markdown": "md", ".txt": "txt", ".text": "txt", ".html": "html",
             ".htm": "html", ".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx",
             ".csv": "csv", ".epub": "epub"}
OFFICE = {"docx", "pptx", "xlsx", "csv", "epub"}  # read through MarkItDown (formats.py)


@dataclass
class IngestReport:
    documents: list[Document] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)

    def summary(self) -> str:
        s = f"{len(self.documents)} documents, {len(self.sections)} sections"
        if self.skipped:
            s += f", {len(self.skipped)} skipped: " + "; ".join(f"{f} ({r})"
                                                               for f, r in self.skipped)
        return s


# --- format readers: text -> [(heading_path, body)] -----------------------------------------

def split_markdown(text: str, title: str) -> list[tuple[list[str], str]]:
    """Split on ATX headings (outside code fences), tracking the heading path."""
    return [(h, b) for h, b, _ in split_marked(text, title)]


class _HTMLSections(HTMLParser):
    BLOCK = {"p", "div", "li", "br", "tr", "section", "article", "pre", "blockquote", "td",
             "dd", "dt", "table", "ul", "ol"}
    SKIP = {"script", "style", "noscript", "head", "template"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.cur: list[str] = []
        self.skip = 0
        self.heading: int | None = None

    def _end_line(self):
        text = " ".join("".join(self.cur).split())
        if text:
            self.lines.append(text)
        self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._end_line()
            self.heading = int(tag[1])
        elif tag in self.BLOCK:
            self._end_line()

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.heading is not None:
            text = " ".join("".join(self.cur).split())
            self.cur = []
            if text:
                self.lines.append("#" * self.heading + " " + text)
            self.heading = None
        elif tag in self.BLOCK:
            self._end_line()
            if tag == "p":
                self.lines.append("")

    def handle_data(self, data):
        if not self.skip:
            self.cur.append(data)


def html_to_markdown(html: str) -> str:
    parser = _HTMLSections()
    parser.feed(html)
    parser.close()
    parser._end_line()
    return "\n".join(parser.lines)


def _looks_binary(data: bytes) -> bool:
    return b"\x00" in data[:8192]


def read_file(path: Path) -> tuple[str, str, list[Part]]:
    """(format, title, [(heading_path, body, provenance)]). Raises DataError naming the
    file."""
    fmt = SUPPORTED.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"unsupported file type {path.suffix or '(none)'} (supported: "
                        f"{', '.join(sorted(set(SUPPORTED)))})", path=str(path),
                        code="unsupported")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"unreadable ({e.strerror})", path=str(path), code="unreadable") from None
    if not data.strip():
        raise DataError("empty file", path=str(path), code="empty")
    if fmt == "pdf":
        if not data.startswith(b"%PDF"):
            raise DataError("not a PDF (no %PDF header)", path=str(path), code="unreadable")
        title, parts = read_pdf(path)
        return fmt, title, parts
    if fmt in OFFICE and fmt != "csv":
        title, parts = read_office(path, fmt, data)
        return fmt, title, parts
    if _looks_binary(data):
        raise DataError("binary content in a text file", path=str(path), code="binary")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte {e.start})", path=str(path), code="bad_encoding") \
            from None
    if fmt == "csv":
        title, parts = read_office(path, fmt, text.encode())
        return fmt, title, parts
    if fmt == "html":
        text = html_to_markdown(text)
    if fmt in ("md", "html"):
        parts = split_marked(text, path.stem)
    else:  # plain text: paragraphs of the file form one section titled by the file name
        parts = [([path.stem], text.strip(), None)]
    title = parts[0][0][0] if parts else path.stem
    return fmt, title, parts


def ingest(paths: list[Path] | Path, *, root: Path | None = None, on_error: str = "skip",
           min_chars: int = 1) -> IngestReport:
    """Read files (or every supported file under folders) into documents and sections."""
    if on_error not in ("skip", "fail"):
        raise ValueError("on_error must be 'skip' or 'fail'")
    items = [paths] if isinstance(paths, Path) else list(paths)
    files: list[Path] = []
    links: list[Path] = []
    for p in items:
        p = Path(p)
        if p.is_dir():
            root = root or p
            found = sorted(f for f in p.rglob("*") if not f.name.startswith(".")
                           and f.name.lower() != "readme.md")
            # only regular files inside the folder are opened: a link may point anywhere
            links += [f for f in found if f.is_symlink()]
            files += [f for f in found if f.is_file() and not f.is_symlink()]
        elif p.exists():
            files.append(p)
        else:
            raise DataError("not found", path=str(p), code="not_found")
    report = IngestReport()
    for f in links:
        rel = str(f.relative_to(root)) if root and f.is_relative_to(root) else str(f)
        if on_error == "fail":
            raise DataError("a link, not a regular file: not read", path=str(f), code="link")
        report.skipped.append((rel, "a link, not a regular file: not read"))
    for f in files:
        rel = str(f.relative_to(root)) if root and f.is_relative_to(root) else str(f)
        try:
            fmt, title, parts = read_file(f)
            parts = [p for p in parts if len(p[1]) >= min_chars]
            if not parts:
                raise DataError("no text found", path=str(f), code="empty")
        except DataError as e:
            if on_error == "fail":
                raise
            report.skipped.append((rel, str(e).split(": ", 1)[-1]))
            continue
        doc_id = "doc-" + sha256_text(rel)[:12]
        full = "\n\n".join(b for _, b, _ in parts)
        for order, (heading, body, where) in enumerate(parts):
            report.sections.append(Section(
                id=Section.make_id(doc_id, heading, order), doc_id=doc_id, source=rel,
                heading_path=heading, text=body, content_hash=sha256_text(body)[:16],
                order=order, metadata=where or None))
        report.documents.append(Document(id=doc_id, source=rel, title=title, format=fmt,
                                         content_hash=sha256_text(full)[:16],
                                         n_sections=len(parts)))
    return report


def load_sections(corpus: str | Path, on_error: str = "skip"
                  ) -> tuple[list[Section], IngestReport | None]:
    """Sections from a corpus folder/file, or from a `Section` JSONL file."""
    from workbench.errors import WorkbenchError
    from workbench.records import read_records

    corpus = Path(corpus)
    if corpus.suffix == ".jsonl":
        return read_records(corpus, Section), None
    report = ingest(corpus, on_error=on_error)
    if not report.sections:
        raise WorkbenchError(f"{corpus}: no readable sections ({report.summary()})")
    return report.sections, report


def corpus_hash(corpus: str | Path) -> str:
    """A hash of every file under a corpus folder (names and bytes), or of one file."""
    import hashlib
    import json

    from workbench.io import sha256_file

    p = Path(corpus)
    files = sorted(p.rglob("*")) if p.is_dir() else [p]
    listing = [(str(f.relative_to(p) if p.is_dir() else f.name), sha256_file(f))
               for f in files if f.is_file()]
    return hashlib.sha256(json.dumps([listing], sort_keys=True).encode()).hexdigest()[:16]
