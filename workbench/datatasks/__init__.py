"""Tasks over a data environment, and the tree search that verifies their plans.

A library below the pipelines, built on the sandboxed data runtime (`workbench.dataenv`):
the verified task pool (`tasks`, its records in `pool` and `poolfiles`, with the query
language in `queries`, the seed templates in `templates` and `slices`, compositions in
`compose`, alternative SQL and pandas renderings in `altsql` and `pandascode`, question text in
`questions`, `queryfacts` and `paraphrase`, and the answer check used as the reward in
`answers`); the grammar of plan moves (`grammar`); and the search over it (`explore`, with its
settings in `exploreconfig`, `search`, `generators`, `priors`, `puct`, the shared prefix
`trie`, verified-plan `reuse`, the `ledger` of costs and the search `trees` on disk).

Trajectory synthesis (`workbench.trajsynth`: select, explore, export, the downstream check) and
federated track B's data-agent sites (`workbench.federated.knowledge`) are both built on it.
Importing this package is cheap (pydantic only).
"""

from workbench.datatasks.answers import AnswerSpec, check_answer
from workbench.datatasks.paraphrase import paraphrase_tasks
from workbench.datatasks.pool import PoolConfig, PoolSummary, Task, TaskPool
from workbench.datatasks.poolfiles import load_pool, save_pool
from workbench.datatasks.tasks import build_pool

__all__ = ["AnswerSpec", "PoolConfig", "PoolSummary", "Task", "TaskPool", "build_pool",
           "check_answer", "load_pool", "paraphrase_tasks", "save_pool"]
