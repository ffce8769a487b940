"""Trajectory synthesis: verified data-agent trajectories by Monte Carlo tree search.

The foundation is here: sandboxed data environments (`env`), their profiles (`profile`) and
the read-only SQL / isolated Python executors (`sqlsandbox`, `sandbox`). On top: the verified
task pool (`tasks`, its records in `pool`, with the query language in `queries`, the seed
templates in `templates`, compositions in `compose`, and the answer check used as the reward
in `answers`). Importing this package is cheap (pydantic only; pandas is imported when a
folder is loaded or a table is read).
"""

from workbench.trajsynth.answers import AnswerSpec, check_answer
from workbench.trajsynth.env import (
    Action,
    DataEnvironment,
    Observation,
    Step,
    sample_environment,
)
from workbench.trajsynth.paraphrase import paraphrase_tasks
from workbench.trajsynth.pool import PoolConfig, PoolSummary, Task, TaskPool
from workbench.trajsynth.poolfiles import load_pool, save_pool
from workbench.trajsynth.profile import (
    ColumnProfile,
    EnvProfile,
    JoinKey,
    TableProfile,
    load_profile,
    save_profile,
)
from workbench.trajsynth.sandbox import PythonResult, TableSource, run_python
from workbench.trajsynth.sandboxlimits import SandboxLimits
from workbench.trajsynth.sqlsandbox import SqlResult, run_sql
from workbench.trajsynth.tasks import build_pool

__all__ = ["Action", "AnswerSpec", "ColumnProfile", "DataEnvironment", "EnvProfile", "JoinKey",
           "Observation", "PoolConfig", "PoolSummary", "PythonResult", "SandboxLimits",
           "SqlResult", "Step", "TableProfile", "TableSource", "Task", "TaskPool", "build_pool",
           "check_answer", "load_pool", "load_profile", "paraphrase_tasks", "run_python",
           "run_sql", "sample_environment", "save_pool", "save_profile"]
