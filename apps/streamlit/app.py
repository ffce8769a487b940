"""The Domain-Agent Workbench app: `workbench app` starts it (127.0.0.1 by default)."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).parent))

st.set_page_config(page_title="Domain-Agent Workbench", page_icon=":material/settings_input_antenna:", layout="wide")
HERE = Path(__file__).parent / "pages"
pages = [
    st.Page(HERE / "projects.py", title="Projects and runs", icon=":material/folder:", default=True),
    st.Page(HERE / "corpus.py", title="Corpus", icon=":material/library_books:"),
    st.Page(HERE / "distill.py", title="Distill", icon=":material/science:"),
    st.Page(HERE / "retrieval.py", title="Retrieval playground", icon=":material/search:"),
    st.Page(HERE / "train.py", title="Train", icon=":material/model_training:"),
    st.Page(HERE / "evaluate.py", title="Evaluate and compare", icon=":material/bar_chart:"),
]
st.navigation(pages).run()
