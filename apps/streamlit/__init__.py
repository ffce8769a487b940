"""Streamlit workbench for domain experts (a thin shell over the workbench library)."""
