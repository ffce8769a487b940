"""Trajectory synthesis: verified data-agent trajectories by Monte Carlo tree search.

Built on the sandboxed data runtime (`workbench.dataenv`: environments, profiles, the SQL and
Python executors). Here: the verified task pool (`tasks`, its records in `pool`, with the
query language in `queries`, the seed templates in `templates`, compositions in `compose`, and
the answer check used as the reward in `answers`), the search over it (`explore`, `search`,
`generators`, `priors`), and the exports (`export`). Importing this package is cheap
(pydantic only).
"""

from workbench.trajsynth.answers import AnswerSpec, check_answer
from workbench.trajsynth.paraphrase import paraphrase_tasks
from workbench.trajsynth.pool import PoolConfig, PoolSummary, Task, TaskPool
from workbench.trajsynth.poolfiles import load_pool, save_pool
from workbench.trajsynth.tasks import build_pool

__all__ = ["AnswerSpec", "PoolConfig", "PoolSummary", "Task", "TaskPool", "build_pool",
           "check_answer", "load_pool", "paraphrase_tasks", "save_pool"]
