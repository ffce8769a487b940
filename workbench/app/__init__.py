"""Streamlit workbench for domain experts (a thin shell over the workbench library).

`app.py` is the entry script `workbench app` serves, `common.py` the pages' shared helpers,
`views/` the pages (scripts Streamlit runs, never imported), `.streamlit/config.toml` the
app's security defaults. Nothing in the library imports this package."""
