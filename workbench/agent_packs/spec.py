"""The domain-agent pipeline as the registry sees it: `workbench agent run|eval PACK CONFIG`.

Its stages are the registered packs' (`agent_packs.pack.stages`): each pack declares its own
(the built-ins in `kgv/declare.py`, `rf/declare.py`, `litsearch/declare.py`; an outside
package's through its entry of the group `workbench.agent_packs`), so one run folder's
`agent/` holds every pack's files under names no two packs share."""

from workbench.agent_packs.pack import stages
from workbench.registry import Pipeline

PIPELINE = Pipeline(
    name="agent",
    # searcher: the agents' entries indexed in the run; open_index: a prebuilt index (kgv)
    help="Domain agents on one loop (KG fact verification, RF design tools, literature "
         "search): baselines, the agent, teacher trajectories, a LoRA student, one report "
         "with intervals.",
    config="workbench.agent_packs.config:AgentConfig",
    run="workbench.agent_packs.api:run",
    stages=stages(),
    cli="workbench.agent_packs.cli:register",
    page="agents.py", page_title="Domain agents", page_icon=":material/smart_toy:",
    order=65,
)
