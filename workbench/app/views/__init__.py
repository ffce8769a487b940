"""The app's pages: scripts Streamlit runs through `st.navigation` (never imported). A
pipeline's `Pipeline.page` names one of these files, or a page file of its own."""
