"""Trajectory synthesis: verified data-agent trajectories by Monte Carlo tree search.

The foundation is here: sandboxed data environments (`env`), their profiles (`profile`) and
the read-only SQL / isolated Python executors (`sandbox`). Importing this package is cheap
(pydantic only; pandas is imported when a folder is loaded or a table is read).
"""

from workbench.trajsynth.env import (
    Action,
    DataEnvironment,
    Observation,
    Step,
    sample_environment,
)
from workbench.trajsynth.profile import (
    ColumnProfile,
    EnvProfile,
    JoinKey,
    TableProfile,
    load_profile,
    save_profile,
)
from workbench.trajsynth.sandbox import (
    PythonResult,
    SandboxLimits,
    SqlResult,
    TableSource,
    run_python,
    run_sql,
)

__all__ = ["Action", "ColumnProfile", "DataEnvironment", "EnvProfile", "JoinKey", "Observation",
           "PythonResult", "SandboxLimits", "SqlResult", "Step", "TableProfile", "TableSource",
           "load_profile", "run_python", "run_sql", "sample_environment", "save_profile"]
