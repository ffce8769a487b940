"""The sandboxed data runtime: a data environment and what may run on it.

A library below the pipelines (trajectory synthesis builds its tasks, search and exports on
it; any pipeline may import it): a SQLite file or a folder of CSV/TSV/Parquet files opened
read-only as a `DataEnvironment` (`env`), its profile (`profile`: tables, columns, values,
join keys), and the two executors an agent's actions run in: read-only SQL with a time and row
budget (`sqlsandbox`) and Python in an isolated child process (`sandbox`, the child itself in
`child/`, limits in `sandboxlimits`). Importing this package is cheap (pydantic only;
pandas is imported when a folder is loaded or a table is read).
"""

from workbench.dataenv.env import (
    Action,
    DataEnvironment,
    EnvStep,
    Observation,
    sample_environment,
)
from workbench.dataenv.profile import (
    ColumnProfile,
    EnvProfile,
    JoinKey,
    TableProfile,
    load_profile,
    save_profile,
)
from workbench.dataenv.sandbox import PythonResult, TableSource, run_python
from workbench.dataenv.sandboxlimits import SandboxLimits
from workbench.dataenv.sqlsandbox import SqlResult, run_sql

__all__ = ["Action", "ColumnProfile", "DataEnvironment", "EnvProfile", "EnvStep", "JoinKey",
           "Observation", "PythonResult", "SandboxLimits", "SqlResult", "TableProfile",
           "TableSource", "load_profile", "run_python", "run_sql", "sample_environment",
           "save_profile"]
