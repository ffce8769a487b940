import html
import re

import streamlit as st

from workbench.app.common import (
    RAG_SETTINGS,
    base_config,
    job_panel,
    not_ready,
    pick_run,
    require_corpus,
    runs,
    show_error,
    workspace,
)
from workbench.app.glossary import show_glossary
from workbench.jobs import start_job

st.title("Retrieval playground")
st.caption("Ask the index of a run and compare what three retrievers find: semantic (meaning, "
           "by embeddings), keyword (BM25 word matching) and hybrid (both rankings fused). "
           "The retrieval-augmented (RAG) conditions of Evaluate and Chat put these passages in "
           "the model's prompt.")
show_glossary("RAG", "BM25", "hit@k", "MRR", "nDCG")
ws = workspace()
infos = runs()
indexes = [r for r in infos if r.has_index]
with st.expander("Build an index from the corpus", expanded=not indexes):
    name = st.text_input("Run name", value="rag", key="r-name")
    if st.button("Build index", key="r-build",
                 help="Starts a background job that splits the workspace's corpus into chunks "
                      "and indexes them for all three retrievers, as a run of this name."):
        try:
            require_corpus(ws)
            job = start_job(ws, "rag", base_config(name, corpus=str(ws / "corpus"),
                                                  rag=dict(RAG_SETTINGS)))
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
    from workbench.retrieval.search import load_index

    return load_index(path)


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
w_kw = c1.slider("Keyword weight", 0.0, 3.0, 1.0, 0.1, key="r-wk",
                 help="Hybrid only: how much the keyword ranking counts in the fusion.")
w_sem = c2.slider("Semantic weight", 0.0, 3.0, 1.0, 0.1, key="r-ws",
                  help="Hybrid only: how much the semantic ranking counts in the fusion.")
k = c3.number_input("Hits", 1, 20, 5, key="r-k", help="Passages shown per retriever.")


def highlight(text: str, q: str) -> str:
    words = {w.lower() for w in re.findall(r"\w{3,}", q)}
    out = html.escape(text[:600])
    for w in sorted(words, key=len, reverse=True):
        out = re.sub(rf"(?i)\b({re.escape(w)})\b", r"<mark>\1</mark>", out)
    return out


if query:
    st.caption("Scores are not comparable across columns: semantic is the cosine similarity "
               "of the embeddings (up to 1), keyword the BM25 score (unbounded), hybrid the "
               "weighted reciprocal-rank fusion of the two rankings (small numbers; only the "
               "order matters).")
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
    st.caption("Each benchmark question was written from one section of the corpus: does the "
               "retriever find that section when asked the question? Hit@k: share of "
               "questions whose section is in the top k; MRR: mean of 1 / rank of that "
               "section; nDCG@k: the same as a rank-discounted gain (1 when it comes first).")
    b = pick_run("Benchmark", bench, "r-bench").layout.artifact("distill", "benchmark")
    if st.button("Compute Hit@k / MRR / nDCG", key="r-metrics",
                 help="Asks every retriever of the index above each question of the benchmark "
                      "(this index and this benchmark; a few seconds to a minute)."):
        from workbench.evaluate.benchmark import load_benchmark
        from workbench.rag.evaluate import benchmark_retrieval_metrics

        try:
            with st.spinner("Asking each retriever every benchmark question"):
                metrics = benchmark_retrieval_metrics(index, load_benchmark(b))
            if not metrics:
                st.info("No question of this benchmark knows its source section.")
            else:
                ks = sorted({int(m.split("@")[1]) for v in metrics.values() for m in v
                             if m.startswith("hit@")})
                st.markdown("**Hit@k**: share of questions whose source section is in the "
                            "top k")
                st.vega_lite_chart(
                    [{"k": k_, "retriever": name, "Hit@k": v[f"hit@{k_}"]}
                     for name, v in metrics.items() for k_ in ks],
                    {"mark": {"type": "line", "point": True, "tooltip": True},
                     "encoding": {"x": {"field": "k", "type": "ordinal", "axis": {
                                      "labelAngle": 0}},
                                  "y": {"field": "Hit@k", "type": "quantitative",
                                        "scale": {"zero": False}},
                                  "color": {"field": "retriever", "type": "nominal"}}},
                    width="stretch", height=240)
                # recall@k equals hit@k here (one relevant section a question): not repeated
                table = {name: {m: round(v[m], 3) for m in sorted(
                    (m for m in v if not m.startswith("recall@")),
                    key=lambda m: (m.split("@")[0], int(m.split("@")[1]) if "@" in m else 0))}
                    for name, v in metrics.items()}
                st.dataframe(table, key="r-metrics-table")
        except Exception as e:  # noqa: BLE001 - shown in the page, never a traceback
            show_error(e)
