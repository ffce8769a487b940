import streamlit as st
from common import show_error, workspace

from workbench.corpus import ingest
from workbench.workspace import MAX_UPLOAD_MB, corpus_files, remove_file, save_upload

st.title("Corpus")
ws = workspace()
files = st.file_uploader("Upload documents (md, txt, html, pdf)", accept_multiple_files=True,
                         type=["md", "markdown", "txt", "html", "htm", "pdf"],
                         key="corpus-upload", help=f"Up to {MAX_UPLOAD_MB} MB a file.")
for f in files or []:
    try:
        saved = save_upload(ws, f.name, f.getvalue())
        st.success(f"Saved {saved.name}")
    except Exception as e:
        show_error(e)
have = corpus_files(ws)
st.subheader(f"{len(have)} documents")
for p in have:
    c1, c2 = st.columns([5, 1])
    c1.write(f"`{p.name}` ({p.stat().st_size / 1024:.1f} KB)")
    if c2.button("Remove", key=f"rm-{p.name}"):
        remove_file(ws, p.name)
        st.rerun()
if have:
    report = ingest(ws / "corpus")
    st.subheader(f"Sections found: {len(report.sections)}")
    if report.skipped:
        st.warning("Skipped: " + "; ".join(f"{f} ({why})" for f, why in report.skipped))
    st.dataframe([{"document": s.source, "heading path": " > ".join(s.heading_path),
                   "characters": len(s.text)} for s in report.sections], hide_index=True,
                 key="sections-table")
