"""The Domain-Agent Workbench app: `workbench app` starts it (127.0.0.1 by default).

The navigation is the core pages plus one page per registered pipeline that declares one
(`Pipeline.page`, in registry order), so a plugin's page appears without touching this file.

Streamlit runs this file as a script; it and the pages import the app's helpers as
`workbench.app.common`, from the installed package."""

import streamlit as st

from workbench.app.common import keep_fields, navigation_pages, show_workspace
from workbench.app.glossary import sidebar_glossary

# an emoji favicon is drawn by the page itself; a :material/...: one is fetched from
# fonts.gstatic.com, which an offline machine (or --disable-background-networking) never reaches
st.set_page_config(page_title="Domain-Agent Workbench", page_icon="📡", layout="wide")
st.sidebar.caption("The bundled model, SmolLM2-135M-Instruct, is a 135M-parameter "
                   "demonstration model: with it the pages show how the workbench works, not "
                   "the gains a capable model brings. Name a larger teacher in a form (a model "
                   "folder, a GGUF file or an OpenAI-compatible URL#model) for real data.")
show_workspace()
sidebar_glossary()
page = st.navigation([st.Page(path, title=title, icon=icon, default=default)
                      for path, title, icon, default in navigation_pages()])
keep_fields(page.url_path)
page.run()
