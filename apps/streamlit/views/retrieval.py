import html
import re

import streamlit as st
from common import base_config, job_panel, not_ready, pick_run, runs, show_error, workspace

from workbench.jobs import start_job

st.title("Retrieval playground")
ws = workspace()
infos = runs()
indexes = [r for r in infos if r.has_index]
with st.expander("Build an index from the corpus", expanded=not indexes):
    name = st.text_input("Run name", value="rag", key="r-name")
    if st.button("Build index", key="r-build"):
        try:
            job = start_job(ws, "rag", base_config(name, corpus=str(ws / "corpus")))
            st.success(f"Started job {job.id}")
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
job_panel("rag", "index")  # button keys "index-*" (tests/test_e2e_browser.py)
if not indexes:
    st.caption("No index yet.")
    st.stop()


@st.cache_resource(show_spinner="Loading index", max_entries=4)
def load(path: str, stamp: tuple[int, int]):
    """The index at `path`; `stamp` (its manifest's mtime and size) makes a rebuilt index
    load afresh instead of the cached old one."""
    from workbench.rag.index import RagIndex

    return RagIndex.load(path)


lay = pick_run("Index", indexes, "r-index").layout
folder = lay.folder("rag")
try:
    made = lay.artifact("rag", "manifest").stat()
    index = load(str(folder), (made.st_mtime_ns, made.st_size))
except Exception as e:  # noqa: BLE001 - an index a job is still writing
    not_ready(f"the index of {lay.name}", e)
    st.stop()
query = st.text_input("Query", key="r-query", placeholder="e.g. what limits the VSWR of a match?")
c1, c2, c3 = st.columns(3)
w_kw = c1.slider("Keyword weight", 0.0, 3.0, 1.0, 0.1, key="r-wk")
w_sem = c2.slider("Semantic weight", 0.0, 3.0, 1.0, 0.1, key="r-ws")
k = c3.number_input("Hits", 1, 20, 5, key="r-k")


def highlight(text: str, q: str) -> str:
    words = {w.lower() for w in re.findall(r"\w{3,}", q)}
    out = html.escape(text[:600])
    for w in sorted(words, key=len, reverse=True):
        out = re.sub(rf"(?i)\b({re.escape(w)})\b", r"<mark>\1</mark>", out)
    return out


if query:
    cols = st.columns(3)
    for col, name in zip(cols, ("semantic", "keyword", "hybrid"), strict=True):
        r = index.retriever(name, weights={"keyword": w_kw, "semantic": w_sem})
        with col:
            st.subheader(name)
            for h in r.retrieve(query, int(k)):
                st.markdown(f"**{h.rank}. {' > '.join(h.heading_path)}** · score "
                            f"{h.score:.4f}")
                st.markdown(highlight(h.text, query), unsafe_allow_html=True)

bench = [r for r in infos if r.has_benchmark]
if bench:
    st.subheader("Retrieval metrics against a benchmark")
    b = pick_run("Benchmark", bench, "r-bench").layout.artifact("distill", "benchmark")
    if st.button("Compute Hit@k / MRR / nDCG", key="r-metrics"):
        from workbench.evaluate.benchmark import load_benchmark
        from workbench.rag.evaluate import benchmark_retrieval_metrics

        try:
            st.dataframe(benchmark_retrieval_metrics(index, load_benchmark(b)),
                         key="r-metrics-table")
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
