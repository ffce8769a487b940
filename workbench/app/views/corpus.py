import hashlib

import streamlit as st

from workbench.app.common import max_corpus_mb, read_or_none, show_error, workspace
from workbench.app.glossary import show_glossary
from workbench.corpus import SUPPORTED, ingest
from workbench.workspace import (
    MAX_UPLOAD_MB,
    MB,
    corpus_bytes,
    corpus_files,
    remove_file,
    save_upload,
)

st.title("Corpus")
st.caption("The documents of this workspace. The Distill, Retrieval and Evaluate pages read "
           "them as sections: the parts under each heading (or each page, slide or sheet), "
           "listed at the end of this page.")
show_glossary("teacher")
ws = workspace()
cap = max_corpus_mb()
kinds = sorted({k.lstrip(".") for k in SUPPORTED})
files = st.file_uploader("Upload documents (Markdown, text, HTML, PDF, Word, PowerPoint, "
                         "Excel, CSV, EPUB)", accept_multiple_files=True, type=kinds,
                         key="corpus-upload",
                         help=f"Up to {MAX_UPLOAD_MB} MB a file, {cap:g} MB in all.")
# The uploader hands back its files on every rerun: each one is saved once per session (by
# workspace, the uploader's file id, name, size and hash), so "Remove" below sticks.
saved: set[tuple[str, str, str, int, str]] = st.session_state.setdefault("corpus-saved", set())
for f in files or []:
    data = f.getvalue()
    mark = (str(ws), str(getattr(f, "file_id", "")), f.name, len(data),
            hashlib.sha256(data).hexdigest())
    if mark in saved:
        continue
    try:
        path = save_upload(ws, f.name, data, max_corpus_mb=cap)
    except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
        show_error(e)  # not marked: it is tried again while it stays in the uploader
    else:
        saved.add(mark)
        st.success(f"Saved {path.name}")
have = corpus_files(ws)
st.subheader(f"{len(have)} documents")
st.caption(f"{corpus_bytes(ws) / MB:.1f} MB of the {cap:g} MB corpus cap")
for p in have:
    c1, c2 = st.columns([5, 1])
    size = read_or_none(p.name, p.stat)
    size = size.st_size if size is not None else None
    c1.write(f"`{p.name}`" + (f" ({size / 1024:.1f} KB)" if size is not None else ""))
    if c2.button("Remove", key=f"rm-{p.name}",
                 help="Delete this file from the workspace's corpus folder. Runs already "
                      "made keep what they distilled or indexed from it."):
        try:
            remove_file(ws, p.name)
        except Exception as e:  # noqa: BLE001 - e.g. removed in another tab meanwhile
            show_error(e)
        else:
            st.rerun()


def _where(meta: dict | None) -> str:
    """Where in its document a section lies: pages, slides, sheet and rows."""
    out = []
    for key in ("pages", "slides", "rows"):
        if meta and key in meta:
            a, b = meta[key]
            out.append(f"{key[:-1] if a == b else key} {a}" + ("" if a == b else f"-{b}"))
    if meta and "sheet" in meta:
        out.insert(0, f"sheet {meta['sheet']}")
    return ", ".join(out)


if have:
    report = ingest(ws / "corpus")
    st.subheader(f"Sections found: {len(report.sections)}")
    if report.skipped:
        st.warning("Skipped: " + "; ".join(f"{f} ({why})" for f, why in report.skipped))
    st.dataframe([{"document": s.source, "heading path": " > ".join(s.heading_path),
                   "from": _where(s.metadata), "characters": len(s.text)}
                  for s in report.sections], hide_index=True,
                 key="sections-table")
    st.caption("heading path: the headings a section sits under; from: where in a PDF, "
               "slide deck or spreadsheet it lies; characters: its length (a very short one "
               "gives the teacher little to ask about).")
