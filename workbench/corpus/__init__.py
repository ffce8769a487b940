"""Corpus files (markdown, plain text, HTML, PDF, Word, PowerPoint, Excel, CSV, EPUB) into
`Document` and `Section` records.

Sections keep their heading path (chapter > section > subsection) and, where the format has
them, the pages, slides, sheet or rows they came from (`Section.metadata`; the readers of the
binary formats are in `office.py` and `formats.py`). Headings come from each format's own
structure (`blocks.py`): a line that starts with `#` is a heading only in a markdown file.
Ids are deterministic: the same corpus gives the same ids. Unreadable, empty, binary or
unsupported files are reported by name and skipped, or refused with `on_error="fail"`; one
bad file never stops a run half-way. Nothing in a folder is passed over without a line in
the report: hidden files and folders, links, and the folder's own top-level README.md (which
describes the corpus; a README.md deeper down is read like any document) are listed too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from workbench.corpus.blocks import blocks_to_markdown, html_blocks, split_blocks
from workbench.corpus.formats import Part, read_pdf, split_marked
from workbench.corpus.office import read_structured
from workbench.errors import DataError, WorkbenchError
from workbench.io import sha256_file, sha256_text
from workbench.progress import progress
from workbench.records import Document, Section, read_records

SUPPORTED = {".md": "md", ".markdown": "md", ".txt": "txt", ".text": "txt", ".html": "html",
             ".htm": "html", ".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx",
             ".csv": "csv", ".epub": "epub"}
OFFICE = {"docx", "pptx", "xlsx", "csv", "epub"}  # read by their structure (office.py)


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


def html_to_markdown(html: str) -> str:
    """HTML as markdown: its h1-h6 tags as `#` headings; a body line that starts with `#` (a
    code comment, a shell prompt) escaped, so it never reads as a heading."""
    return blocks_to_markdown(html_blocks(html))


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
    if not path.is_file():  # a FIFO, a device or a socket named directly: never opened
        raise DataError("not a regular file: not read", path=str(path), code="unreadable")
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
        title, parts = read_structured(path, fmt, data)
        return fmt, title, parts
    if _looks_binary(data):
        raise DataError("binary content in a text file", path=str(path), code="binary")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte {e.start})", path=str(path), code="bad_encoding") \
            from None
    if fmt == "csv":
        title, parts = read_structured(path, fmt, text.encode())
        return fmt, title, parts
    if fmt == "html":  # headings from the heading tags only
        parts = split_blocks(html_blocks(text), path.stem)
    elif fmt == "md":
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
    notes: list[tuple[Path, str]] = []  # files and folders of a folder not read, and why
    for p in items:
        p = Path(p)
        if p.is_dir():
            root = root or p
            found, hidden, unlisted = _walk(p)
            notes += unlisted
            notes += [(h, "hidden (name starts with '.'): not read") for h in hidden]
            own = [f for f in found if f.parent == p and f.name.lower() == "readme.md"]
            notes += [(f, "the folder's own description, not read; name the file to read it")
                      for f in own]  # a README.md deeper down is a document
            found = [f for f in found if f not in own]
            # only regular files inside the folder are opened: a link may point anywhere
            links += [f for f in found if f.is_symlink()]
            files += [f for f in found if f.is_file() and not f.is_symlink()]
            notes += [(f, "not a regular file: not read") for f in found
                      if not f.is_symlink() and not f.is_file()]
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
    for f, why in notes:  # said, never an error: a folder holds such things
        rel = str(f.relative_to(root)) if root and f.is_relative_to(root) else str(f)
        report.skipped.append((rel + ("/" if f.is_dir() and not f.is_symlink() else ""), why))

    for f in progress(files, desc="reading documents", unit="file", delay=2):
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


def _walk(folder: Path) -> tuple[list[Path], list[Path], list[tuple[Path, str]]]:
    """(every entry under `folder` that is not a folder, sorted; the hidden files and folders,
    whose insides are not listed; the folders that could not be listed, and why). Links to
    folders are listed, never followed."""
    found: list[Path] = []
    hidden: list[Path] = []
    unlisted: list[tuple[Path, str]] = []

    def failed(e: OSError) -> None:
        unlisted.append((Path(e.filename), f"folder not listed ({e.strerror}): not read"))

    for dirpath, dirnames, filenames in os.walk(folder, onerror=failed):
        here = Path(dirpath)
        for d in list(dirnames):
            if d.startswith("."):
                hidden.append(here / d)
                dirnames.remove(d)
            elif (here / d).is_symlink():
                found.append(here / d)
        for f in filenames:
            (hidden if f.startswith(".") else found).append(here / f)
    return sorted(found), sorted(hidden), unlisted


def load_sections(corpus: str | Path, on_error: str = "skip"
                  ) -> tuple[list[Section], IngestReport | None]:
    """Sections from a corpus folder/file, or from a `Section` JSONL file."""
    corpus = Path(corpus)
    if corpus.suffix == ".jsonl":
        return read_records(corpus, Section), None
    report = ingest(corpus, on_error=on_error)
    if not report.sections:
        raise WorkbenchError(f"{corpus}: no readable sections ({report.summary()})")
    return report.sections, report


def corpus_hash(corpus: str | Path) -> str:
    """A hash of every file under a corpus folder (names and bytes), or of one file. A link
    inside the folder counts by where it points, never by what it points at (ingest does not
    read it, and it may lead anywhere: a file outside, a FIFO)."""
    import hashlib
    import json
    import os

    p = Path(corpus)
    files = sorted(p.rglob("*")) if p.is_dir() else [p]
    listing = [(str(f.relative_to(p) if p.is_dir() else f.name),
                "link:" + os.readlink(f) if p.is_dir() and f.is_symlink() else sha256_file(f))
               for f in files if f.is_symlink() or f.is_file()]
    return hashlib.sha256(json.dumps([listing], sort_keys=True).encode()).hexdigest()[:16]
