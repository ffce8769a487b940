"""The KGV pack as the agent pipeline sees it (data only; `pack.AgentPack`): its code, its
conditions, its stages and its report. An entry of the group `workbench.agent_packs`."""

from workbench.agent_packs.pack import AgentPack, PackReport

PACK = AgentPack(
    name="kgv",
    entry="workbench.agent_packs.kgv.api",
    help="knowledge-graph fact verification: closed book, single-turn RAG, the agent, a LoRA "
         "student on the teacher's trajectories, the agent trained with GRPO",
    # kgv.api: CONDITIONS (the default set), then GRPO (on request)
    conditions=("closed_book", "rag", "agent", "agent_sft", "agent_grpo"),
    report=PackReport(record="workbench.agent_packs.kgv.report:KgvReport",
                      reader="workbench.agent_packs.kgv.report:read_report",
                      artifact="kgv_report"),
    reads=("index",),
)
