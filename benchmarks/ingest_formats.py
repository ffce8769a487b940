"""Corpus ingestion speed per format: pages (or slides, rows) per second on this machine.

    python benchmarks/ingest_formats.py [--pages 40] [--reps 3] [--out FILE.json]

Documents are written from the RF corpus's text (about 450 words a page) by the test suite's
generators (tests/docgen.py): a PDF of text pages, a PDF whose every page holds a 6x3 ruled
table among its text, a Word file and an EPUB of the same text (a "page" is 450 words), a
slide deck (one slide of ~80 words each), a workbook and a CSV of --pages x 50 rows. Each file
goes through `workbench.corpus.ingest` alone; the figure is the median of --reps. Beside the PDF
rows: pypdf's plain text extraction of the same file (the reader before tables were kept), when
pypdf is installed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the document generators of the test suite

from docgen import make_docx, make_epub, make_pptx, make_xlsx  # noqa: E402
from pdfgen import write_pdf  # noqa: E402

from workbench.corpus import ingest, load_sections  # noqa: E402


def words() -> list[str]:
    sections, _ = load_sections(REPO / "datasets" / "rf")
    return " ".join(s.text for s in sections).split()


def pages_of(ws: list[str], n: int, per: int) -> list[str]:
    return [" ".join(ws[(i * per) % (len(ws) - per):][:per]) for i in range(n)]


def pdf_stream(text: str, table: bool) -> str:
    def esc(s):
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    lines, cur = [], ""
    for w in text.encode("latin-1", "replace").decode("latin-1").split():
        if len(cur) + len(w) > 95:
            lines.append(cur)
            cur = ""
        cur += w + " "
    lines.append(cur)
    ops, y = [], 760
    for i, ln in enumerate(lines):
        if table and i == len(lines) // 2:
            for r in range(6):
                for c in range(3):
                    ops.append(f"{72 + c * 150} {y - (r + 1) * 18} 150 18 re S")
                    ops.append(f"BT /F1 9 Tf {76 + c * 150} {y - (r + 1) * 18 + 5} Td "
                               f"(r{r}c{c} {esc(ln.split()[c] if ln.split() else '')}) Tj ET")
            y -= 6 * 18 + 12
        ops.append(f"BT /F1 9 Tf 72 {y} Td ({esc(ln)}) Tj ET")
        y -= 11
    return "\n".join(ops)


def build(folder: Path, n: int) -> dict[str, tuple[Path, int, str]]:
    ws = words()
    pages = pages_of(ws, n, 450)
    out = {}
    p = folder / "text.pdf"
    write_pdf(p, [pdf_stream(t, False) for t in pages])
    out["pdf (text)"] = (p, n, "pages")
    p = folder / "tables.pdf"
    write_pdf(p, [pdf_stream(t, True) for t in pages])
    out["pdf (a ruled table a page)"] = (p, n, "pages")
    blocks: list = []
    for i, t in enumerate(pages):
        if i % 4 == 0:
            blocks.append(("h1", f"Chapter {i // 4 + 1}"))
        blocks += [("h2", f"Part {i + 1}"), ("p", t)]
    p = folder / "book.docx"
    make_docx(p, blocks)
    out["docx"] = (p, n, "pages of 450 words")
    p = folder / "book.epub"
    make_epub(p, "RF", [(f"Chapter {i + 1}", [t]) for i, t in enumerate(pages)])
    out["epub"] = (p, n, "pages of 450 words")
    p = folder / "deck.pptx"
    make_pptx(p, [(f"Slide {i + 1}", t, None) for i, t in enumerate(pages_of(ws, n, 80))])
    out["pptx"] = (p, n, "slides")
    rows = [["part", "gain dB", "nf dB", "note"]] + [
        [f"P{i}", i % 30, round(0.4 + (i % 7) / 10, 1), ws[i % len(ws)]] for i in range(n * 50)]
    p = folder / "parts.xlsx"
    make_xlsx(p, {"parts": rows})
    out["xlsx"] = (p, n * 50, "rows")
    p = folder / "parts.csv"
    p.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    out["csv"] = (p, n * 50, "rows")
    return out


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/ingest_formats.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = build(Path(tmp), args.pages)
        ingest(files["docx"][0])  # warm-up: the converters' imports
        for name, (path, units, unit) in files.items():
            rep = ingest(path)
            assert not rep.skipped, rep.skipped
            s = timed(lambda path=path: ingest(path), args.reps)
            rows.append({"format": name, "units": units, "unit": unit, "seconds": round(s, 3),
                         "per_s": round(units / s, 1), "sections": len(rep.sections),
                         "mb": round(path.stat().st_size / 2**20, 2)})
            print(f"{name:28s} {units:5d} {unit:20s} {s:7.2f} s  {units / s:8.1f}/s  "
                  f"{len(rep.sections)} sections", flush=True)
        try:
            from pypdf import PdfReader
        except ImportError:
            PdfReader = None
        if PdfReader:
            for name in ("pdf (text)", "pdf (a ruled table a page)"):
                path, units, _ = files[name]
                s = timed(lambda path=path: [p.extract_text() for p in PdfReader(path).pages],
                          args.reps)
                rows.append({"format": name + ", pypdf text only", "units": units,
                             "unit": "pages", "seconds": round(s, 3),
                             "per_s": round(units / s, 1)})
                print(f"{name + ', pypdf':28s} {units:5d} pages {s:21.2f} s  "
                      f"{units / s:8.1f}/s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.machine(), "rows": rows},
                                         indent=1) + "\n")


if __name__ == "__main__":
    main()
