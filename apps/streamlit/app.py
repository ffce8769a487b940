"""The Streamlit entry of a checkout: `streamlit run apps/streamlit/app.py` serves the same app
as `workbench app`, the one the package ships (`workbench/app/app.py`, run here as it is).

Its security settings are `.streamlit/config.toml` beside this file (Streamlit reads a
script's own `.streamlit` folder), the same file as the package's (a test checks both are
alike). The workspace is `./workspace` of the folder the app is started from, as with
`workbench app`, or `WB_WORKSPACE` and `WB_ROOT` when set; `workbench app --help` lists the
options that set them."""

import runpy
from pathlib import Path

import workbench.app

runpy.run_path(str(Path(workbench.app.__file__).resolve().parent / "app.py"),
               run_name="__main__")
