"""Three real documents of different kinds, found or fetched at run time (nothing committed).

    python benchmarks/realdocs.py [--cache DIR]     # prepares them and prints the folders

- manual: the GNU Diffutils manual (diffutils 3.8, `/usr/share/info/diffutils.info.gz` of the
  Debian package `diffutils`, which every Debian system has; GFDL 1.3+, no invariant
  sections). Info is no corpus format: each node becomes a markdown section (`# node`),
  menus and title underlines dropped, the text as it is.
- standard: the Debian Policy Manual 4.6.2.0, chapters 3 "Binary packages" and 4 "Source
  packages" (`policy.html/ch-binary.html`, `ch-source.html` of the Debian package
  `debian-policy`; GPL-2+), read as the HTML it ships.
- lecture notes: the Debian Packaging Tutorial 0.29 by Lucas Nussbaum
  (`packaging-tutorial.pdf` of the Debian package `packaging-tutorial`; GPL-3+ or
  CC-BY-SA-3.0), the slides of a course, one markdown section per page (the slide's title
  as its heading, each bullet a sentence: the distiller takes its answers from sentences,
  and a bullet has no full stop). Its text comes out of pypdf per page: the corpus
  reader's PDF route sends these beamer slides (they draw rules) through pdfplumber, which
  loses the spaces between words ("Averypowerfulandconvenientway").

A Debian package that is not installed is fetched with `apt-get download` and unpacked with
`dpkg-deb -x` into the cache folder (default `$WB_HOME/realdocs` or `~/.cache/workbench/
realdocs`).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
from pathlib import Path

DOCS = {
    "manual": "GNU Diffutils manual 3.8 (info, package diffutils; GFDL-1.3+)",
    "standard": "Debian Policy Manual 4.6.2.0, ch. 3-4 (HTML, package debian-policy; GPL-2+)",
    "lecture_notes": "Debian Packaging Tutorial 0.29, slides (PDF, package packaging-tutorial;"
                     " GPL-3+ or CC-BY-SA-3.0)",
}


def cache_dir(cache: str | Path | None = None) -> Path:
    if cache:
        return Path(cache)
    home = os.environ.get("WB_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "workbench") / "realdocs"


def debian_file(package: str, rel: str, cache: Path) -> Path:
    """`/rel` from the installed package, else from its .deb unpacked under `cache`."""
    installed = Path("/") / rel
    if installed.exists():
        return installed
    root = cache / "debs" / package
    target = root / rel
    if not target.exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", package], cwd=root, check=True,
                       capture_output=True)
        deb = next(root.glob(f"{package}_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    if not target.exists():
        raise SystemExit(f"{package}: no {rel} in the package")
    return target


def _escape(line: str) -> str:
    """A text line that starts with '#' (a shell comment, '#include') is no heading."""
    return "\\" + line if line.lstrip().startswith("#") else line


_UNDERLINE = re.compile(r"^[*=\-.]{3,}\s*$")


def info_to_markdown(info_gz: Path, skip=("Top", "GNU Free Documentation License", "Index",
                                          "Translations")) -> str:
    """An info manual as markdown: one `# node` per node, menus and underlines dropped."""
    text = gzip.open(info_gz, "rt", encoding="utf-8", errors="replace").read()
    out = []
    for node in text.split("\x1f")[1:]:
        lines = node.strip("\n").splitlines()
        if not lines:
            continue
        m = re.search(r"Node: ([^,]+)", lines[0])
        if not m or m.group(1).strip() in skip:
            continue
        body, in_menu = [], False
        for i, line in enumerate(lines[1:], 1):
            if line.startswith("* Menu:"):
                in_menu = True
                continue
            if in_menu:
                if line.startswith("* ") or line.startswith(" ") or not line.strip():
                    continue
                in_menu = False
            if _UNDERLINE.match(line) or (i + 1 < len(lines)
                                          and _UNDERLINE.match(lines[i + 1])
                                          and len(lines[i + 1].strip()) >= len(line.strip())
                                          > 0):
                continue  # a title and its underline: the node name is the heading
            body.append(line)
        content = "\n".join(_escape(ln) for ln in body).strip()
        if content:
            out.append(f"# {m.group(1).strip()}\n\n{content}\n")
    return "\n".join(out)


_BULLET = re.compile(r"^[▶◮•→–]\s*")


def bullets_to_sentences(lines: list[str]) -> list[str]:
    """A slide's bullets as sentences: a bullet's wrapped lines joined, its mark dropped and
    a full stop added where it ends without one (the distiller takes its answers from
    sentences of the text, and a bullet list has none)."""
    items: list[list[str]] = []
    for ln in lines:
        if _BULLET.match(ln) or not items:
            items.append([ln])
        else:
            items[-1].append(ln)
    out = []
    for it in items:
        text = " ".join(it)
        if _BULLET.match(text):
            text = _BULLET.sub("", text).strip()
            if text and text[-1] not in ".!?:":
                text += "."
        out.append(text)
    return out


def pdf_pages_to_markdown(pdf: Path, skip_titles=("Outline",)) -> str:
    """Slides as markdown: a section per page, its first line as the heading, the running
    footer ('<title> N / M') dropped, the bullets as sentences."""
    from pypdf import PdfReader

    out = []
    for page in PdfReader(str(pdf)).pages:
        lines = [ln.strip() for ln in (page.extract_text() or "").splitlines() if ln.strip()]
        lines = [ln for ln in lines if not re.search(r"\d+\s*/\s*\d+\s*$", ln)]
        if not lines or lines[0] in skip_titles:
            continue
        body = bullets_to_sentences(lines[1:])
        out.append(f"# {lines[0]}\n\n" + "\n".join(_escape(ln) for ln in body) + "\n")
    return "\n".join(out)


def prepare(cache: str | Path | None = None) -> dict[str, Path]:
    """{kind: corpus folder} for the three documents."""
    cache = cache_dir(cache)
    folders = {k: cache / k for k in DOCS}
    for f in folders.values():
        f.mkdir(parents=True, exist_ok=True)
    manual = folders["manual"] / "diffutils.md"
    if not manual.exists():
        manual.write_text(info_to_markdown(debian_file(
            "diffutils", "usr/share/info/diffutils.info.gz", cache)), encoding="utf-8")
    for ch in ("ch-binary.html", "ch-source.html"):
        dst = folders["standard"] / ch
        if not dst.exists():
            src = debian_file("debian-policy",
                              f"usr/share/doc/debian-policy/policy.html/{ch}", cache)
            dst.write_bytes(src.read_bytes())
    notes = folders["lecture_notes"] / "packaging-tutorial.md"
    if not notes.exists():
        notes.write_text(pdf_pages_to_markdown(debian_file(
            "packaging-tutorial", "usr/share/doc/packaging-tutorial/packaging-tutorial.pdf",
            cache)), encoding="utf-8")
    return folders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache")
    for kind, folder in prepare(ap.parse_args().cache).items():
        print(f"{kind}\t{folder}\t{DOCS[kind]}")


if __name__ == "__main__":
    main()
